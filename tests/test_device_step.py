"""The bound step: state in two device buffer sets allocated once and alternated, never leaving the device.

The binding logic runs on the CPU too (ONNX Runtime binds CPU buffers the same way), so it is specified
here for every machine; the tests that need the CUDA execution provider (device == CPU, CUDA-graph replay ==
plain replay) are skipped where it is missing, with the reason.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from conftest import random_model

from sdqes_edge.errors import SetupWarning, UserError
from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.export.graphs import export_step_graph
from sdqes_edge.runtime.backend import BufferSetLedger, frame_batch_buffer
from sdqes_edge.runtime.bundle import load_bundle
from sdqes_edge.runtime.onnxruntime_backend import BoundState, OnnxRuntimeStep
from sdqes_edge.runtime.ort_sessions import session_with_capture_fallback
from sdqes_edge.tolerances import VARIANT_TOLERANCES

HAS_CUDA = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
# fp32 on a GPU against fp32 on the CPU: sums in another order, nothing more (TF32 products are off,
# ort_releases.cuda_options; with them on, the tiny preset drifted 1.5e-4 in 100 frames on an H200).
FP32_ON_A_GPU = 1e-5
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu with the CUDA execution provider "
                                                     "(an NVIDIA GPU); the binding logic is tested on the CPU")


def stream(runner: OnnxRuntimeStep, frames: np.ndarray, batch: int = 1):
    """Step every frame (repeated over the batch), the state carried; embeddings and the final state."""
    state, embeddings = runner.initial_state(), []
    for frame in frames:
        result = runner.step(np.repeat(frame[None], batch, axis=0), state)
        embeddings.append(result.embedding.copy())
        state = result.state
    return np.stack(embeddings), runner.state_to_numpy(state)


def test_bound_step_gives_the_plain_steps_stream_and_next_state(step_graphs):
    paths, frames = step_graphs
    plain_emb, plain_state = stream(OnnxRuntimeStep(paths[1]), frames)
    bound_emb, bound_state = stream(OnnxRuntimeStep(paths[1], io_binding=True), frames)
    np.testing.assert_array_equal(bound_emb, plain_emb)
    for name, value in plain_state.items():
        np.testing.assert_array_equal(bound_state[name], value)


@pytest.mark.parametrize("io_binding", [False, True], ids=["plain", "bound"])
def test_what_a_step_returns_is_the_callers_and_later_steps_leave_it_alone(step_graphs, io_binding):
    """On the CPU an OrtValue's ``numpy()`` is a view of the bound buffer (on a GPU, a copy): returned as it
    is, an embedding or a saved state would change under the caller at the next step."""
    paths, frames = step_graphs
    runner = OnnxRuntimeStep(paths[1], io_binding=io_binding)
    first = runner.step(frames[0][None], runner.initial_state())
    embedding, saved = first.embedding.copy(), runner.state_to_numpy(first.state)
    kept = {name: value.copy() for name, value in saved.items()}
    state = first.state
    for frame in frames[1:4]:  # both buffer sets written again
        state = runner.step(frame[None], state).state
    np.testing.assert_array_equal(first.embedding, embedding)
    for name, value in kept.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)


@pytest.mark.parametrize("device, io_binding, warm_up_steps", [
    ("cpu", False, 1), ("cpu", True, 2),
    pytest.param("cuda", True, 6, marks=needs_cuda),  # 2 bindings x (2 uncaptured runs + the capture)
], ids=["plain", "bound", "cuda-graphs"])
def test_a_warm_up_mid_stream_changes_nothing_the_streams_see(step_graphs, device, io_binding, warm_up_steps):
    """``warm_up`` steps blank frames through each binding (on a GPU until each binding's CUDA graph is
    captured, so no capture lands on a real frame), then puts the state back: the streams after it are the
    streams without it (bit for bit on the CPU), an idle stream and the next state included."""
    from sdqes_edge.runtime.detector import StreamingDetector
    from sdqes_edge.runtime.sources import Frame

    paths, frames = step_graphs
    bundle = load_bundle(paths[4].parent)
    warmed, plain = (StreamingDetector(bundle, backend_instance=OnnxRuntimeStep(paths[4], device=device,
                                                                                io_binding=io_binding))
                     for _ in range(2))
    assert warmed.backend.warm_up_steps == warm_up_steps
    backend_steps = []
    step = warmed.backend.step
    warmed.backend.step = lambda *args: backend_steps.append(1) or step(*args)
    atol = 0.0 if device == "cpu" else 1e-5  # two GPU sessions may pick different cuDNN algorithms
    for i, image in enumerate(frames[:12]):
        if i in (0, 7):
            before = len(backend_steps)
            assert warmed.warm_up() > 0 and len(backend_steps) - before == warm_up_steps
        frame = Frame(image=np.zeros((2, 2, 3), np.uint8), time=float(i), index=i, tensor=image)
        batch = [frame, None if i % 3 == 0 else frame, frame, frame]  # stream 1 idle every third frame
        for detector in (warmed, plain):
            detector.step(batch)
        np.testing.assert_allclose(warmed.last_embeddings, plain.last_embeddings, rtol=0, atol=atol)
    got, want = (d.backend.state_to_numpy(d.state) for d in (warmed, plain))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=atol, atol=atol, err_msg=name)


def test_the_two_buffer_sets_are_allocated_once_and_alternate(step_graphs):
    paths, frames = step_graphs
    runner = OnnxRuntimeStep(paths[1], io_binding=True)
    buffers = runner.buffers
    addresses = [{n: v.data_ptr() for n, v in s.items()} for s in buffers.sets]
    assert not set(addresses[0].values()) & set(addresses[1].values())  # an input is never its own output
    state, sets_used = runner.initial_state(), []
    for frame in frames[:6]:
        state = runner.step(frame[None], state).state
        sets_used.append(state.buffer_set)
    assert sets_used == [1, 0, 1, 0, 1, 0]
    assert [{n: v.data_ptr() for n, v in s.items()} for s in buffers.sets] == addresses
    assert len(buffers.bindings) == 2


def test_a_batch_assembled_in_the_bound_steps_own_buffer_steps_as_a_separate_array_would(step_graphs):
    """The detector assembles its streams' frames where the bound step uploads from (``frame_batch_buffer``), and
    the step then copies nothing: frame after frame, the stream and the next state are those of a copy."""
    paths, frames = step_graphs
    in_place, copied = (OnnxRuntimeStep(paths[4], io_binding=True) for _ in range(2))
    shape = (4, *frames.shape[1:])
    buffer = frame_batch_buffer(in_place, shape)
    assert buffer is in_place.frame_buffer
    states = [in_place.initial_state(), copied.initial_state()]
    for frame in frames[:12]:
        batch = np.repeat(frame[None], 4, axis=0)
        batch[2] = 0.0  # an idle slot, as the detector zeroes it
        buffer[...] = batch
        a, b = in_place.step(buffer, states[0]), copied.step(batch, states[1])
        np.testing.assert_array_equal(a.embedding, b.embedding)
        states = [a.state, b.state]
    want = copied.state_to_numpy(states[1])
    for name, value in in_place.state_to_numpy(states[0]).items():
        np.testing.assert_array_equal(value, want[name])
    unbound = frame_batch_buffer(OnnxRuntimeStep(paths[4]), shape)  # no upload buffer: a batch of its own
    assert unbound.shape == shape and not unbound.any() and frame_batch_buffer(in_place, (2, *shape[1:])) is not buffer


def test_a_stale_state_handle_is_refused_not_read(step_graphs):
    paths, frames = step_graphs
    runner = OnnxRuntimeStep(paths[1], io_binding=True)
    first = runner.initial_state()
    second = runner.step(frames[0][None], first).state
    third = runner.step(frames[1][None], second).state
    with pytest.raises(UserError, match="stale"):
        runner.step(frames[2][None], first)  # set 0 now holds a later state
    assert isinstance(third, BoundState)


def test_a_device_backends_ledger_keeps_the_latest_state_and_the_one_before_and_a_load_voids_both():
    """Both device backends (ONNX Runtime bound, TensorRT) keep their handles with this ledger."""
    ledger = BufferSetLedger()
    initial = ledger.loaded()
    first = ledger.stepped(ledger.current(initial))
    second = ledger.stepped(ledger.current(first))
    assert [ledger.current(s) for s in (first, second)] == [1, 0]  # keep_streams reads both
    with pytest.raises(UserError, match="stale"):
        ledger.current(initial)  # set 0 holds the second step's state now
    loaded = ledger.loaded()
    for old in (first, second):
        with pytest.raises(UserError, match="stale"):
            ledger.current(old)
    assert ledger.current(loaded) == 0
    with pytest.raises(UserError, match="stale"):
        ledger.current({"state": np.zeros(1)})  # not a device handle at all


def test_reset_save_and_load_mid_stream_on_the_bound_path(step_graphs):
    paths, frames = step_graphs
    plain, bound = OnnxRuntimeStep(paths[1]), OnnxRuntimeStep(paths[1], io_binding=True)
    state_p, state_b = plain.initial_state(), bound.initial_state()
    for t, frame in enumerate(frames[:20]):
        if t == 10:  # a new scene: both forget the past
            state_p, state_b = plain.reset_streams(state_p), bound.reset_streams(state_b)
        if t == 15:  # a restart: the bound state saved to the host and loaded back
            state_b = bound.state_from_numpy(bound.state_to_numpy(state_b))
        a, b = plain.step(frame[None], state_p), bound.step(frame[None], state_b)
        np.testing.assert_array_equal(a.embedding, b.embedding)
        state_p, state_b = a.state, b.state


@pytest.fixture(scope="module")
def fp16_graph(tmp_path_factory):
    """The fp16 step graph of a tiny QRNN bundle (its state crosses the graph's boundary in fp16)."""
    model = random_model("qrnn", lookback=2)
    path = tmp_path_factory.mktemp("fp16") / "bundle"
    export_bundle(model, path, ExportOptions(precisions=("fp32", "fp16"), drift_frames=16, show_progress=False),
                  log=lambda m: None)
    return load_bundle(path).step_graph("fp16")


def test_an_fp16_graphs_state_is_carried_in_fp16_bound_or_not_and_loads_from_fp32_arrays(fp16_graph, step_graphs):
    _, frames = step_graphs
    plain, bound = OnnxRuntimeStep(fp16_graph), OnnxRuntimeStep(fp16_graph, io_binding=True)
    assert {t.dtype for t in plain.spec} == {"float16"}
    plain_emb, plain_state = stream(plain, frames)
    bound_emb, bound_state = stream(bound, frames)
    np.testing.assert_array_equal(bound_emb, plain_emb)
    assert plain_emb.dtype == np.float32  # the embedding leaves the graph in fp32 whatever runs inside
    for name, value in plain_state.items():
        assert value.dtype == bound_state[name].dtype == np.float16
        np.testing.assert_array_equal(bound_state[name], value)
    # A snapshot saved from an fp32 run (or written by hand) loads: its arrays take the graph's dtype.
    as_fp32 = {name: value.astype(np.float32) for name, value in plain_state.items()}
    reloaded = bound.state_to_numpy(bound.state_from_numpy(as_fp32))
    for name, value in plain_state.items():
        np.testing.assert_array_equal(reloaded[name], value)


def test_cuda_graphs_need_the_cuda_device_and_bound_buffers(step_graphs):
    paths, _ = step_graphs
    with pytest.raises(UserError, match="--ort-device cuda"):
        OnnxRuntimeStep(paths[1], cuda_graph=True)


# ONNX Runtime 1.31's words when it will not capture a graph (they no longer say "CUDA graph").
CAPTURE_REFUSAL = ("[ONNXRuntimeError] : 1 : FAIL : This session cannot use the graph capture feature as requested "
                   "by the user  as all compute graph nodes have not been partitioned to the CUDAExecutionProvider")


def test_a_refused_cuda_graph_capture_steps_uncaptured_with_a_one_line_warning(step_graphs):
    paths, _ = step_graphs
    made = []

    def make(capture: bool):
        made.append(capture)
        if capture:
            raise RuntimeError(CAPTURE_REFUSAL + "\nmore detail")
        return onnxruntime.InferenceSession(str(paths[1]), providers=["CPUExecutionProvider"])

    with pytest.warns(SetupWarning, match="refused CUDA graph capture") as caught:
        session, captured = session_with_capture_fallback(make, True, paths[1])
    assert made == [True, False] and captured is False and session.get_inputs()
    warning = str(caught[0].message)
    assert len(caught) == 1 and "\n" not in warning and "partitioned" in warning


def test_a_damaged_graph_is_named_whether_or_not_capture_was_asked(tmp_path, capsys):
    damaged = tmp_path / "step.fp32.onnx"
    damaged.write_bytes(b"not an onnx graph")

    def make(capture: bool):
        return onnxruntime.InferenceSession(str(damaged), providers=["CPUExecutionProvider"])

    for capture in (True, False):
        with pytest.raises(UserError, match="cannot load .*step.fp32.onnx.*re-export it"):
            session_with_capture_fallback(make, capture, damaged)
    assert "warning" not in capsys.readouterr().err  # no capture warning for a file that loads nowhere


def assert_same_stream(expected, got, tolerance: float) -> None:
    """Embeddings at every frame and every final state tensor agree within ``tolerance``."""
    (expected_emb, expected_state), (got_emb, got_state) = expected, got
    np.testing.assert_allclose(got_emb, expected_emb, atol=tolerance)
    for name, value in expected_state.items():
        np.testing.assert_allclose(got_state[name], value, atol=tolerance, rtol=tolerance)


@needs_cuda
def test_cuda_bound_step_equals_the_cpu_step_over_100_frames_with_state_carried(step_graphs):
    paths, frames = step_graphs
    frames = np.concatenate([frames] * 3)[:100]
    gpu = OnnxRuntimeStep(paths[1], device="cuda", cuda_graph=False)
    assert gpu.providers[0] == "CUDAExecutionProvider"
    assert_same_stream(stream(OnnxRuntimeStep(paths[1]), frames), stream(gpu, frames), FP32_ON_A_GPU)


@needs_cuda
def test_cuda_graph_replay_equals_the_uncaptured_bound_step(step_graphs):
    paths, frames = step_graphs
    captured = OnnxRuntimeStep(paths[1], device="cuda", cuda_graph=True)
    assert captured.cuda_graph, "the CUDA graph capture was refused for the lean step graph"
    plain = stream(OnnxRuntimeStep(paths[1], device="cuda", cuda_graph=False), frames)
    assert_same_stream(plain, stream(captured, frames), 1e-5)


@needs_cuda
def test_cuda_fp16_step_follows_the_cpu_fp32_step_over_100_frames_with_state_carried(fp16_graph, step_graphs):
    paths, frames = step_graphs
    frames = np.concatenate([frames] * 3)[:100]
    reference, _ = stream(OnnxRuntimeStep(fp16_graph.parent / "step.fp32.onnx"), frames)
    gpu = OnnxRuntimeStep(fp16_graph, device="cuda")
    assert gpu.cuda_graph, "the CUDA graph capture was refused for the fp16 step graph"
    assert_within_fp16_tolerance(stream(gpu, frames)[0], reference)


def assert_within_fp16_tolerance(got: np.ndarray, reference: np.ndarray) -> None:
    cosine = (got * reference).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(reference, axis=-1))
    assert cosine.min() >= VARIANT_TOLERANCES["fp16"]["min_cosine"]
    assert np.abs(got - reference).max() <= VARIANT_TOLERANCES["fp16"]["max_abs_embedding"]


@needs_cuda
@pytest.mark.parametrize("kind", ["none", "mlp", "st", "qrnn", "retnet"])
def test_every_kinds_fp16_step_is_captured_on_the_gpu_and_follows_the_cpu_fp32_step(kind, step_graphs, tmp_path):
    """Each adapter's GPU form (the ST adapter's update as one product, retention's gathers) runs on the CUDA
    provider alone, in a CUDA graph, over 40 frames with the state carried."""
    _, frames = step_graphs
    model, fp32, fp16 = random_model(kind), tmp_path / "step.fp32.onnx", tmp_path / "step.fp16.onnx"
    export_step_graph(model, fp32)
    export_step_graph(model, fp16, precision="fp16")
    reference, _ = stream(OnnxRuntimeStep(fp32), frames)
    gpu = OnnxRuntimeStep(fp16, device="cuda")
    assert gpu.cuda_graph, f"the CUDA graph capture was refused for the {kind} fp16 step graph"
    assert_within_fp16_tolerance(stream(gpu, frames)[0], reference)


@needs_cuda
def test_cuda_batch_of_four_with_an_idle_stream_and_a_reset(step_graphs):
    """The GPU's batch assembled in its page-locked upload buffer, as the detector assembles it."""
    paths, frames = step_graphs
    cpu, gpu = OnnxRuntimeStep(paths[4]), OnnxRuntimeStep(paths[4], device="cuda")
    pinned = frame_batch_buffer(gpu, (4, *frames.shape[1:]))
    assert pinned is gpu.frame_buffer
    # Page-locked with the CUDA runtime ONNX Runtime's CUDA provider loaded: else every upload is a pageable copy
    # (correct, slower), which only the bench's frame-upload line would show.
    assert gpu.buffers.pinned, "the frame upload buffer is not page-locked: no CUDA runtime could be loaded"
    state_c, state_g = cpu.initial_state(), gpu.initial_state()
    for t, frame in enumerate(frames):
        batch = np.repeat(frame[None], 4, axis=0)
        pinned[...] = batch
        if t == 20:
            state_c, state_g = cpu.reset_streams(state_c, [1]), gpu.reset_streams(state_g, [1])
        a, b = cpu.step(batch, state_c), gpu.step(pinned, state_g)
        np.testing.assert_allclose(b.embedding, a.embedding, atol=FP32_ON_A_GPU)
        idle = [3] if t % 4 == 0 else []
        state_c = cpu.keep_streams(a.state, state_c, idle) if idle else a.state
        state_g = gpu.keep_streams(b.state, state_g, idle) if idle else b.state


@pytest.mark.parametrize("kind", ["none", "mlp", "st", "qrnn", "retnet"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_step_graph_traced_off_the_cpu_runs_on_that_device_alone(kind, precision):
    """What the GPU bench traces on its GPU, run here on PyTorch's ``meta`` device (shapes and devices checked,
    no arithmetic): a tensor made on the CPU inside the step, or an input left there, fails as it would on a
    GPU. The caller's model stays on the CPU in fp32."""
    import torch

    from sdqes_edge.export.graphs import step_graph_trace

    model = random_model(kind, lookback=2)
    for query_count in (None, 3):
        module, args = step_graph_trace(model, 2, precision, query_count, "meta")
        outputs = module(*args)
        assert {t.device.type for t in (*args, *outputs)} == {"meta"}
        assert outputs[0].dtype == torch.float32 and outputs[0].shape == (2, model.cfg.embed_dim)
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("cpu", torch.float32)}


def _torch_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _torch_has_cuda(), reason="needs a CUDA build of torch and an NVIDIA GPU (the GPU bench "
                                                  "traces its step graphs there)")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_step_graph_traced_on_the_gpu_is_the_graph_traced_on_the_cpu(precision, step_graphs, tmp_path):
    import onnx

    model = random_model("qrnn", lookback=2)
    paths = {device: tmp_path / f"{device}.onnx" for device in ("cpu", "cuda")}
    for device, path in paths.items():
        export_step_graph(model, path, batch=4, precision=precision, trace_device=device)
    assert next(model.parameters()).device.type == "cpu"  # the caller's model stays where it was
    cpu, cuda = (onnx.load(str(p)) for p in paths.values())
    assert [n.op_type for n in cuda.graph.node] == [n.op_type for n in cpu.graph.node]
    assert [(i.name, list(i.dims)) for i in cuda.graph.initializer] == [(i.name, list(i.dims))
                                                                        for i in cpu.graph.initializer]
    _, frames = step_graphs
    runners = [OnnxRuntimeStep(p) for p in paths.values()]
    (want, want_state), (got, got_state) = (stream(r, frames[:8], batch=4) for r in runners)
    # Only constants folded on the GPU can differ (by rounding), so the fp32 bar is the exporter's own.
    tolerance = {"fp32": 1e-5, "fp16": VARIANT_TOLERANCES["fp16"]["max_abs_embedding"]}[precision]
    np.testing.assert_allclose(got, want, atol=tolerance)
    for name in want_state:
        np.testing.assert_allclose(got_state[name], want_state[name], rtol=tolerance, atol=tolerance, err_msg=name)
