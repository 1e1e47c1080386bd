"""With two adapters a block, the attention's output is read by the second adapter's down-projection and summed
with that adapter's update; in the graphs for ONNX Runtime's CUDA provider the sum is one product over the
concatenated inputs and the down-projection reads the attention's output through the folded weight
(export/joined_products.py): a product and an Add fewer per block, the same numbers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import assert_same_stream, random_model
from onnx import TensorProto, helper, numpy_helper

from sdqes_edge.contract import ONNX_RUNTIME_OPERATORS, STATE_OUTPUT_PREFIX
from sdqes_edge.export.graphs import export_step_graph
from sdqes_edge.export.joined_products import join_summed_products
from sdqes_edge.export.onnx_runtime_ops import SKIP_LAYER_NORM
from sdqes_edge.package_builds import load_onnxruntime

BLOCKS = 2  # the tiny preset's image tower


def joined_sums(graph) -> list:
    """The products whose input concatenates an adapter's new hidden state (its update's input) with another
    tensor, and which a SkipLayerNormalization reads: the joined sums."""
    producers = {out: n for n in graph.graph.node for out in n.output}
    layer_norm_inputs = {i for n in graph.graph.node if n.op_type == SKIP_LAYER_NORM for i in n.input}
    return [n for n in graph.graph.node if n.op_type == "MatMul" and n.output[0] in layer_norm_inputs
            and producers[n.input[0]].op_type == "Concat"
            and producers[n.input[0]].input[0].startswith(STATE_OUTPUT_PREFIX)]


@pytest.mark.parametrize("kind", ["qrnn", "mlp"])
def test_each_blocks_attention_output_and_second_update_are_one_product_and_the_same_numbers(kind, tmp_path):
    model = random_model(kind, per_block=2)
    plain, joined = tmp_path / "plain.onnx", tmp_path / "joined.onnx"
    export_step_graph(model, plain, batch=2)
    export_step_graph(model, joined, batch=2, operators=ONNX_RUNTIME_OPERATORS)
    if kind == "qrnn":  # (the MLP adapter carries no state to recognise its update by)
        assert len(joined_sums(onnx.load(str(joined)))) == BLOCKS
    size = model.cfg.vision.image_size
    assert_same_stream((plain, joined), (2, 3, size, size), frames=16, atol=2e-6)


def test_in_the_fp16_graph_the_attentions_output_is_read_by_the_down_projection_and_the_joined_sum_alone(tmp_path):
    """The output projection's product is gone: what the attention computes (reshaped to rows) goes to the second
    adapter's down-projection, through the folded weight, and into the Concat of the joined sum."""
    model = random_model("qrnn", per_block=2)
    export_step_graph(model, tmp_path / "fp16.onnx", precision="fp16")
    graph = onnx.load(str(tmp_path / "fp16.onnx"))
    producers = {out: n for n in graph.graph.node for out in n.output}
    concats = {producers[n.input[0]].name for n in joined_sums(graph)}
    attention_rows = [n.output[0] for n in graph.graph.node if n.op_type == "Reshape"
                      and producers[n.input[0]].op_type == "Attention"]
    assert len(attention_rows) == BLOCKS and len(concats) == BLOCKS
    for rows in attention_rows:
        readers = [n for n in graph.graph.node if rows in n.input]
        assert sorted(n.op_type for n in readers) == ["Concat", "MatMul"]
        down = next(n for n in readers if n.op_type == "MatMul")
        assert down.output[0].startswith(STATE_OUTPUT_PREFIX)  # its sum (with its bias) is the adapter's history
        assert next(n for n in readers if n.op_type == "Concat").name in concats


def shared_product_graph(second_reader: str) -> onnx.ModelProto:
    """a = y @ W, read by the sum a + h @ V (then a Relu, the output) and by ``second_reader`` ("MatMul":
    a @ U, linear; "Relu": not)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("W", (8, 8)), ("V", (4, 8)), ("U", (8, 6)))]
    second = (helper.make_node("MatMul", ["a", "U"], ["second"]) if second_reader == "MatMul"
              else helper.make_node("Relu", ["a"], ["second"]))
    nodes = [helper.make_node("MatMul", ["y", "W"], ["a"]), helper.make_node("MatMul", ["h", "V"], ["p"]),
             helper.make_node("Add", ["a", "p"], ["s"]), helper.make_node("Relu", ["s"], ["out"]), second]
    inputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8]),
              helper.make_tensor_value_info("h", TensorProto.FLOAT, [3, 4])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 8]),
               helper.make_tensor_value_info("second", TensorProto.FLOAT, [3, 6 if second_reader == "MatMul" else 8])]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, weights),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("second_reader, joined", [("MatMul", 1), ("Relu", 0)])
def test_a_sum_is_joined_only_when_every_other_reader_of_the_shared_product_is_linear(second_reader, joined):
    graph = shared_product_graph(second_reader)
    rng = np.random.default_rng(1)
    feeds = {"y": rng.standard_normal((3, 8)).astype(np.float32), "h": rng.standard_normal((3, 4)).astype(np.float32)}
    ort = load_onnxruntime()
    before = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert join_summed_products(graph) == joined
    onnx.checker.check_model(graph, full_check=True)
    assert ("Add" in {n.op_type for n in graph.graph.node}) == (not joined)
    after = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, want in zip(after, before):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
