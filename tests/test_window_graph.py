"""The sliding-window baseline's graph takes the step graph's form at each precision (the same operators, the
same rewrites), so the GPU bench compares window and stream on equal terms: a window left in plain ONNX at fp16
ran the LayerNorms, residual Adds and attention the streaming step fuses, flattering the step. Its tensors have
one axis more than the step's ([B, W, L, D]), which ONNX Runtime's SkipLayerNormalization does not take: they go
in as views of three axes. None of it may change a number."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from conftest import op_counts as ops
from conftest import random_model

from sdqes_edge.contract import EMBEDDING_OUTPUT, FP16, ONNX_RUNTIME_OPERATORS, PLAIN_ONNX_OPERATORS, WINDOW_INPUT
from sdqes_edge.export.graphs import export_step_graph, export_window_graph, read_metadata
from sdqes_edge.export.onnx_runtime_ops import ATTENTION, SKIP_LAYER_NORM
from sdqes_edge.export.tensorrt_ops import as_tensorrt_reads_it
from sdqes_edge.package_builds import load_onnxruntime
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.tolerances import VARIANT_TOLERANCES

BLOCKS = 2  # the tiny preset's image tower
WINDOW = 4
STREAMS = 2


def run_window(path, frames: np.ndarray) -> np.ndarray:
    session = load_onnxruntime().InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run([EMBEDDING_OUTPUT], {WINDOW_INPUT: frames})[0]


@pytest.fixture(scope="module")
def model_and_frames():
    model = random_model("qrnn", lookback=2)
    size = model.cfg.vision.image_size
    frames = np.random.default_rng(5).standard_normal((STREAMS, WINDOW, 3, size, size)).astype(np.float32)
    return model, frames


def test_the_window_graph_with_onnx_runtime_operators_computes_the_plain_window_graphs_values(model_and_frames,
                                                                                              tmp_path):
    model, frames = model_and_frames
    plain, fused = tmp_path / "plain.onnx", tmp_path / "fused.onnx"
    export_window_graph(model, plain, window=WINDOW, batch=STREAMS)
    description = export_window_graph(model, fused, window=WINDOW, batch=STREAMS, operators=ONNX_RUNTIME_OPERATORS)
    assert description["operators"] == ONNX_RUNTIME_OPERATORS == read_metadata(fused)["operators"]
    assert read_metadata(plain)["operators"] == PLAIN_ONNX_OPERATORS
    # Every residual a LayerNorm reads, as in the step graph, though its tensors have four axes here.
    assert ops(fused)[ATTENTION] == BLOCKS and ops(fused)[SKIP_LAYER_NORM] == 2 * BLOCKS
    assert not {ATTENTION, SKIP_LAYER_NORM} & set(ops(plain))
    onnx.checker.check_model(onnx.load(str(fused)), full_check=True)
    with torch.no_grad():
        reference = model.visual.forward_clip(torch.from_numpy(frames))[:, -1].numpy()
    np.testing.assert_allclose(run_window(plain, frames), reference, atol=1e-6)
    np.testing.assert_allclose(run_window(fused, frames), run_window(plain, frames), atol=2e-6)


def test_tensorrt_reads_the_window_graph_written_back_as_the_same_values(model_and_frames, tmp_path):
    model, frames = model_and_frames
    plain, fused, readable = tmp_path / "plain.onnx", tmp_path / "fused.onnx", tmp_path / "readable.onnx"
    export_window_graph(model, plain, window=WINDOW, batch=STREAMS)
    export_window_graph(model, fused, window=WINDOW, batch=STREAMS, operators=ONNX_RUNTIME_OPERATORS)
    graph = as_tensorrt_reads_it(onnx.load(str(fused)))
    assert all(n.domain == "" for n in graph.graph.node)
    onnx.save(graph, str(readable))
    np.testing.assert_allclose(run_window(readable, frames), run_window(plain, frames), atol=2e-6)


def test_the_fp16_window_graph_has_the_fp16_step_graphs_form_and_its_last_embedding(model_and_frames, tmp_path):
    """Its default operators are the fp16 step graph's; over the same W frames, the window's newest embedding is
    what the fp16 step graph gives at the W-th frame with its state carried (lookback 2: every frame counts)."""
    model, frames = model_and_frames
    window, step = tmp_path / "window.fp16.onnx", tmp_path / "step.fp16.onnx"
    description = export_window_graph(model, window, window=WINDOW, batch=STREAMS, precision=FP16)
    export_step_graph(model, step, batch=STREAMS, precision=FP16)
    assert description["operators"] == read_metadata(step)["operators"] == ONNX_RUNTIME_OPERATORS
    assert {op: ops(window)[op] for op in (ATTENTION, SKIP_LAYER_NORM)} == \
           {op: ops(step)[op] for op in (ATTENTION, SKIP_LAYER_NORM)}
    runner = OnnxRuntimeStep(step)
    state = runner.initial_state()
    for t in range(WINDOW):
        result = runner.step(frames[:, t], state)
        state = result.state
    from_window = run_window(window, frames)
    assert from_window.dtype == np.float32  # frames in and the embedding out in fp32, as the step graph's
    np.testing.assert_allclose(from_window, result.embedding, atol=VARIANT_TOLERANCES[FP16]["max_abs_embedding"])
    cosine = (from_window * result.embedding).sum(-1)  # both L2-normalized
    assert cosine.min() >= VARIANT_TOLERANCES[FP16]["min_cosine"]
    # and the model itself was traced from a copy: still fp32, its attention unswapped
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_a_window_graph_of_an_untraced_precision_or_unknown_operators_is_refused(model_and_frames, tmp_path):
    model, _ = model_and_frames
    with pytest.raises(ValueError, match="int8 is made by quantizing"):
        export_window_graph(model, tmp_path / "w.onnx", window=WINDOW, precision="int8")
    with pytest.raises(ValueError, match="operators are one of"):
        export_window_graph(model, tmp_path / "w.onnx", window=WINDOW, operators="tensorrt")
