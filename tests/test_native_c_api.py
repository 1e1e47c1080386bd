"""The C API (libsdqes.so, native/include/sdqes/sdqes.h) through ctypes, as another language binds it, on the ONNX
Runtime backend: each query's probability at every frame as `sdqes-edge run` gives it, several streams in one graph
as the Python runtime steps them, threads sharing a step, refusals in one line, and the C99 example's alerts."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from native_fixtures import QUERIES, STREAMS, CApi, preprocessed, python_alerts_at_a_busy_threshold

from sdqes_edge.cli import run
from sdqes_edge.runtime.sinks import Sink
from sdqes_edge.traces import load_scores


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


def test_an_rgb_frame_given_to_sdqes_preprocess_rgb_becomes_the_floats_python_makes_of_it(sdqes_run_on_the_cpu,
                                                                                          bundle, video):
    """A ROS 2 node's rgb8 image: sdqes_preprocess_rgb gives the floats of its BGR twin, as Python's
    preprocess(image, channels='rgb') does (within the two runtimes' 1e-6)."""
    from sdqes_edge.runtime import StreamingDetector
    from sdqes_edge.runtime.sources import VideoFileSource

    api = CApi(sdqes_run_on_the_cpu.parent / "libsdqes.so")
    handle = api.bundle_open(bundle.encode(), api.error, len(api.error))
    assert handle, api.said()
    size, preprocess = api.bundle_image_size(handle), StreamingDetector(bundle).preprocess
    for sampled in list(VideoFileSource(video, 5.0).sampled())[:3]:
        rgb, from_rgb = np.ascontiguousarray(sampled.image[:, :, ::-1]), np.empty((3, size, size), np.float32)
        assert api.preprocess_rgb(handle, rgb.ctypes.data_as(api.ctypes.POINTER(api.ctypes.c_uint8)), rgb.shape[0],
                                  rgb.shape[1], api.floats(from_rgb), api.error, len(api.error)) == 0, api.said()
        np.testing.assert_array_equal(from_rgb, preprocessed(api, handle, [np.ascontiguousarray(sampled.image)])[0])
        np.testing.assert_allclose(from_rgb, preprocess(rgb, channels="rgb"), rtol=0, atol=1e-6)
    api.bundle_close(handle)


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
        sdqes_run_on_the_cpu, three_camera_bundles, video, fused):
    """Three cameras through one graph exported with --batch 3: sdqes_step_run_streams takes a frame per stream,
    NULL where a camera has none (its state kept), and sdqes_step_reset_stream starts one stream again. Over 60
    steps every stream's probabilities are those the Python runtime's StreamingDetector gives it stepping the same
    frames (None for an idle stream, reset(0) at step 30), and an idle stream's row is NaN."""
    from sdqes_edge.runtime import Frame, StreamingDetector
    from sdqes_edge.runtime.sources import VideoFileSource

    bundle = three_camera_bundles["fused" if fused else "plain"]
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
    inputs = preprocessed(api, opened, images)
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


def test_threads_that_share_a_step_one_camera_each_get_what_each_camera_alone_gets(sdqes_run_on_the_cpu,
                                                                                     three_camera_bundles, video):
    """A ROS 2 node's callbacks, one per camera, call sdqes_step_run_streams on one step at once, each with its own
    camera's frame and NULL for the others: each call runs whole, so each stream's probabilities are those it gets
    stepped alone, frame for frame, however the calls interleave."""
    import threading

    from sdqes_edge.runtime.sources import VideoFileSource

    api = CApi(sdqes_run_on_the_cpu.parent / "libsdqes.so")
    opened = api.bundle_open(str(three_camera_bundles["plain"]).encode(), api.error, len(api.error))
    frames = preprocessed(api, opened, [np.ascontiguousarray(f.image) for f in VideoFileSource(video, 5.0).sampled()])
    steps = 40

    def camera(step, stream: int, got: list, said: list) -> None:
        error = api.ctypes.create_string_buffer(512)  # each thread its own
        probabilities = np.empty((STREAMS, len(QUERIES)), np.float32)
        for t in range(steps):
            batch = [None] * STREAMS
            batch[stream] = frames[(t + 25 * stream) % len(frames)]
            if api.step_run_streams(step, api.frame_pointers(batch), api.floats(probabilities), error, 512) != 0:
                said.append(error.value.decode())
                return
            got.append(probabilities[stream].copy())

    alone = []
    for stream in range(STREAMS):  # the reference: one camera at a time, on a step of its own
        step = api.step_open(opened, b"onnxruntime", None, 1, api.error, len(api.error))
        alone.append([])
        camera(step, stream, alone[-1], [])
        api.step_close(step)
    shared = api.step_open(opened, b"onnxruntime", None, 1, api.error, len(api.error))
    got, said = [[] for _ in range(STREAMS)], []
    threads = [threading.Thread(target=camera, args=(shared, s, got[s], said)) for s in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert said == []
    for stream in range(STREAMS):
        np.testing.assert_allclose(np.asarray(got[stream]), np.asarray(alone[stream]), rtol=0, atol=1e-6)
    api.step_close(shared)
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


def test_a_c_caller_stepping_every_camera_frame_is_told_once_as_the_python_runtime_tells_it(native_build, bundle,
                                                                                             capfd):
    """A ROS 2 node that gives sdqes_alert_update each image's stamp from a 30-fps camera, into a model trained at
    5 fps: each query's alert finds it at the frame where Python's detector warns, in the same words, and stderr
    gets it once, not once per query."""
    import warnings

    from sdqes_edge.runtime import Frame, FrameRateWarning, StreamingDetector

    times = [k / 30 for k in range(40)]
    detector = StreamingDetector(bundle)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FrameRateWarning)
        for index, time in enumerate(times):
            detector.step([Frame(image=np.zeros((48, 64, 3), np.uint8), time=time, index=index)])
    python_words = str(caught[0].message).removeprefix("stream0: ").split(";")[0]
    api = CApi(native_build / "libsdqes.so")
    handle = api.bundle_open(bundle.encode(), api.error, len(api.error))
    alerts = [api.alert_for_label(handle, None, api.error, len(api.error)) for _ in QUERIES]
    assert all(alerts), api.said()
    capfd.readouterr()
    found_at = {}
    for index, time in enumerate(times):
        for q, alert in enumerate(alerts):
            assert api.alert_update(alert, 0.5, time) == 0
            if api.alert_pace_problem(alert) and q not in found_at:
                found_at[q] = index
    assert found_at == {q: 8 for q in range(len(QUERIES))}
    said = [api.alert_pace_problem(alert).decode() for alert in alerts]
    assert all(words.split(";")[0] == python_words for words in said), (said, python_words)
    assert capfd.readouterr().err.splitlines() == [f"sdqes: warning: {said[0]}"]
    for alert in alerts:
        api.alert_free(alert)
    api.bundle_close(handle)


def test_an_alert_whose_threshold_no_score_reaches_is_made_and_said_once_as_sdqes_edge_run_says_it(native_build,
                                                                                                    capfd):
    """p = sigmoid(cos) lies in [0.2689, 0.7311]: sdqes_alert_new(0.9, ...) never alerted, and said nothing."""
    from sdqes_edge.runtime.alerts import never_reached_words

    api = CApi(native_build / "libsdqes.so")
    capfd.readouterr()
    made = [api.alert_new(threshold, -1.0, 0.0, 0, api.error, len(api.error)) for threshold in (0.9, 0.6, 0.9)]
    assert all(made), api.said()
    assert capfd.readouterr().err.splitlines() == [f"sdqes: warning: sdqes_alert_new: the threshold 0.9 "
                                                   f"{never_reached_words(0.9, 'it')}"]
    assert api.alert_update(made[0], 0.7310, 0.0) == 0  # made all the same: the caller's choice
    for alert in made:
        api.alert_free(alert)


def test_a_program_takes_the_librarys_warnings_into_its_own_log_each_once_and_stderr_again_when_it_lets_go(
        native_build, capfd):
    """A ROS 2 node logs through RCLCPP_WARN, a service through journald: sdqes_set_warning_handler hands it each
    warning's text (and its user data), once, from whichever thread found it, nothing of it on stderr; a handler
    that calls the library, which warns again, gets that warning too (it is called outside the library's lock);
    NULL gives stderr back."""
    import ctypes
    import threading

    from sdqes_edge.runtime.alerts import never_reached_words

    api = CApi(native_build / "libsdqes.so")
    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p)
    api.lib.sdqes_set_warning_handler.restype = None
    api.lib.sdqes_set_warning_handler.argtypes = [handler_type, ctypes.c_void_p]
    logged: list[tuple[str, int]] = []
    made = []

    def log(warning: bytes, user_data: int) -> None:
        logged.append((warning.decode(), user_data))
        if len(logged) == 1:  # the node's logger making another alert, as a callback might
            made.append(api.alert_new(0.96, -1.0, 0.0, 0, api.error, len(api.error)))

    handler = handler_type(log)  # kept alive while the library holds it
    capfd.readouterr()
    api.lib.sdqes_set_warning_handler(handler, 42)
    try:
        def make_alert() -> None:
            made.append(api.alert_new(0.95, -1.0, 0.0, 0, api.error, len(api.error)))

        threads = [threading.Thread(target=make_alert, daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)  # none waits on the handler's own warning
    finally:
        api.lib.sdqes_set_warning_handler(handler_type(), None)
    assert logged == [(f"sdqes_alert_new: the threshold {t} {never_reached_words(t, 'it')}", 42) for t in (0.95, 0.96)]
    assert capfd.readouterr().err == ""
    made.append(api.alert_new(0.97, -1.0, 0.0, 0, api.error, len(api.error)))
    made.append(api.alert_new(0.95, -1.0, 0.0, 0, api.error, len(api.error)))  # said once already: not again
    assert capfd.readouterr().err.splitlines() == [f"sdqes: warning: sdqes_alert_new: the threshold 0.97 "
                                                   f"{never_reached_words(0.97, 'it')}"]
    assert len(logged) == 2 and len(made) == 7 and all(made)
    for alert in made:
        api.alert_free(alert)


def test_the_c_example_says_the_librarys_warnings_in_its_own_name(sdqes_run_on_the_cpu, bundle):
    """native/examples/stream_frames.c hands the library's warnings to its own log line, as a program would."""
    from sdqes_edge.runtime.alerts import never_reached_words

    done = subprocess.run([str(sdqes_run_on_the_cpu.parent / "sdqes-stream-frames"), bundle, "64", "48", "0.9",
                           "onnxruntime"], input=b"", capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    warned = [line for line in done.stderr.decode().splitlines() if "warning" in line]
    assert warned == [f"sdqes-stream-frames: warning: sdqes_alert_new: the threshold 0.9 "
                      f"{never_reached_words(0.9, 'it')}"]
