"""Several streams in one step: each stream's rows of the state are its own. An idle stream keeps them, a reset
one starts afresh, and the others never notice (plain and bound steps, and the detector with its alerts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import random_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_fixtures import FPS, QUERY, STEP_GRAPH_FRAMES, write_video

from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.runtime.bound_step import RowCopier, cuda_runtime, loaded_library_paths, stream_runs
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.sinks import ScoreTraceRecorder
from sdqes_edge.runtime.sources import VideoFileSource, open_source
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores


@pytest.mark.parametrize("rows_via", ["device", "host"])
@pytest.mark.parametrize("idle_streams", [[2], [3, 0, 1]], ids=["one", "three"])
def test_idle_streams_of_four_keep_their_state_on_the_bound_path(step_graphs, idle_streams, rows_via):
    """Where the buffers live, only the idle rows are copied: the state is never read back to the host. (Where
    no CUDA runtime can be loaded, the rows go through the host instead.)"""
    paths, frames = step_graphs
    plain, bound = OnnxRuntimeStep(paths[4]), OnnxRuntimeStep(paths[4], io_binding=True)
    if rows_via == "host":
        bound.buffers.row_copier = None
    else:
        bound.buffers.read = None  # reading the whole state back would fail
    state_p, state_b = plain.initial_state(), bound.initial_state()
    for t, frame in enumerate(frames[:12]):
        batch = np.repeat(frame[None], 4, axis=0)
        a, b = plain.step(batch, state_p), bound.step(batch, state_b)
        np.testing.assert_array_equal(a.embedding, b.embedding)
        idle = idle_streams if t % 3 == 0 else []  # these streams see no frame every third step
        state_p = plain.keep_streams(a.state, state_p, idle) if idle else a.state
        state_b = bound.keep_streams(b.state, state_b, idle) if idle else b.state
    vars(bound.buffers).pop("read", None)
    final_p, final_b = plain.state_to_numpy(state_p), bound.state_to_numpy(state_b)
    busy = min(set(range(4)) - set(idle_streams))
    for name in final_p:
        np.testing.assert_array_equal(final_b[name], final_p[name])
        if name.endswith("_h"):  # the recurrence remembers the frames the idle streams did not see
            assert not np.array_equal(final_p[name][idle_streams[0]], final_p[name][busy])


def test_streams_to_copy_are_grouped_into_runs_of_adjacent_streams():
    assert stream_runs([2]) == [(2, 1)]
    assert stream_runs([5, 1, 2]) == [(1, 2), (5, 1)]
    assert stream_runs([3, 0, 1, 2]) == [(0, 4)]
    assert stream_runs([1, 1, 3]) == [(1, 1), (3, 1)]
    assert stream_runs([]) == []


@pytest.mark.parametrize("io_binding", [False, True], ids=["plain", "bound"])
def test_resetting_one_stream_of_four_makes_it_a_fresh_stream_and_leaves_the_others_alone(step_graphs, io_binding):
    paths, frames = step_graphs

    def scene(t):  # each stream its own scene: stream i is i frames ahead
        return np.stack([frames[(t + i) % STEP_GRAPH_FRAMES] for i in range(4)])

    kept, reset, fresh = (OnnxRuntimeStep(paths[4], io_binding=io_binding) for _ in range(3))
    states = {runner: runner.initial_state() for runner in (kept, reset)}
    for t in range(10):
        for runner in states:
            states[runner] = runner.step(scene(t), states[runner]).state
    states[reset] = reset.reset_streams(states[reset], [1])
    states[fresh] = fresh.initial_state()  # starts where stream 1 was reset
    out = {runner: [] for runner in states}
    for t in range(10, 25):
        for runner in states:
            result = runner.step(scene(t), states[runner])
            out[runner].append(result.embedding)
            states[runner] = result.state
    got, unreset, new = (np.stack(out[r]) for r in (reset, kept, fresh))
    final = {r: r.state_to_numpy(states[r]) for r in states}
    others = [0, 2, 3]
    np.testing.assert_allclose(got[:, 1], new[:, 1], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got[:, others], unreset[:, others], rtol=0, atol=1e-6)
    for name in final[reset]:
        np.testing.assert_allclose(final[reset][name][1], final[fresh][name][1], rtol=0, atol=1e-6)
        np.testing.assert_allclose(final[reset][name][others], final[kept][name][others], rtol=0, atol=1e-6)
    assert np.abs(got[:, 1] - unreset[:, 1]).max() > 1e-3  # the forgotten past mattered



STREAMS = 4
some_streams = st.sets(st.integers(0, STREAMS - 1), min_size=1, max_size=STREAMS)
stream_operations = st.lists(st.one_of(
    st.tuples(st.just("step"), st.sets(st.integers(0, STREAMS - 1), max_size=STREAMS - 1)),  # the idle streams
    st.tuples(st.just("reset"), some_streams),
    st.tuples(st.just("snapshot"), st.just(None)),  # the state saved to the host and loaded back
), min_size=1, max_size=14)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=stream_operations)
def test_four_streams_in_one_step_are_four_single_streams_whatever_idles_resets_and_snapshots_come(
        step_graphs, operations):
    """Each stream of a 4-stream step behaves as that stream stepped alone (a 1-stream graph, frames only when it
    is busy, reset when it is reset), on the plain and the bound path alike; the bound path equals the plain one
    bit for bit, state included."""
    paths, frames = step_graphs
    runners = {"plain": OnnxRuntimeStep(paths[STREAMS]), "bound": OnnxRuntimeStep(paths[STREAMS], io_binding=True)}
    alone = OnnxRuntimeStep(paths[1])
    states = {kind: runner.initial_state() for kind, runner in runners.items()}
    alone_states = [alone.initial_state() for _ in range(STREAMS)]
    for t, (operation, streams) in enumerate(operations):
        if operation == "reset":
            states = {kind: runners[kind].reset_streams(states[kind], sorted(streams)) for kind in runners}
            alone_states = [alone.initial_state() if i in streams else s for i, s in enumerate(alone_states)]
            continue
        if operation == "snapshot":
            states = {kind: r.state_from_numpy(r.state_to_numpy(states[kind])) for kind, r in runners.items()}
            continue
        batch = np.stack([frames[(t + 3 * i) % STEP_GRAPH_FRAMES] for i in range(STREAMS)])  # a scene per stream
        busy = [i for i in range(STREAMS) if i not in streams]
        results = {kind: r.step(batch, states[kind]) for kind, r in runners.items()}
        np.testing.assert_array_equal(results["bound"].embedding, results["plain"].embedding)
        for i in busy:
            single = alone.step(batch[i:i + 1], alone_states[i])
            alone_states[i] = single.state
            np.testing.assert_allclose(results["plain"].embedding[i], single.embedding[0], rtol=0, atol=1e-5)
        states = {kind: runners[kind].keep_streams(results[kind].state, states[kind], sorted(streams))
                  if streams else results[kind].state for kind in runners}
    final = {kind: r.state_to_numpy(states[kind]) for kind, r in runners.items()}
    for name in final["plain"]:
        np.testing.assert_array_equal(final["bound"][name], final["plain"][name])
        for i in range(STREAMS):
            expected = alone.state_to_numpy(alone_states[i])[name][0]
            np.testing.assert_allclose(final["plain"][name][i], expected, rtol=0, atol=1e-5)


def test_a_gpus_row_copies_go_through_the_cuda_runtime_and_fail_in_its_own_words():
    if cuda_runtime() is None:
        pytest.skip("no CUDA runtime library (libcudart) on this machine")
    rows, copied = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)  # 4 streams of 2 values
    copier = RowCopier.for_device("cuda")
    try:
        copier.copy(copied.ctypes.data, rows.ctypes.data, 2 * rows.itemsize, [1, 3])
        copier.finish()
    except RuntimeError as exc:  # a CUDA runtime but no usable GPU (no driver): the runtime says why
        assert str(exc).startswith("cudaMemcpy failed: ")
        return
    np.testing.assert_array_equal(copied, [0, 0, 2, 3, 0, 0, 6, 7])  # with a GPU: host memory is addressable too


def test_the_libraries_this_process_has_mapped_are_found_by_file_name():
    if not Path("/proc/self/maps").is_file():
        pytest.skip("no /proc/self/maps (not Linux): the CUDA runtime is then found by a library search alone")
    import onnxruntime.capi.onnxruntime_pybind11_state as ort_native

    assert Path(ort_native.__file__).resolve() in {Path(p).resolve() for p in loaded_library_paths("onnxruntime")}
    assert loaded_library_paths("no-such-library") == []

def test_one_step_serves_two_streams_as_two_single_stream_runs_would(tmp_path):
    model = random_model("st")
    single, double = tmp_path / "b1", tmp_path / "b2"
    export_bundle(model, single, ExportOptions(fps=FPS, show_progress=False), log=lambda m: None)
    export_bundle(model, double, ExportOptions(fps=FPS, batch=2, show_progress=False), log=lambda m: None)
    videos = [write_video(tmp_path / "a.avi", sample_frames(40, 120, 160, seed=1)),
              write_video(tmp_path / "b.avi", sample_frames(60, 120, 160, seed=2))]  # different lengths

    def scores(bundle, sources, stream=0):
        detector = StreamingDetector(bundle)
        detector.add_query(QUERY)
        detector.add_sink(ScoreTraceRecorder(tmp_path / f"{bundle.name}-{stream}.npz", "s", FPS, stream=stream))
        list(detector.run(sources))
        return load_scores(tmp_path / f"{bundle.name}-{stream}.npz").probs[:, 0]

    together = [scores(double, [open_source(str(v), FPS) for v in videos], stream=i) for i in range(2)]
    alone = [scores(single, [open_source(str(v), FPS)]) for v in videos]
    for a, b in zip(together, alone):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert together[0].shape == (20,) and together[1].shape == (30,)  # the shorter stream idles, keeping state


def test_resetting_one_stream_forgets_its_past_and_rearms_its_alerts_alone(tmp_path):
    model = random_model("qrnn")
    bundle = tmp_path / "b2"
    export_bundle(model, bundle, ExportOptions(fps=FPS, batch=2, show_progress=False), log=lambda m: None)
    frames = list(VideoFileSource(write_video(tmp_path / "c.avi", sample_frames(30, 120, 160)), FPS).sampled())
    detector, fresh = StreamingDetector(bundle), StreamingDetector(bundle)
    for d in (detector, fresh):
        d.add_query(QUERY, threshold=1e-6)  # always above: one alert per stream, on its first frame
    assert [len(e) for e in detector.step([frames[0], frames[0]])] == [1, 1]
    for frame in frames[1:8]:
        assert detector.step([frame, frame]) == [[], []]
    detector.reset(stream=1)
    events = detector.step([frames[8], frames[8]])
    assert [len(e) for e in events] == [0, 1], "only the reset stream is re-armed"
    fresh.step([frames[8], frames[8]])
    np.testing.assert_allclose(detector.last_embeddings[1], fresh.last_embeddings[1], rtol=0, atol=1e-6)
    assert np.abs(detector.last_embeddings[0] - fresh.last_embeddings[0]).max() > 1e-3  # stream 0 kept its past


def test_run_with_two_sources_of_one_name_writes_a_trace_and_an_annotated_video_for_each(tmp_path, capsys):
    """Two videos named clip.avi (in two folders) wrote one score trace over the other, and --annotate showed
    only the first source: now the second is called clip-2 and every source gets its own outputs."""
    import cv2

    from sdqes_edge.cli import run

    bundle = tmp_path / "b2"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(fps=FPS, batch=2, show_progress=False),
                  log=lambda m: None)
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    videos = [write_video(tmp_path / "x" / "clip.avi", sample_frames(40, 120, 160, seed=1)),
              write_video(tmp_path / "y" / "clip.avi", sample_frames(60, 120, 160, seed=2))]
    out = tmp_path / "out"
    assert run(["run", str(bundle), "--source", str(videos[0]), "--source", str(videos[1]), "--query", QUERY,
                "--scores", str(out / "scores"), "--annotate", str(out / "annotated.avi"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "note: several sources have the same name; in alerts and outputs they are called clip, clip-2" in err
    assert [load_scores(out / "scores" / f"{name}.npz").probs.shape[0] for name in ("clip", "clip-2")] == [20, 30]
    frame_counts = [int(cv2.VideoCapture(str(out / f"annotated.{name}.avi")).get(cv2.CAP_PROP_FRAME_COUNT))
                    for name in ("clip", "clip-2")]
    assert frame_counts == [20, 30]
    assert sorted(p.name for p in out.iterdir()) == ["annotated.clip-2.avi", "annotated.clip.avi", "scores"]
    # --scores FILE.npz: one file beside it for each source, as --annotate names its videos (it was a folder
    # called trace.npz)
    assert run(["run", str(bundle), "--source", str(videos[0]), "--source", str(videos[1]), "--query", QUERY,
                "--scores", str(out / "trace.npz"), "--quiet"]) == 0
    assert [load_scores(out / f"trace.{name}.npz").probs.shape[0] for name in ("clip", "clip-2")] == [20, 30]
    assert not (out / "trace.npz").exists()
