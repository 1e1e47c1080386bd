"""sdqes-run's whole streaming loop, run here on its ONNX Runtime backend (TensorRT cannot run here): it alerts on a
video frame for frame as `sdqes-edge run` does (a bundle exported with --fuse-queries too), keeps each query's
alert state across a restart (--state), and on a live stream tells systemd it is ready and stops on SIGTERM with
143, its alert log complete."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import random_model
from runtime_fixtures import write_video

from sdqes_edge.cli import run
from sdqes_edge.export import ExportOptions, Query, export_bundle
from sdqes_edge.runtime.sinks import Sink
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores

QUERIES = (Query("When I start to clean the table, remind me to wash my hands.", "Wash your hands."),
           Query("Tell me when the kettle boils.", "Tea!"))
# What an alert line says besides its score, which the two runtimes compute apart (compared to 1e-5).
ALERT_FIELDS = ("query_id", "query", "message", "stream", "frame_index", "stream_time", "threshold", "label")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, str]:
    """One tiny QRNN model sampling at 5 fps, with two queries encoded into it (sdqes-run has no text encoder):
    "plain", and "fused" (exported with --fuse-queries: its step graph scores the queries itself)."""
    root = tmp_path_factory.mktemp("native-ort")
    for name in ("plain", "fused"):
        export_bundle(random_model("qrnn"), root / name, ExportOptions(show_progress=False, fps=5.0, verify_frames=16,
                                                                       queries=QUERIES, fuse_queries=name == "fused"),
                      log=lambda m: None)
    return {name: str(root / name) for name in ("plain", "fused")}


@pytest.fixture(scope="module")
def bundle(bundles) -> str:
    return bundles["plain"]


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> str:
    """15 s of the sample scene at 10 fps: 75 steps at the bundle's 5."""
    return str(write_video(tmp_path_factory.mktemp("native-video") / "kitchen.avi", sample_frames(150, 96, 128)))


def alerts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def python_alerts_at_a_busy_threshold(bundle: str, video: str, tmp_path: Path) -> tuple[str, list[dict]]:
    """A threshold the first query's score crosses again and again (its median over the video), and the alerts
    `sdqes-edge run` gives at it: a state carried wrong, or not at all, would move a crossing."""
    assert run(["run", bundle, "--source", video, "--scores", str(tmp_path / "scores"), "--quiet"]) == 0
    probs = np.asarray(load_scores(next((tmp_path / "scores").glob("*.npz"))).probs)
    threshold = f"{np.median(probs[:, 0]):.6f}"
    log = tmp_path / "python.jsonl"
    assert run(["run", bundle, "--source", video, "--threshold", threshold, "--events", str(log), "--quiet"]) == 0
    assert len(alerts(log)) >= 4, "the threshold is crossed too seldom to show anything"
    return threshold, alerts(log)


@pytest.mark.parametrize("kind", ["plain", "fused"])
def test_sdqes_run_on_onnx_runtime_alerts_frame_for_frame_as_sdqes_edge_run_does(sdqes_run_on_the_cpu, bundles, kind,
                                                                                 video, tmp_path):
    """At a threshold the first query's score crosses again and again (its median), a state carried wrong, or not
    at all, would move a crossing: every alert must fall on the same frame, with the same fields. A bundle exported
    with --fuse-queries is given its queries' embeddings with every frame and alerts on the graph's own cosines."""
    bundle = bundles[kind]
    threshold, python = python_alerts_at_a_busy_threshold(bundle, video, tmp_path)
    native_log = tmp_path / "native.jsonl"
    done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threshold", threshold,
                           "--events", str(native_log)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    fused_words = ", its queries scored inside the graph" if kind == "fused" else ""
    assert "(ONNX Runtime " in done.stderr and f"on the CPU, step.fp32.onnx{fused_words})" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "done: 75 frames"
    native = alerts(native_log)
    assert [[a[k] for k in ALERT_FIELDS] for a in native] == [[a[k] for k in ALERT_FIELDS] for a in python]
    largest = max(abs(a["score"] - b["score"]) for a, b in zip(native, python))
    print(f"\n{kind}: {len(native)} alerts over 75 frames at threshold {threshold}, on the same frames; scores "
          f"within {largest:.1e}")
    assert largest < 1e-5


def test_a_restarted_sdqes_run_keeps_each_querys_alert_count_with_state(sdqes_run_on_the_cpu, bundle, video,
                                                                        tmp_path):
    """A service restarted after a lost camera or a reboot gave a reminder asked once (--max-alerts 1) again."""
    log, state = tmp_path / "alerts.jsonl", tmp_path / "state.json"
    command = [str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threshold", "0.001", "--max-alerts", "1",
               "--events", str(log), "--state", str(state), "--max-frames", "10"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and f"no alert state at {state} yet" in first.stderr, first.stderr
    assert len(alerts(log)) == 2  # each query at its first frame
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert f"resumed the alert state of 2 of 2 queries from {state}" in second.stderr
    assert len(alerts(log)) == 2  # asked once, alerted once, across the restart
    assert [entry["count"] for entry in json.loads(state.read_text())["alerts"]] == [1, 1]


def test_sdqes_run_on_a_live_stream_tells_systemd_it_is_ready_and_stops_on_sigterm_with_its_log_complete(
        sdqes_run_on_the_cpu, bundle, endless_stream, tmp_path):
    address = f"@sdqes-notify-test-{os.getpid()}"  # abstract: a tmp path may pass the 108 bytes a socket name has
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind("\0" + address[1:])
        systemd.settimeout(120)
        log = tmp_path / "alerts.jsonl"
        service = subprocess.Popen([str(sdqes_run_on_the_cpu), bundle, "--source", endless_stream, "--threshold",
                                    "0.001", "--events", str(log)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True, env={**os.environ, "NOTIFY_SOCKET": address})
        try:
            ready = systemd.recv(4096).decode()
            assert ready.startswith("READY=1\nSTATUS=streaming 127.0.0.1-"), ready
            deadline = time.monotonic() + 60
            while (not log.exists() or len(log.read_text().splitlines()) < 2) and time.monotonic() < deadline:
                time.sleep(0.05)
            service.send_signal(signal.SIGTERM)
            assert service.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            service.kill()
        said = service.stderr.read()
        systemd.settimeout(1)
        told = []
        while True:
            try:
                told.append(systemd.recv(4096).decode())
            except socket.timeout:  # TimeoutError from Python 3.10 on
                break
    assert "; Ctrl-C to stop" in said and "sdqes-run: interrupted (SIGTERM) after " in said, said
    assert told and told[-1].startswith("STOPPING=1\nSTATUS=stopping after "), told
    assert [a["message"] for a in alerts(log)] == ["Wash your hands.", "Tea!"]  # whole lines, each query once


class CApi:
    """libsdqes.so through ctypes, as another language binds it: each function given its C signature."""

    def __init__(self, library: Path):
        import ctypes
        from ctypes import POINTER, c_char_p, c_float, c_int, c_size_t, c_uint8, c_void_p

        self.ctypes, self.lib = ctypes, ctypes.CDLL(str(library))
        error = [c_char_p, c_size_t]
        for name, result, arguments in (
                ("sdqes_bundle_open", c_void_p, [c_char_p, *error]),
                ("sdqes_bundle_close", None, [c_void_p]),
                ("sdqes_bundle_image_size", c_int, [c_void_p]),
                ("sdqes_bundle_query_count", c_int, [c_void_p]),
                ("sdqes_bundle_query_text", c_char_p, [c_void_p, c_int]),
                ("sdqes_preprocess", c_int, [c_void_p, POINTER(c_uint8), c_int, c_int, POINTER(c_float), *error]),
                ("sdqes_step_open", c_void_p, [c_void_p, c_char_p, c_char_p, c_int, *error]),
                ("sdqes_step_run", c_int, [c_void_p, POINTER(c_float), POINTER(c_float), *error]),
                ("sdqes_step_reset", c_int, [c_void_p]),
                ("sdqes_step_streams", c_int, [c_void_p]),
                ("sdqes_step_run_streams", c_int, [c_void_p, POINTER(POINTER(c_float)), POINTER(c_float), *error]),
                ("sdqes_step_reset_stream", c_int, [c_void_p, c_int, *error]),
                ("sdqes_step_description", c_char_p, [c_void_p]),
                ("sdqes_step_close", None, [c_void_p])):
            function = getattr(self.lib, name)
            function.restype, function.argtypes = result, arguments
        self.error = ctypes.create_string_buffer(512)

    def __getattr__(self, name: str):
        return getattr(self.lib, f"sdqes_{name}")

    def floats(self, array: np.ndarray):
        return array.ctypes.data_as(self.ctypes.POINTER(self.ctypes.c_float))

    def said(self) -> str:
        return self.error.value.decode()

    def frame_pointers(self, frames: list[np.ndarray | None]):
        """A C array of float pointers, NULL for None."""
        pointer = self.ctypes.POINTER(self.ctypes.c_float)
        return (pointer * len(frames))(*(pointer() if f is None else self.floats(f) for f in frames))


@pytest.mark.parametrize("kind", ["plain", "fused"])
def test_the_c_api_steps_a_bundle_to_the_probabilities_sdqes_edge_run_gives_every_frame(sdqes_run_on_the_cpu, bundles,
                                                                                        kind, video, tmp_path):
    """A C caller (ROS 2, Rust, Go) runs its own loop: sdqes_preprocess, sdqes_step_run with the state carried, the
    probabilities it gives into sdqes_alert_update. Over 75 frames, every query's probability at every frame is
    `sdqes-edge run`'s, and a reset starts the stream again."""
    from sdqes_edge.runtime.sources import VideoFileSource

    assert run(["run", bundles[kind], "--source", video, "--scores", str(tmp_path / "scores"), "--quiet"]) == 0
    expected = np.asarray(load_scores(next((tmp_path / "scores").glob("*.npz"))).probs)
    api = CApi(sdqes_run_on_the_cpu.parent / "libsdqes.so")
    bundle = api.bundle_open(bundles[kind].encode(), api.error, len(api.error))
    assert bundle, api.said()
    assert [api.bundle_query_text(bundle, q).decode() for q in range(api.bundle_query_count(bundle))] == \
        [query.text for query in QUERIES]
    step = api.step_open(bundle, b"onnxruntime", None, 1, api.error, len(api.error))
    assert step, api.said()
    fused_words = ", its queries scored inside the graph" if kind == "fused" else ""
    assert api.step_description(step).decode().endswith(f"on the CPU, step.fp32.onnx{fused_words}")
    size = api.bundle_image_size(bundle)
    frames, probabilities = [], np.empty(len(QUERIES), np.float32)
    got = []
    for sampled in VideoFileSource(video, 5.0).sampled():
        image, frame = np.ascontiguousarray(sampled.image), np.empty((3, size, size), np.float32)
        assert api.preprocess(bundle, image.ctypes.data_as(api.ctypes.POINTER(api.ctypes.c_uint8)), image.shape[0],
                              image.shape[1], api.floats(frame), api.error, len(api.error)) == 0, api.said()
        assert api.step_run(step, api.floats(frame), api.floats(probabilities), api.error, len(api.error)) == 0
        frames.append(frame)
        got.append(probabilities.copy())
    got = np.asarray(got)
    assert got.shape == expected.shape == (75, len(QUERIES))
    print(f"\n{kind}: C API probabilities over 75 frames within {np.abs(got - expected).max():.1e} of sdqes-edge "
          "run's")
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    api.bundle_close(bundle)  # the step keeps what it needs of it
    assert api.step_reset(step) == 0  # a new stream: the first frames' probabilities again
    for frame, before in zip(frames[:3], got):
        assert api.step_run(step, api.floats(frame), api.floats(probabilities), api.error, len(api.error)) == 0
        np.testing.assert_array_equal(probabilities, before)
    api.step_close(step)


STREAMS = 3


def three_streams(frames: int, t: int) -> list[int | None]:
    """Which sampled frame each of three cameras gives at step t, None where it gives none: stream 0 the video in
    order, stream 1 backwards and idle every third step, stream 2 from a third of the way in and idle for ten steps
    on end; at step 40 none gives a frame."""
    if t == 40:
        return [None] * STREAMS
    return [t % frames, None if t % 3 == 1 else frames - 1 - t % frames,
            None if 10 <= t < 20 else (t + frames // 3) % frames]


class StreamProbabilities(Sink):
    def __init__(self):
        self.got: dict[int, list[float]] = {}

    def on_frame(self, stream, frame_bgr, time_s, probs, events):
        self.got[stream] = list(probs.values())


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_the_c_api_steps_several_streams_at_once_each_with_its_own_state_as_the_python_runtime_does(
        sdqes_run_on_the_cpu, video, fused, tmp_path):
    """Three cameras through one graph exported with --batch 3: sdqes_step_run_streams takes a frame per stream,
    NULL where a camera has none (its state kept), and sdqes_step_reset_stream starts one stream again. Over 60
    steps every stream's probabilities are those the Python runtime's StreamingDetector gives it stepping the same
    frames (None for an idle stream, reset(0) at step 30), and an idle stream's row is NaN."""
    from sdqes_edge.runtime import Frame, StreamingDetector
    from sdqes_edge.runtime.sources import VideoFileSource

    bundle = tmp_path / "three-cameras"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(show_progress=False, fps=5.0, verify_frames=16,
                                                              batch=STREAMS, queries=QUERIES, fuse_queries=fused),
                  log=lambda m: None)
    images = [np.ascontiguousarray(frame.image) for frame in VideoFileSource(video, 5.0).sampled()]
    detector = StreamingDetector(bundle)
    for query in QUERIES:
        detector.add_query(query.text, query.response)
    python = detector.add_sink(StreamProbabilities())
    api = CApi(sdqes_run_on_the_cpu.parent / "libsdqes.so")
    opened = api.bundle_open(str(bundle).encode(), api.error, len(api.error))
    step = api.step_open(opened, b"onnxruntime", None, 1, api.error, len(api.error))
    assert step, api.said()
    assert api.step_streams(step) == STREAMS
    size = api.bundle_image_size(opened)
    inputs = []
    for image in images:  # each sampled frame preprocessed as a C caller does
        inputs.append(np.empty((3, size, size), np.float32))
        assert api.preprocess(opened, image.ctypes.data_as(api.ctypes.POINTER(api.ctypes.c_uint8)), image.shape[0],
                              image.shape[1], api.floats(inputs[-1]), api.error, len(api.error)) == 0, api.said()
    probabilities = np.empty((STREAMS, len(QUERIES)), np.float32)
    counts, worst = [0] * STREAMS, 0.0
    for t in range(60):
        if t == 30:  # camera 0 sees a new scene
            assert api.step_reset_stream(step, 0, api.error, len(api.error)) == 0, api.said()
            detector.reset(0)
            counts[0] = 0
        picked = three_streams(len(images), t)
        frames = [None if i is None else Frame(image=images[i], time=counts[s] / 5.0, index=counts[s])
                  for s, i in enumerate(picked)]
        counts = [c + (i is not None) for c, i in zip(counts, picked)]
        python.got.clear()
        detector.step(frames)
        assert api.step_run_streams(step, api.frame_pointers([None if i is None else inputs[i] for i in picked]),
                                    api.floats(probabilities), api.error, len(api.error)) == 0, api.said()
        for s, i in enumerate(picked):
            if i is None:
                assert np.isnan(probabilities[s]).all() and s not in python.got
            else:
                np.testing.assert_allclose(probabilities[s], python.got[s], rtol=0, atol=1e-5)
                worst = max(worst, float(np.abs(probabilities[s] - python.got[s]).max()))
    print(f"\n{'fused' if fused else 'plain'}: 3 streams over 60 steps, idle ones and a reset among them: within "
          f"{worst:.1e} of the Python runtime's")
    for bad, said in ((3, "stream 3 is out of range: the step graph steps 3 streams, 0 to 2"),
                      (-1, "stream -1 is out of range")):
        assert api.step_reset_stream(step, bad, api.error, len(api.error)) == 1 and said in api.said()
    assert api.step_run_streams(step, None, api.floats(probabilities), api.error, len(api.error)) == 1
    assert api.said().startswith("frames is NULL; give sdqes_step_run_streams")
    api.step_close(step)
    api.bundle_close(opened)


def test_the_c_api_refuses_what_it_cannot_step_in_one_line_and_returns_null(sdqes_run_on_the_cpu, bundle):
    api = CApi(sdqes_run_on_the_cpu.parent / "libsdqes.so")
    opened = api.bundle_open(bundle.encode(), api.error, len(api.error))
    for arguments, said in (
            ((None, b"onnxruntime", None, 0), "bundle is NULL; give sdqes_step_open the bundle sdqes_bundle_open"),
            ((opened, b"cuda", None, 0), "backend cuda is not one of tensorrt, onnxruntime"),
            ((opened, b"onnxruntime", b"int8", 0), "has no int8 step graph; re-export with --precision int8"),
            ((opened, b"onnxruntime", None, -1), "threads is -1; give 0 (one per core) or more")):
        assert api.step_open(*arguments, api.error, len(api.error)) is None
        assert said in api.said() and "\n" not in api.said(), api.said()
    frame, probabilities = np.zeros((3, 64, 64), np.float32), np.zeros(2, np.float32)
    assert api.step_run(None, api.floats(frame), api.floats(probabilities), api.error, len(api.error)) == 1
    assert api.said().startswith("step is NULL") and api.step_reset(None) == -1
    assert api.bundle_query_text(opened, 2) is None and api.bundle_query_text(None, 0) is None
    api.bundle_close(opened)


def test_the_c_example_streams_raw_frames_and_alerts_as_sdqes_edge_run_does(sdqes_run_on_the_cpu, bundle, video,
                                                                            tmp_path):
    """native/examples/stream_frames.c, a C99 caller of libsdqes, fed the video's sampled frames raw on stdin (as
    `ffmpeg -vf fps=5 -f rawvideo -pix_fmt bgr24 -` gives them): its alerts fall on `sdqes-edge run`'s frames, for
    the same queries, with their messages and scores."""
    from sdqes_edge.runtime.sources import VideoFileSource

    threshold, python = python_alerts_at_a_busy_threshold(bundle, video, tmp_path)
    images = [np.ascontiguousarray(frame.image) for frame in VideoFileSource(video, 5.0).sampled()]
    height, width = images[0].shape[:2]
    done = subprocess.run([str(sdqes_run_on_the_cpu.parent / "sdqes-stream-frames"), bundle, str(width), str(height),
                           threshold, "onnxruntime"], input=b"".join(image.tobytes() for image in images),
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr.decode().splitlines()[-1] == f"sdqes-stream-frames: done: {len(images)} frames"
    native = [line.split(" ", 3) for line in done.stdout.decode().splitlines()]
    assert [(float(t), QUERIES[int(q)].text, message) for t, q, _, message in native] == \
        [(round(a["stream_time"], 3), a["query"], a["message"]) for a in python]  # printed to the millisecond
    assert max(abs(float(p) - a["score"]) for (_, _, p, _), a in zip(native, python)) < 1e-5
