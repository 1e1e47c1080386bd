"""The torch-free runtime: a video through a bundle gives the PyTorch model's scores; alerts follow the policy."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
import torch
from runtime_fixtures import FPS, QUERY, write_video

from sdqes_edge.errors import UserError
from sdqes_edge.metrics import rising_edges
from sdqes_edge.runtime.alerts import AlertPolicy, AlertState
from sdqes_edge.runtime.detector import NonFiniteScoreError, StreamingDetector
from sdqes_edge.runtime.onnxruntime_backend import StepResult
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.runtime.sinks import CallbackSink, ScoreTraceRecorder
from sdqes_edge.runtime.sources import Frame, FrameSource, VideoFileSource, open_source
from sdqes_edge.runtime.tensorrt_backend import DeviceInfo, check_engine_matches
from sdqes_edge.sample import sample_frames
from sdqes_edge.tolerances import FP32_EMBEDDING_ATOL
from sdqes_edge.traces import load_scores


@pytest.mark.parametrize("suffix", [".mp4", ".avi"])
def test_a_video_through_the_runtime_scores_what_the_pytorch_model_scores(suffix, exported, tmp_path):
    model, bundle = exported
    video = write_video(tmp_path / f"clip{suffix}", sample_frames(60, 120, 160))  # 6 s at 10 fps
    detector = StreamingDetector(bundle)
    detector.add_query(QUERY)
    trace_path = tmp_path / "trace.npz"
    detector.add_sink(ScoreTraceRecorder(trace_path, "clip", FPS))
    list(detector.run(open_source(str(video), FPS)))
    runtime_probs = load_scores(trace_path).probs[:, 0]
    assert len(runtime_probs) == 30  # 6 s sampled at 5 fps, by timestamp

    # The same sampled frames, preprocessed the same way, through the PyTorch step form.
    decoded = [f.image for f in VideoFileSource(video, FPS).sampled()]
    cfg = model.cfg
    pre = Preprocessor.from_config(cfg)
    with torch.no_grad():
        frames = torch.from_numpy(pre.batch(decoded))[None]  # [1, T, 3, R, R]
        embeddings, _ = model.step_frames(frames)
        query = model.encode_text([QUERY])
        torch_probs = torch.sigmoid(embeddings[0] @ query[0]).numpy()
    assert np.abs(runtime_probs - torch_probs).max() <= FP32_EMBEDDING_ATOL


def test_preprocessing_is_close_to_the_pil_transform_used_in_training():
    """CLIP trains on PIL bicubic resize + center crop; OpenCV's resize differs slightly. Measure how much."""
    from PIL import Image

    from sdqes_edge.config import CLIP_MEAN, CLIP_STD

    def pil_clip(bgr: np.ndarray, size: int) -> np.ndarray:
        image = Image.fromarray(bgr[..., ::-1])
        w, h = image.size
        nh, nw = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
        image = image.resize((nw, nh), Image.BICUBIC)
        top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
        x = np.asarray(image.crop((left, top, left + size, top + size)), np.float32) / 255.0
        return ((x - CLIP_MEAN) / CLIP_STD).transpose(2, 0, 1)

    pre = Preprocessor(224, CLIP_MEAN, CLIP_STD)
    std = np.asarray(CLIP_STD, np.float32)[:, None, None]
    for shape in ((240, 320), (720, 1280), (100, 150)):
        diffs = np.stack([np.abs(pre(f) - pil_clip(f, 224)) * std * 255 for f in sample_frames(3, *shape)])
        print(f"{shape}: mean {diffs.mean():.2f}, max {diffs.max():.0f} grey levels")
        assert diffs.mean() < 1.0  # under one grey level per pixel on average


@pytest.mark.parametrize("in_size, out_size, first, count", [(640, 398, 87, 224), (50, 17, 0, 17), (17, 50, 3, 40),
                                                              (1920, 398, 87, 224), (224, 224, 0, 224)])
def test_block_resampling_computes_exactly_the_taps_it_is_built_from(in_size, out_size, first, count):
    from sdqes_edge.runtime.preprocess import _resample_columns, resampling_blocks, resize_coefficients

    planes = np.random.default_rng(0).uniform(0, 255, (3, 5, in_size))
    starts, weights = resize_coefficients(in_size, out_size)
    taps = weights.shape[1]
    expected = np.stack([sum(planes[..., starts[o] + k] * weights[o, k] for k in range(taps))
                         for o in range(first, first + count)], axis=-1)
    got = _resample_columns(planes, resampling_blocks(in_size, out_size, first, count), count)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)


def test_alerts_fall_exactly_on_the_rising_edges_of_the_score_trace(exported, tmp_path):
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(80, 120, 160))
    # A query whose embedding is one of the stream's own frame embeddings: its scores vary a lot over time.
    probe = StreamingDetector(bundle)
    embeddings = []
    probe.add_sink(CallbackSink(lambda e: None))
    for _ in probe.run(open_source(str(video), FPS)):
        embeddings.append(probe.last_embeddings[0].copy())
    query = embeddings[10] / np.linalg.norm(embeddings[10])
    probs = 1 / (1 + np.exp(-(np.stack(embeddings) @ query)))
    threshold = float(np.median(probs))
    expected = rising_edges(probs, threshold)
    assert len(expected) >= 3

    detector = StreamingDetector(bundle)
    detector.queries.encoder.seed(["frame ten"], query[None])
    detector.add_query("frame ten", "It is frame ten again", threshold=threshold)
    events = []
    detector.add_sink(CallbackSink(events.append))
    list(detector.run(open_source(str(video), FPS)))
    assert [e.frame_index for e in events] == expected.tolist()
    assert all(e.message == "It is frame ten again" and e.score > threshold for e in events)


def feed(policy: AlertPolicy, probs: list[float], fps: float = 1.0) -> list[int]:
    state = AlertState(policy)
    return [t for t, p in enumerate(probs) if state.update(p, t / fps)]


def test_the_alert_policy_rising_edges_hysteresis_cooldown_and_max_alerts():
    probs = [0.2, 0.7, 0.8, 0.55, 0.62, 0.3, 0.7, 0.2, 0.9, 0.1, 0.9]
    assert feed(AlertPolicy(0.6), probs) == [1, 4, 6, 8, 10] == rising_edges(np.array(probs), 0.6).tolist()
    assert feed(AlertPolicy(0.6, exit_threshold=0.5), probs) == [1, 6, 8, 10]  # 0.55 does not end the run
    assert feed(AlertPolicy(0.6, cooldown_s=4.0), probs) == [1, 6, 10]
    assert feed(AlertPolicy(0.6, max_alerts=2), probs) == [1, 4]
    assert feed(AlertPolicy(0.6, cooldown_s=2.0), probs, fps=2.0) == [1, 6, 10]  # cooldown is in stream seconds


@pytest.mark.parametrize("options, message", [
    (dict(threshold=1.2), r"outside \(0, 1\)"),
    (dict(threshold=0.0), r"outside \(0, 1\)"),
    (dict(threshold=0.6, exit_threshold=0.7), "exit threshold"),
    (dict(threshold=0.6, max_alerts=0), "max alerts"),
])
def test_a_bad_policy_is_refused(options, message):
    with pytest.raises(UserError, match=message):
        AlertPolicy(**options)


def test_queries_are_added_and_removed_while_the_stream_runs(exported, tmp_path):
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(40, 120, 160))
    detector = StreamingDetector(bundle)
    detector.add_query(QUERY, threshold=0.01)  # every frame is above: one alert, at the first frame
    trace = tmp_path / "t.npz"
    detector.add_sink(ScoreTraceRecorder(trace, "clip", FPS))
    events = []
    detector.add_sink(CallbackSink(events.append))
    for step, _ in enumerate(detector.run(open_source(str(video), FPS))):
        if step == 5:
            late = detector.add_query("when I open the fridge", threshold=0.01)
        if step == 10:
            detector.remove_query("q1")
    assert [(e.query_id, e.frame_index) for e in events] == [("q1", 0), (late.id, 6)]
    scores = load_scores(trace)
    assert scores.asked_time.tolist() == [0.0, 1.0]  # the second query was asked 1 s (5 frames) in
    assert np.isnan(scores.probs[:6, 1]).all() and not np.isnan(scores.probs[6:, 1]).any()
    assert np.isnan(scores.probs[11:, 0]).all()


def test_state_reset_save_and_restore(exported, tmp_path):
    _, bundle = exported
    frames = list(VideoFileSource(write_video(tmp_path / "c.avi", sample_frames(40, 120, 160)), FPS).sampled())
    detector = StreamingDetector(bundle)
    for frame in frames[:10]:
        detector.step([frame])
    snapshot = detector.save_state(tmp_path / "state.npz")
    detector.step([frames[10]])
    continued = detector.last_embeddings.copy()

    resumed = StreamingDetector(bundle)
    resumed.load_state(snapshot)
    resumed.step([frames[10]])
    np.testing.assert_array_equal(resumed.last_embeddings, continued)

    resumed.reset()
    resumed.step([frames[10]])
    fresh = StreamingDetector(bundle)
    fresh.step([frames[10]])
    np.testing.assert_array_equal(resumed.last_embeddings, fresh.last_embeddings)
    assert not np.allclose(fresh.last_embeddings, continued)  # the history mattered

    (tmp_path / "other.npz").write_bytes(b"nonsense")
    with pytest.raises(UserError, match=r"save_state \(not a NumPy .npz archive\); give the file save_state .* wrote$"):
        resumed.load_state(tmp_path / "other.npz")
    with pytest.raises(UserError, match=r"state snapshot .*none.npz does not exist; give the file save_state"):
        resumed.load_state(tmp_path / "none.npz")


class SimulatedCamera(FrameSource):
    """A live source that produces a new frame every 1/rate seconds of wall-clock time, for `seconds`, sampled at
    ``fps`` (the bundle's)."""

    live = True

    def __init__(self, rate: float, seconds: float, fps: float):
        super().__init__("simcam", fps=fps)
        self.rate, self.seconds = rate, seconds
        self.image = sample_frames(1, 120, 160)[0]

    def _frames(self):
        start = time.monotonic()
        while (now := time.monotonic() - start) < self.seconds:
            yield (lambda: self.image), now
            time.sleep(1.0 / self.rate)


class SlowBackend:
    """The bundle's real backend, made slower than the camera."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    def step(self, frames, state, query_embeddings=None):
        time.sleep(self.delay_s)
        return self.inner.step(frames, state)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_slow_model_on_a_live_source_drops_frames_instead_of_falling_behind(exported):
    _, bundle = exported
    detector = StreamingDetector(bundle)
    delay = 0.3  # 3.3 steps/s against a 50 frames/s camera sampled at the bundle's 5 frames/s
    detector.backend = SlowBackend(detector.backend, delay_s=delay)
    camera = SimulatedCamera(rate=50, seconds=2.0, fps=detector.fps)
    started = time.monotonic()
    processed = sum(1 for _ in detector.run(camera))
    elapsed = time.monotonic() - started
    assert camera.stats.dropped > 0
    assert processed + camera.stats.dropped == camera.stats.sampled
    # It finished with the camera (and the step under way then), not 10 sampled frames x 0.3 s later.
    assert elapsed < camera.seconds + 2 * delay


def test_a_non_finite_score_stops_the_stream_with_a_reason(exported, tmp_path):
    _, bundle = exported
    detector = StreamingDetector(bundle)
    inner = detector.backend

    class Poisoned(SlowBackend):
        calls = 0

        def step(self, frames, state, query_embeddings=None):
            Poisoned.calls += 1
            result = inner.step(frames, state)
            return StepResult(result.embedding * (np.nan if Poisoned.calls == 3 else 1.0), result.state)

    detector.backend = Poisoned(inner, 0.0)
    detector.add_query(QUERY)
    video = write_video(tmp_path / "c.avi", sample_frames(40, 120, 160))
    with pytest.raises(NonFiniteScoreError, match="non-finite score at frame 2"):
        list(detector.run(open_source(str(video), FPS)))


def test_an_engine_built_for_another_gpu_or_tensorrt_is_refused_with_the_rebuild_command(tmp_path):
    here = DeviceInfo("NVIDIA Jetson AGX Orin", (8, 7), "10.3.0")
    sidecar = {"gpu": "Tesla V100-SXM2-16GB", "compute_capability": [7, 0], "tensorrt_version": "10.3.0"}
    with pytest.raises(UserError, match="sm70.*this GPU is sm87.*build-engine"):
        check_engine_matches(sidecar, here, tmp_path, "fp16")
    with pytest.raises(UserError, match="TensorRT 8.6.1, this machine has 10.3.0"):
        check_engine_matches(dict(sidecar, compute_capability=[8, 7], tensorrt_version="8.6.1"), here, tmp_path,
                             "fp16")
    check_engine_matches(dict(sidecar, compute_capability=[8, 7]), here, tmp_path, "fp16")  # a match passes
    assert here.folder == "nvidia-jetson-agx-orin-sm87-trt10.3.0"


def test_a_files_frames_are_preprocessed_by_several_threads_and_come_out_in_order(tmp_path):
    import threading

    images = sample_frames(80, 48, 64)
    video = write_video(tmp_path / "clip.avi", images)
    threads = set()

    def prepare(image: np.ndarray) -> np.ndarray:
        threads.add(threading.current_thread().name)
        time.sleep(0.002 * (image.sum() % 5))  # uneven, so workers finish out of order
        return image.mean(axis=(0, 1))

    source = VideoFileSource(video, FPS)
    frames = list(source.threaded(prepare=prepare, workers=3))
    assert [f.index for f in frames] == list(range(len(frames))) and len(frames) >= 10
    for frame in frames:
        np.testing.assert_array_equal(frame.tensor, frame.image.mean(axis=(0, 1)))
    assert len(threads) > 1 and not any(name.startswith("source-") for name in threads)

    calls = []

    def fails_on_the_fourth(image: np.ndarray) -> np.ndarray:
        calls.append(image)
        if len(calls) == 4:
            raise UserError("this frame cannot be prepared")
        return image

    got = []
    with pytest.raises(UserError, match="cannot be prepared"):
        for frame in VideoFileSource(video, FPS).threaded(prepare=fails_on_the_fourth, workers=1):
            got.append(frame.index)
    assert got == [0, 1, 2]  # every frame before the failing one, in order


def test_an_image_folder_is_a_source(exported, tmp_path):
    _, bundle = exported
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, frame in enumerate(sample_frames(7, 120, 160)):
        cv2.imwrite(str(folder / f"{i:04d}.png"), frame)
    source = open_source(str(folder), FPS)
    frames = list(source.sampled())
    assert [f.index for f in frames] == list(range(7)) and frames[3].time == pytest.approx(3 / FPS)


def test_a_live_source_that_drops_is_reopened_with_back_off(tmp_path):
    from sdqes_edge.runtime.live_source import LiveSource

    video = write_video(tmp_path / "clip.avi", sample_frames(5, 60, 80))
    messages = []
    source = LiveSource(str(video), fps=1000.0, reconnect_delays=(0.01, 0.01))  # a stream that ends every 5 frames
    source.log = messages.append
    frames = []
    for frame in source.sampled():
        frames.append(frame)
        if len(frames) == 12:
            break
    assert source.stats.reconnects >= 2
    assert any("reconnecting" in m for m in messages)


def test_a_frame_the_reader_prepared_reaches_the_backend_as_it_is_and_an_unprepared_one_is_prepared(exported):
    _, bundle = exported
    detector = StreamingDetector(bundle)
    given = []
    step = detector.backend.step
    detector.backend.step = lambda frame, state, *rest: given.append(frame) or step(frame, state, *rest)
    image = sample_frames(1, 120, 160)[0]
    prepared = Frame(image, 0.0, 0, detector.preprocess(image))
    detector.step([prepared])
    assert np.shares_memory(given[0], prepared.tensor)  # no copy, no fresh batch per frame
    detector.step([Frame(image, 0.2, 1)])
    np.testing.assert_array_equal(given[1][0], prepared.tensor)



def test_the_detectors_onnx_runtime_workers_do_not_spin_between_steps_while_its_reader_threads_work(exported):
    from sdqes_edge.runtime.ort_sessions import SPIN_WAIT_OPTION

    options = StreamingDetector(exported[1]).backend.session.get_session_options()
    assert options.get_session_config_entry(SPIN_WAIT_OPTION) == "0"

def test_both_backends_declare_the_interface_the_detector_uses(exported):
    from sdqes_edge.runtime.backend import StepBackend
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
    from sdqes_edge.runtime.tensorrt_backend import TensorRTStep

    _, bundle = exported
    assert isinstance(OnnxRuntimeStep(bundle / "step.fp32.onnx"), StepBackend)
    members = [name for name in dir(StepBackend) if not name.startswith("_")]
    assert set(members) <= set(dir(TensorRTStep)) | {"spec", "fused_queries", "warm_up_steps"}  # set in __init__


def test_importing_the_runtime_changes_no_process_wide_opencv_setting():
    code = ("import os, cv2\nbefore = cv2.utils.logging.getLogLevel()\nimport sdqes_edge.runtime\n"
            "import sdqes_edge.runtime.sources\n"
            "assert cv2.utils.logging.getLogLevel() == before, 'log level changed'\n"
            "assert 'OPENCV_FFMPEG_LOGLEVEL' not in os.environ, 'FFmpeg log level set'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "OPENCV_FFMPEG_LOGLEVEL"})
    assert done.returncode == 0, done.stderr
