"""In the GPU's form (fp16 step and window graphs, and any graph with ONNX Runtime's operators) the ST adapter's
depthwise convolution over time and its up-projection are one product over the concatenated frames
(``STAdapter.update_as_one_product``): on ONNX Runtime's CUDA provider an Einsum is a transpose and a batched
product per channel, and the conv's and the up-projection's biases were two more Adds. The checkpoint's form is
kept everywhere else (the CPU runs the Einsum as one kernel and would pay for the larger product). Both forms give
the same numbers, in PyTorch and in the exported graphs, over a stream with the state carried."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from conftest import assert_same_stream, op_counts, random_model
from onnx import TensorProto, helper, numpy_helper

from sdqes_edge.contract import FP16, ONNX_RUNTIME_OPERATORS, STATE_INPUT_PREFIX
from sdqes_edge.export.gemm_bias import BIAS_COLUMNS
from sdqes_edge.export.graph_edits import fold_constant_arithmetic
from sdqes_edge.export.graphs import export_step_graph, export_window_graph
from sdqes_edge.model.adapters import STAdapter

BLOCKS = 2  # the tiny preset's image tower


def with_one_product(model):
    merged = copy.deepcopy(model)
    for module in merged.modules():
        if isinstance(module, STAdapter):
            module.update_as_one_product = True
    return merged


@pytest.mark.parametrize("lookback", [1, 2])
def test_one_product_gives_the_checkpoints_form_in_the_step_and_the_window_form(lookback):
    model = random_model("st", lookback=lookback, per_block=2)
    merged = with_one_product(model)
    size = model.cfg.vision.image_size
    frames = torch.randn(2, 6, 3, size, size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        step, state = model.visual.step_frames(frames)
        merged_step, merged_state = merged.visual.step_frames(frames)
        window, merged_window = model.visual.forward_clip(frames), merged.visual.forward_clip(frames)
    torch.testing.assert_close(merged_step, step, atol=1e-6, rtol=0)
    torch.testing.assert_close(merged_window, window, atol=1e-6, rtol=0)
    torch.testing.assert_close(merged_step, merged_window, atol=1e-5, rtol=0)  # and step == window still
    for got, expected in zip(merged_state, state):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def adapter_products(path) -> list:
    """(update product, the Concat of the remembered frames it reads) of an ST step graph, one per adapter: the
    MatMul that reads the Concat, through the class-token mask (a Mul) and the Concat that joins it with the
    attention's output where there are such (export/joined_products.py)."""
    nodes = onnx.load(str(path)).graph.node
    readers: dict = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = []
    for concat in (n for n in nodes if n.op_type == "Concat" and n.input[0].startswith(STATE_INPUT_PREFIX)):
        reader = readers[concat.output[0]][0]
        while reader.op_type != "MatMul":
            assert reader.op_type in ("Mul", "Concat"), reader.op_type
            reader = readers[reader.output[0]][0]
        found.append((reader, concat))
    return found


@pytest.mark.parametrize("precision, operators", [(FP16, None), (FP16, "onnx"), ("fp32", ONNX_RUNTIME_OPERATORS)])
def test_the_gpu_form_has_no_einsum_and_one_product_per_adapter_with_its_bias_inside(precision, operators,
                                                                                      tmp_path):
    model = random_model("st", per_block=2)  # one remembered frame: the authors' configuration
    export_step_graph(model, tmp_path / "gpu.onnx", precision=precision, operators=operators)
    export_step_graph(model, tmp_path / "cpu.onnx")
    assert "Einsum" not in op_counts(tmp_path / "gpu.onnx") and op_counts(tmp_path / "cpu.onnx")["Einsum"] == 4
    products = adapter_products(tmp_path / "gpu.onnx")
    assert len(products) == 2 * BLOCKS
    graph = onnx.load(str(tmp_path / "gpu.onnx")).graph
    readers = [n for n in graph.node if any(i == p.output[0] for p, _ in products for i in n.input)]
    assert "Add" not in {n.op_type for n in readers}  # both biases inside the product ...
    constants = {i.name: i for i in graph.initializer}
    for _, concat in products:  # ... through the frames' Concat: history, current, a constant block of ones
        assert len(concat.input) == 3 and list(constants[concat.input[2]].dims)[-1] == BIAS_COLUMNS
    # and the model exported is the model it was: its adapters in the checkpoint's form
    assert not any(m.update_as_one_product for m in model.modules() if isinstance(m, STAdapter))


@pytest.mark.parametrize("lookback", [1, 2])
def test_the_gpu_form_computes_the_plain_graphs_values_over_a_stream(lookback, tmp_path):
    model = random_model("st", lookback=lookback, per_block=2)
    plain, gpu = tmp_path / "plain.onnx", tmp_path / "gpu.onnx"
    export_step_graph(model, plain, batch=2)
    export_step_graph(model, gpu, batch=2, operators=ONNX_RUNTIME_OPERATORS)
    size = model.cfg.vision.image_size
    assert_same_stream((plain, gpu), (2, 3, size, size), frames=16, atol=2e-6)


def test_the_fp16_window_graph_has_the_one_product_too(tmp_path):
    model = random_model("st", per_block=2)
    export_window_graph(model, tmp_path / "window.onnx", window=4, precision=FP16)
    assert "Einsum" not in op_counts(tmp_path / "window.onnx")


def test_constant_arithmetic_folds_to_one_constant_and_leaves_what_reads_an_input():
    a, b, c = (np.arange(6, dtype=np.float16).reshape(2, 3), np.ones((3, 4), np.float16),
               np.full(4, 0.5, np.float16))
    graph = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["ab"]), helper.make_node("Add", ["ab", "c"], ["abc"]),
         helper.make_node("MatMul", ["x", "b"], ["xb"]), helper.make_node("Add", ["xb", "abc"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 4])],
        [numpy_helper.from_array(v, n) for v, n in ((a, "a"), (b, "b"), (c, "c"))]))
    assert fold_constant_arithmetic(graph) == 2
    assert [n.op_type for n in graph.graph.node] == ["MatMul", "Add"]
    folded = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer}
    assert set(folded) == {"b", "abc"} and folded["abc"].dtype == np.float16
    np.testing.assert_array_equal(folded["abc"], a.astype(np.float32) @ b + 0.5)


def test_with_onnx_runtimes_operators_the_class_token_mask_scales_the_frames_and_the_second_update_is_joined(
        tmp_path):
    """Scaling rows commutes with the product: the mask multiplies the narrow Concat of the frames (and the bias
    column with them), and the second adapter's update, now a product, is summed with the attention's output
    inside one product."""
    model = random_model("st", per_block=2)
    export_step_graph(model, tmp_path / "fp16.onnx", precision=FP16)
    graph = onnx.load(str(tmp_path / "fp16.onnx")).graph
    producers = {out: n for n in graph.node for out in n.output}
    for product, frames in adapter_products(tmp_path / "fp16.onnx"):
        mask = producers[product.input[0]]
        mask = producers[mask.input[0]] if mask.op_type == "Concat" else mask  # the joined sum's Concat
        assert mask.op_type == "Mul" and mask.input[0] == frames.output[0]
    joined = [p for p, _ in adapter_products(tmp_path / "fp16.onnx") if producers[p.input[0]].op_type == "Concat"]
    assert len(joined) == BLOCKS
