"""fp16 step graphs add each residual inside the LayerNorm that reads it (ONNX Runtime's SkipLayerNormalization,
export/onnx_runtime_ops.py): on its CUDA provider three kernels a block fewer. The rewrite must not change a
number: checked here on fp32 graphs, where ONNX Runtime's CPU kernels are exact, over a stream with the state
carried; and TensorRT, which lacks the operator, must read the graph written back as plain ONNX."""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import assert_same_stream, random_model

from sdqes_edge.contract import ONNX_RUNTIME_OPERATORS, PLAIN_ONNX_OPERATORS
from sdqes_edge.export.gemm_bias import split_gemm_bias
from sdqes_edge.export.graphs import export_step_graph
from sdqes_edge.export.onnx_runtime_ops import (
    MS_DOMAIN,
    SKIP_LAYER_NORM,
    expand_skip_layer_norm,
    fuse_skip_layer_norm,
)
from sdqes_edge.export.tensorrt_ops import tensorrt_readable_bytes
from sdqes_edge.runtime.kernels import count_kernels
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

BLOCKS = 2  # the tiny preset's image tower


def ops(graph) -> Counter:
    return Counter(n.op_type for n in graph.graph.node)


def layer_norms_reading_an_add(graph) -> int:
    producers = {out: n for n in graph.graph.node for out in n.output}
    return sum(1 for n in graph.graph.node if n.op_type == "LayerNormalization"
               and getattr(producers.get(n.input[0]), "op_type", None) == "Add")


@pytest.fixture(scope="module")
def plain_and_fused(tmp_path_factory):
    """The fp32 qrnn step graph at two streams with each bias after its product, as the fp16 graph is written,
    and the same graph with its residuals fused into the LayerNorms."""
    folder = tmp_path_factory.mktemp("skip")
    plain, fused = folder / "plain.onnx", folder / "fused.onnx"
    model = random_model("qrnn", lookback=2)
    export_step_graph(model, plain, batch=2)
    graph = onnx.load(str(plain))
    split_gemm_bias(graph)
    onnx.save(graph, str(plain))
    fused_count = fuse_skip_layer_norm(graph)
    onnx.save(graph, str(fused))
    size = model.cfg.vision.image_size
    return plain, fused, fused_count, (2, 3, size, size)


@pytest.mark.parametrize("kind, per_block_after_the_first, first_block", [
    ("qrnn", 2, 2),  # ln_1 reads x + adapter1's up-projection, ln_2 reads x + attention (+ adapter2)
    ("st", 2, 2),
    ("none", 2, 1),  # ln_1 reads the previous block's x + MLP; the first block's reads the embeddings
])
def test_the_fp16_graph_fuses_every_residual_that_a_layer_norm_reads(kind, per_block_after_the_first, first_block,
                                                                     tmp_path):
    export_step_graph(random_model(kind), tmp_path / "fp16.onnx", precision="fp16")
    graph = onnx.load(str(tmp_path / "fp16.onnx"))
    assert ops(graph)[SKIP_LAYER_NORM] == first_block + per_block_after_the_first * (BLOCKS - 1)
    assert layer_norms_reading_an_add(graph) == 1  # ln_pre: the embeddings plus a constant, nothing to skip
    assert any(o.domain == MS_DOMAIN for o in graph.opset_import)
    onnx.checker.check_model(graph, full_check=True)


def test_a_bias_feeding_the_residual_is_folded_in_and_the_sum_kept_for_its_other_readers(plain_and_fused):
    plain, fused, fused_count, _ = plain_and_fused
    before, after = onnx.load(str(plain)), onnx.load(str(fused))
    skips = [n for n in after.graph.node if n.op_type == SKIP_LAYER_NORM]
    assert fused_count == len(skips) == 2 * BLOCKS
    with_bias = [n for n in skips if len(n.input) == 5 and n.input[4]]
    # ln_1: x + up(h) + up.bias; ln_2: x + (a + up(h) + up.bias), the attention's a a Gemm in this plain graph
    assert len(with_bias) == 2 * BLOCKS
    assert all(len(n.output) == 4 and n.output[3] for n in skips)  # every residual is read again later
    # Each fusion removes the LayerNorm and the residual Add, and a folded bias its Add.
    assert len(before.graph.node) - len(after.graph.node) == 2 * len(skips) - len(skips) + len(with_bias)
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    assert fuse_skip_layer_norm(copy.deepcopy(after)) == 0  # nothing left to fuse


def test_on_the_cpu_the_fused_graph_runs_fewer_kernels_and_the_same_numbers_over_a_stream(plain_and_fused):
    plain, fused, _, frame_shape = plain_and_fused
    before, after = count_kernels(plain), count_kernels(fused)
    assert after.by_op[SKIP_LAYER_NORM] == 2 * BLOCKS and "LayerNormalization" in before.by_op
    assert after.per_step < before.per_step
    assert_same_stream((plain, fused), frame_shape, seed=5)


def test_tensorrt_reads_the_fused_graph_written_back_as_plain_onnx(plain_and_fused, tmp_path):
    plain, fused, fused_count, _ = plain_and_fused
    assert tensorrt_readable_bytes(plain, PLAIN_ONNX_OPERATORS) is None  # already plain: parsed from the file itself
    readable = onnx.load_from_string(tensorrt_readable_bytes(fused, ONNX_RUNTIME_OPERATORS))
    assert all(n.domain in ("", "ai.onnx") for n in readable.graph.node)
    assert all(o.domain != MS_DOMAIN for o in readable.opset_import)
    assert ops(readable) == ops(onnx.load(str(plain)))
    onnx.checker.check_model(readable, full_check=True)
    expanded = tmp_path / "expanded.onnx"
    onnx.save(readable, str(expanded))
    frame = np.random.default_rng(6).standard_normal(plain_and_fused[3]).astype(np.float32)
    results = [OnnxRuntimeStep(p).step(frame, OnnxRuntimeStep(p).initial_state()) for p in (plain, expanded)]
    # The same operators, a bias added after the sum it was folded out of instead of before.
    np.testing.assert_allclose(results[1].embedding, results[0].embedding, atol=1e-6)
    graph = onnx.load(str(fused))
    assert expand_skip_layer_norm(graph) == fused_count and expand_skip_layer_norm(graph) == 0


@pytest.mark.parametrize("kind", ["qrnn", "none"])
def test_with_the_attention_node_every_residual_bias_is_added_inside_the_layer_norm(kind, tmp_path):
    """ln_2 reads x + attention, whose output projection is now a product and its bias: that bias is folded in;
    with a second adapter, x + (a + up(h)), the up-projection's bias (a, the attention's output, is the
    adapter's input too: its bias is then carried to a's readers, this LayerNorm among them,
    tests/test_carried_biases.py)."""
    export_step_graph(random_model(kind), tmp_path / "ort.onnx", operators=ONNX_RUNTIME_OPERATORS)
    graph = onnx.load(str(tmp_path / "ort.onnx"))
    skips = [n for n in graph.graph.node if n.op_type == SKIP_LAYER_NORM]
    assert skips and all(len(n.input) == 5 and n.input[4] for n in skips)
    merged_biases = [n for n in skips if n.input[4].endswith((".unbiased.bias", ".unbiased.bias.carried"))]
    assert len(merged_biases) == (BLOCKS if kind == "qrnn" else 0)
