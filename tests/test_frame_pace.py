"""Frames a program steps itself must come at the model's rate (runtime/pacing.py): a QRNN trained on frames 0.2 s
apart and given every frame of a 30-fps camera sees time run 6x fast, and nothing said so. Every other test that
streams frames checks the same thing: pyproject's pytest settings make the warning an error."""

from __future__ import annotations

import random
import warnings

import pytest
from conftest import random_model
from runtime_fixtures import write_video

from sdqes_edge.errors import UserError
from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.runtime import Frame, FrameRateWarning, StreamingDetector, open_source
from sdqes_edge.runtime.sources import FrameSource
from sdqes_edge.sample import sample_frames

IMAGE = sample_frames(1, 48, 64)[0]


def step_at(detector: StreamingDetector, times: list[float]) -> list[warnings.WarningMessage]:
    """Step one frame at each time -> the FrameRateWarnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FrameRateWarning)
        for index, time in enumerate(times):
            detector.step([Frame(image=IMAGE, time=time, index=index)])
    return [w for w in caught if issubclass(w.category, FrameRateWarning)]


@pytest.fixture
def detector(exported):
    _, bundle = exported  # a tiny QRNN at 5 fps
    return StreamingDetector(bundle)


def test_every_frame_of_a_30_fps_camera_into_a_5_fps_model_warns_once_with_both_rates(detector):
    caught = step_at(detector, [k / 30 for k in range(40)])
    assert len(caught) == 1
    assert str(caught[0].message).startswith(
        "stream0: frames come 0.0333 s apart (30 per second), but this bundle's model steps at 5 frames per second: "
        "its temporal adapters see time run 6x fast")
    assert caught[0].filename == __file__  # pointing at the program's call of step


def test_frames_at_the_models_rate_with_jitter_and_a_stalled_camera_raise_no_warning(detector):
    jitter = random.Random(0)
    times = [k * 0.2 + jitter.uniform(-0.04, 0.04) for k in range(60) if k % 7 != 3]  # some samples missed
    assert step_at(detector, times) == []


class RecordedCamera(FrameSource):
    """A live source whose frames were stamped ``1 / rate`` seconds apart, read at once."""

    live = True

    def __init__(self, rate: float, frames: int, fps: float):
        super().__init__("camera", fps)
        self.rate, self.frames = rate, frames

    def _frames(self):
        for j in range(self.frames):
            yield (lambda: IMAGE), j / self.rate


def test_a_live_camera_a_little_faster_than_the_model_sampled_on_its_grid_raises_no_warning(detector):
    """Each sample time takes the first frame after it: 0.154 s apart two times in three, 0.308 s the third."""
    times = [frame.time for frame in RecordedCamera(rate=6.5, frames=100, fps=detector.fps).sampled()]
    assert sorted({round(b - a, 3) for a, b in zip(times, times[1:])}) == [0.154, 0.308]
    assert step_at(detector, times) == []


def test_frame_times_in_milliseconds_warn_once_where_alerts_and_cooldowns_were_timed_1000x_slow(detector):
    """A ROS stamp or a headset's clock in milliseconds: the model's scores are right, but a 10 s cooldown passed
    in 10 ms and each alert was logged at a time 1000x its own, unsaid."""
    caught = step_at(detector, [k * 200.0 for k in range(20)])  # 5 fps, in milliseconds
    assert len(caught) == 1
    assert str(caught[0].message).startswith(
        "stream0: frames come 200 s apart, 1000x the 0.2 s between this bundle's frames: a Frame's time is seconds "
        "since its stream started (a time in milliseconds reads as 1000x slow)")
    assert caught[0].filename == __file__


def test_a_camera_that_stalls_for_minutes_now_and_then_raises_no_warning(detector):
    times = [k * 0.2 for k in range(10)] + [120 + k * 0.2 for k in range(10)] + [400 + k * 0.2 for k in range(10)]
    assert step_at(detector, times) == []


def test_time_going_back_warns_unless_the_stream_was_reset_for_a_new_scene(detector):
    assert step_at(detector, [k * 0.2 for k in range(5)]) == []
    detector.reset()
    assert step_at(detector, [k * 0.2 for k in range(5)]) == []  # a new scene starts its times again
    caught = step_at(detector, [0.2])
    assert len(caught) == 1
    assert str(caught[0].message).startswith("stream0: frame time went back from 0.800 s to 0.200 s without reset()")


def test_frames_that_all_keep_one_time_are_told_to_carry_their_own(detector):
    caught = step_at(detector, [0.0] * 10)
    assert len(caught) == 1
    assert "frames keep the same time (0 s)" in str(caught[0].message)


@pytest.mark.parametrize("rate", [10.0, 1.0])
def test_a_source_opened_at_another_rate_than_the_bundles_is_refused_before_a_frame(detector, tmp_path, rate):
    video = write_video(tmp_path / "clip.avi", sample_frames(30, 48, 64), fps=10.0)
    with pytest.raises(UserError, match=rf"source clip samples at {rate:g} frames per second, but this bundle's "
                                        r"model steps at 5: open it at the bundle's rate, "
                                        r"open_source\(path, detector.fps\)"):
        next(detector.run(open_source(video, rate)))  # where detector.fps belongs
    assert next(detector.run(open_source(video, detector.fps))) == []


def test_a_model_without_temporal_state_takes_frames_at_any_rate(tmp_path):
    bundle = tmp_path / "mlp"
    export_bundle(random_model("mlp"), bundle, ExportOptions(fps=5.0, show_progress=False), log=lambda m: None)
    assert step_at(StreamingDetector(bundle), [k / 30 for k in range(20)]) == []
