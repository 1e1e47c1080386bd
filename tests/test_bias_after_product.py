"""fp16 step graphs carry each linear layer as MatMul then Add of its bias (export/gemm_bias.py): on ONNX Runtime's
CUDA provider that pair ran the 32-stream step 1.11x faster than one Gemm with a bias (H200). On the CPU, ONNX
Runtime folds the pair back into its Gemm, so nothing there may change: not the kernels, not the numbers."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from conftest import assert_same_stream, random_model
from onnx import TensorProto, helper, numpy_helper

from sdqes_edge.contract import STATE_INPUT_PREFIX
from sdqes_edge.export.fused_ops import QRNN_POOL
from sdqes_edge.export.gemm_bias import (
    BIAS_COLUMNS,
    WIDE_PRODUCT_RATIO,
    fold_bias_into_concat,
    fold_bias_into_wide_products,
    merge_sibling_products,
    split_gemm_bias,
)
from sdqes_edge.export.graphs import export_step_graph
from sdqes_edge.package_builds import load_onnxruntime
from sdqes_edge.runtime.kernels import count_kernels
from sdqes_edge.runtime.ort_releases import session_keywords
from sdqes_edge.runtime.ort_sessions import session_options


def biased_gemms(graph) -> int:
    """Gemms (or ONNX Runtime's FusedGemm) adding a constant 1-D bias, through an Identity or not."""
    initializers = {i.name: i for i in graph.graph.initializer}
    initializers.update({n.output[0]: initializers[n.input[0]] for n in graph.graph.node
                         if n.op_type == "Identity" and n.input[0] in initializers})
    return sum(1 for n in graph.graph.node if n.op_type in ("Gemm", "FusedGemm") and len(n.input) == 3
               and n.input[2] in initializers and len(initializers[n.input[2]].dims) == 1)


@pytest.fixture(scope="module")
def gemm_and_split(tmp_path_factory):
    """The fp32 qrnn step graph as traced (a Gemm per linear layer) and the same graph rewritten."""
    folder = tmp_path_factory.mktemp("bias")
    gemm, split = folder / "gemm.onnx", folder / "split.onnx"
    model = random_model("qrnn", lookback=2)
    export_step_graph(model, gemm, batch=2)
    graph = onnx.load(str(gemm))
    rewritten = split_gemm_bias(graph)
    onnx.save(graph, str(split))
    size = model.cfg.vision.image_size
    return gemm, split, rewritten, (2, 3, size, size)


@pytest.mark.parametrize("kind", ["qrnn", "st", "retnet", "none"])
def test_the_fp16_step_graph_has_no_gemm_with_a_bias(kind, tmp_path):
    export_step_graph(random_model(kind), tmp_path / "fp16.onnx", precision="fp16")
    graph = onnx.load(str(tmp_path / "fp16.onnx"))
    kept = [n for n in graph.graph.node if n.op_type == "Gemm"]
    assert all(a.name == "transA" and a.i == 1 for n in kept for a in n.attribute if a.name == "transA")
    assert biased_gemms(graph) == len(kept) <= 2  # only the attention's output projections, A transposed
    assert any(n.op_type == "MatMul" for n in graph.graph.node)
    onnx.checker.check_model(graph, full_check=True)


def test_every_biased_gemm_becomes_a_product_then_its_bias_and_the_old_weights_leave_the_file(gemm_and_split):
    gemm, split, rewritten, _ = gemm_and_split
    before, after = onnx.load(str(gemm)), onnx.load(str(split))
    assert rewritten > 0 and biased_gemms(after) == biased_gemms(before) - rewritten
    assert len(after.graph.initializer) == len(before.graph.initializer)  # each weight swapped, none doubled
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    twice = copy.deepcopy(after)
    assert split_gemm_bias(twice) == 0  # nothing left to rewrite


def test_on_the_cpu_onnx_runtime_runs_the_same_kernels_and_numbers_over_a_stream(gemm_and_split):
    gemm, split, _, frame_shape = gemm_and_split
    assert count_kernels(split).by_op == count_kernels(gemm).by_op  # folded back into Gemm
    assert_same_stream((gemm, split), frame_shape)


def test_a_cuda_session_keeps_product_and_bias_apart_and_a_cpu_session_folds_them(gemm_and_split, tmp_path):
    """What ONNX Runtime makes of the graph, read from the optimized model it saves: with the CUDA session's
    keywords (here on the CPU provider, the same graph optimizer) no biased Gemm comes back."""
    _, split, _, _ = gemm_and_split
    ort = load_onnxruntime()
    made = {}
    for device in ("cpu", "cuda"):
        options = session_options()
        options.optimized_model_filepath = str(tmp_path / f"{device}.onnx")
        ort.InferenceSession(str(split), options, providers=["CPUExecutionProvider"], **session_keywords(device))
        made[device] = onnx.load(str(tmp_path / f"{device}.onnx"))
    assert session_keywords("cpu") == {} and session_keywords("tensorrt") == {}
    left = biased_gemms(onnx.load(str(split)))  # the attention's output projection, which reads A transposed
    assert biased_gemms(made["cpu"]) > left  # folded back: the CPU's Gemm is one kernel
    assert biased_gemms(made["cuda"]) == left and any(n.op_type == "MatMul" for n in made["cuda"].graph.node)


def test_the_fp16_graph_computes_the_qrnn_gates_as_one_product_then_a_split(tmp_path):
    """Z and F read the same frames: one product and one bias for both, then a Split (3 GPU kernels, not 4), which
    is now the first operator of the pooling step's function (export/fused_ops.py)."""
    export_step_graph(random_model("qrnn"), tmp_path / "fp16.onnx", precision="fp16")
    graph = onnx.load(str(tmp_path / "fp16.onnx"))
    initializers = {i.name for i in graph.graph.initializer}
    weighted_inputs = [n.input[0] for n in graph.graph.node if n.op_type == "MatMul" and n.input[1] in initializers]
    assert len(weighted_inputs) == len(set(weighted_inputs))  # no two weighted products read the same tensor
    producers = {out: n for n in graph.graph.node for out in n.output}
    pools = [n for n in graph.graph.node if n.op_type == QRNN_POOL]
    assert len(pools) == 4 and all(".merged" in producers[n.input[0]].name for n in pools)  # 2 blocks x 2
    assert [n.op_type for n in next(f for f in graph.functions if f.name == QRNN_POOL).node][0] == "Split"


def test_merged_sibling_products_give_the_same_numbers_over_a_stream(gemm_and_split, tmp_path):
    gemm, split, _, frame_shape = gemm_and_split
    graph = onnx.load(str(split))
    assert merge_sibling_products(graph) == 4  # each QRNN layer's F merged into its Z: 2 blocks x 2 adapters
    assert merge_sibling_products(copy.deepcopy(graph)) == 0  # nothing left to merge
    onnx.checker.check_model(graph, full_check=True)
    onnx.save(graph, str(tmp_path / "merged.onnx"))
    assert_same_stream((gemm, tmp_path / "merged.onnx"), frame_shape)


def test_a_gate_product_over_concatenated_frames_takes_its_bias_through_a_column_of_ones(tmp_path):
    """The Concat of the remembered and the current frame appends a constant [rows, 8] block (a 1, then zeros)
    and the gate weight gains the bias as the row that meets the 1: one bias kernel fewer per QRNN adapter."""
    model = random_model("qrnn", per_block=2)
    export_step_graph(model, tmp_path / "fp16.onnx", precision="fp16")
    graph = onnx.load(str(tmp_path / "fp16.onnx"))
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in graph.graph.initializer}
    producers = {out: n for n in graph.graph.node for out in n.output}
    gates = [n for n in graph.graph.node if n.op_type == "MatMul" and producers[n.input[0]].op_type == "Concat"
             and producers[n.input[0]].input[0].startswith(STATE_INPUT_PREFIX)]  # over the remembered frames
    assert len(gates) == 2 * model.cfg.vision.layers
    for gate in gates:
        concat = producers[gate.input[0]]
        ones = constants[concat.input[-1]]
        assert ones.shape == (model.cfg.vision.num_tokens, BIAS_COLUMNS) and ones[:, 0].tolist() == [1] * len(ones)
        assert not ones[:, 1:].any() and constants[gate.input[1]].shape[0] % BIAS_COLUMNS == 0
        readers = [n.op_type for n in graph.graph.node if gate.output[0] in n.input]
        assert readers == [QRNN_POOL]  # the pooling step, which splits Z and F; no Add of a bias between


def test_the_bias_taken_through_the_product_gives_the_same_numbers_over_a_stream(tmp_path):
    model = random_model("qrnn", per_block=2)
    export_step_graph(model, tmp_path / "gemm.onnx", batch=2)
    graph = onnx.load(str(tmp_path / "gemm.onnx"))
    split_gemm_bias(graph)
    merge_sibling_products(graph)
    assert fold_bias_into_concat(graph) == 4  # 2 blocks x 2 adapters
    assert fold_bias_into_concat(copy.deepcopy(graph)) == 0  # nothing left to fold
    onnx.checker.check_model(graph, full_check=True)
    onnx.save(graph, str(tmp_path / "folded.onnx"))
    size = model.cfg.vision.image_size
    assert_same_stream((tmp_path / "gemm.onnx", tmp_path / "folded.onnx"), (2, 3, size, size))


def test_a_concatenation_that_another_node_also_reads_keeps_its_width(gemm_and_split):
    # With 2 remembered frames the next history is a slice of the concatenated frames: a column appended there
    # would be carried into the state.
    _, split, _, _ = gemm_and_split
    graph = onnx.load(str(split))
    merge_sibling_products(graph)
    assert fold_bias_into_concat(graph) == 0


@pytest.mark.parametrize("precision, operators", [("fp16", None), ("fp32", "onnxruntime"), ("fp16", "onnx")])
def test_the_mlps_widening_product_takes_its_bias_through_its_input_with_onnx_runtimes_operators(precision,
                                                                                                 operators, tmp_path):
    """c_fc (width -> 4 x width) reads its input with the [rows, 8] block appended: a Concat over the width
    replaces the bias Add over four times the width. Not in the plain-ONNX fp16 graph, TensorRT's, which adds a
    bias inside its GEMM."""
    model = random_model("qrnn", per_block=2)
    export_step_graph(model, tmp_path / "g.onnx", precision=precision, operators=operators)
    graph = onnx.load(str(tmp_path / "g.onnx"))
    producers = {out: n for n in graph.graph.node for out in n.output}
    c_fc = [n for n in graph.graph.node if n.op_type == "MatMul" and "c_fc" in n.name]
    taken_in = [n for n in c_fc if producers[n.input[0]].op_type == "Concat"]
    assert len(c_fc) == model.cfg.vision.layers
    assert len(taken_in) == (0 if operators == "onnx" else len(c_fc))
    for product in taken_in:
        readers = {n.op_type for n in graph.graph.node if product.output[0] in n.input}
        assert "Add" not in readers
    if taken_in:  # every block's product shares one constant block
        assert len({producers[n.input[0]].input[1] for n in taken_in}) == 1


def small_products(widths: dict[str, int], read_twice: str = "") -> onnx.ModelProto:
    """x [4, 8] -> each named product x @ W (to ``widths[name]`` features) + b, then a Relu, an output each;
    ``read_twice``: that product's output is read by a second node too."""
    rng = np.random.default_rng(1)
    nodes, initializers, outputs = [], [], []
    for name, width in widths.items():
        initializers += [numpy_helper.from_array(rng.standard_normal((8, width)).astype(np.float32), f"W{name}"),
                         numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"b{name}")]
        nodes += [helper.make_node("MatMul", ["x", f"W{name}"], [f"p{name}"]),
                  helper.make_node("Add", [f"p{name}", f"b{name}"], [f"s{name}"]),
                  helper.make_node("Relu", [f"s{name}"], [f"y{name}"])]
        if name == read_twice:
            nodes.append(helper.make_node("Relu", [f"p{name}"], [f"r{name}"]))
            outputs.append(helper.make_tensor_value_info(f"r{name}", TensorProto.FLOAT, [4, width]))
        outputs.append(helper.make_tensor_value_info(f"y{name}", TensorProto.FLOAT, [4, width]))
    return helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 8])], outputs, initializers), opset_imports=[helper.make_opsetid("", 17)])


def test_only_a_product_wide_enough_and_read_by_its_bias_alone_takes_its_bias_through_its_input():
    widths = {"narrow": 8, "wide": 8 * WIDE_PRODUCT_RATIO, "shared": 32}
    graph = small_products(widths, read_twice="shared")
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    ort = load_onnxruntime()
    before = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert fold_bias_into_wide_products(graph) == 1
    onnx.checker.check_model(graph, full_check=True)
    assert [n.op_type for n in graph.graph.node].count("Add") == 2  # the narrow and the shared products keep theirs
    after = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, want in zip(after, before):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_tensorrt_reads_each_wide_products_bias_after_it_again(tmp_path):
    """TensorRT adds a bias inside its GEMM for nothing: the graph build-engine parses has c_fc reading its input
    and an Add of its bias, and no Concat of a bias block but the gates' (whose frames need their Concat)."""
    from sdqes_edge.export.tensorrt_ops import as_tensorrt_reads_it

    model = random_model("qrnn", per_block=2)
    export_step_graph(model, tmp_path / "fp16.onnx", precision="fp16")
    graph = as_tensorrt_reads_it(onnx.load(str(tmp_path / "fp16.onnx")))
    onnx.checker.check_model(graph, full_check=True)
    producers = {out: n for n in graph.graph.node for out in n.output}
    c_fc = [n for n in graph.graph.node if n.op_type == "MatMul" and "c_fc" in n.name]
    assert len(c_fc) == model.cfg.vision.layers
    assert all(producers[n.input[0]].op_type != "Concat" for n in c_fc)
    assert all({r.op_type for r in graph.graph.node if n.output[0] in r.input} == {"Add"} for n in c_fc)
