"""A bias whose sum only linear readers read is added by those readers, not by a kernel of its own
(export/carried_biases.py): with adapters, each block's attention output and MLP output, which an adapter
reads before a LayerNorm does. The numbers stay the same over a stream with the state carried."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from conftest import assert_same_stream, random_model
from onnx import TensorProto, helper, numpy_helper

from sdqes_edge.export.carried_biases import carry_biases_to_readers
from sdqes_edge.export.gemm_bias import fold_bias_into_concat, merge_sibling_products, split_gemm_bias
from sdqes_edge.export.graph_edits import constant_tensors
from sdqes_edge.export.graphs import export_step_graph
from sdqes_edge.export.onnx_runtime_ops import MS_DOMAIN, SKIP_LAYER_NORM, fuse_skip_layer_norm
from sdqes_edge.package_builds import load_onnxruntime

BLOCKS = 2  # the tiny preset's image tower


def bias_adds(graph) -> int:
    """Adds of a product and a constant 1-D bias."""
    constants = constant_tensors(graph)  # a bias two layers share reaches the second through an Identity
    products = {n.output[0] for n in graph.graph.node if n.op_type == "MatMul"}
    return sum(1 for n in graph.graph.node if n.op_type == "Add" and any(i in products for i in n.input)
               and any(i in constants and len(constants[i].dims) == 1 for i in n.input))


@pytest.fixture(scope="module")
def fused_and_carried(tmp_path_factory):
    """The fp32 QRNN step graph (two adapters a block, two streams) rewritten as the fp16 graph is, up to its
    SkipLayerNormalizations, then with the biases carried."""
    folder = tmp_path_factory.mktemp("carried")
    model = random_model("qrnn", per_block=2)
    export_step_graph(model, folder / "fused.onnx", batch=2)
    graph = onnx.load(str(folder / "fused.onnx"))
    split_gemm_bias(graph)
    merge_sibling_products(graph)
    fold_bias_into_concat(graph)
    fuse_skip_layer_norm(graph)
    onnx.save(graph, str(folder / "fused.onnx"))
    carried = carry_biases_to_readers(graph)
    onnx.save(graph, str(folder / "carried.onnx"))
    size = model.cfg.vision.image_size
    return folder / "fused.onnx", folder / "carried.onnx", carried, (2, 3, size, size)


def test_each_attention_output_and_each_mlp_output_an_adapter_reads_has_its_bias_carried(fused_and_carried):
    fused, carried, count, _ = fused_and_carried
    before, after = onnx.load(str(fused)), onnx.load(str(carried))
    # Every block's attention output; every block's MLP output but the last's, which the read-out reads.
    assert count == BLOCKS + (BLOCKS - 1)
    assert bias_adds(before) - bias_adds(after) == count
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    assert carry_biases_to_readers(copy.deepcopy(after)) == 0  # nothing left to carry
    onnx.checker.check_model(after, full_check=True)


def test_the_carried_graph_gives_the_same_numbers_over_a_stream(fused_and_carried):
    fused, carried, _, frame_shape = fused_and_carried
    # (x + b) W against x W + b W: the same sum in another order, fp32 rounding carried over 24 frames.
    assert_same_stream((fused, carried), frame_shape, seed=7, atol=1e-5)


def test_in_the_fp16_graph_only_the_biases_a_nonlinearity_or_the_state_reads_stay_adds(tmp_path):
    export_step_graph(random_model("qrnn", per_block=2), tmp_path / "fp16.onnx", precision="fp16")
    # Each block's two down-projections (the state's history; c_fc's, read by QuickGELU, is taken through its
    # input: gemm_bias.fold_bias_into_wide_products); the last block's MLP output, which the class token's
    # read-out reads.
    assert bias_adds(onnx.load(str(tmp_path / "fp16.onnx"))) == 2 * BLOCKS + 1


def run(graph, feeds: dict) -> list:
    ort = load_onnxruntime()
    return ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def small_graph(third_reader: str):
    """y = x @ W + b, s = y + r; s is read by a linear layer, by a SkipLayerNormalization without a bias and by
    ``third_reader`` ("Identity" passes s to an output, "Relu" is not linear)."""
    rng = np.random.default_rng(0)
    weights = {name: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("W", (8, 8)), ("b", (8,)), ("W2", (8, 8)), ("c2", (8,)), ("g", (8,)),
                                   ("beta", (8,)))}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"]),
             helper.make_node("Add", ["y", "r"], ["s"]), helper.make_node("MatMul", ["s", "W2"], ["q"]),
             helper.make_node("Add", ["q", "c2"], ["linear"]),
             helper.make_node(SKIP_LAYER_NORM, ["s", "r", "g", "beta"], ["normed"], domain=MS_DOMAIN),
             helper.make_node(third_reader, ["s"], ["third"])]
    tensors = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 8]) for n in ("x", "r", "linear", "normed",
                                                                                     "third")]
    graph = helper.make_graph(nodes, "small", tensors[:2], tensors[2:], list(weights.values()))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)])


def test_a_bias_is_carried_only_where_every_reader_of_its_sum_is_linear_in_it():
    feeds = {n: np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32) for n in ("x", "r")}
    nonlinear = small_graph("Relu")
    assert carry_biases_to_readers(nonlinear) == 0  # a Relu reads the sum
    passed_out = small_graph("Identity")
    expected = run(passed_out, feeds)
    assert carry_biases_to_readers(passed_out) == 0  # the Identity is not linear here: it hands the sum out
    linear_only = small_graph("Identity")
    linear_only.graph.node.pop()  # the sum's readers: the linear layer and the SkipLayerNormalization
    linear_only.graph.output.pop()
    assert carry_biases_to_readers(linear_only) == 1
    skip = next(n for n in linear_only.graph.node if n.op_type == SKIP_LAYER_NORM)
    assert len(skip.input) == 5 and skip.input[4]  # a bias of its own now, the carried one
    for got, want in zip(run(linear_only, feeds), expected[:2]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
