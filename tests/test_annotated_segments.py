"""A live stream's annotated video is written in segments, each finished (playable) as the next begins: a video is
playable only once it is closed (an mp4's index comes last, and OpenCV buffers even an avi's frames), so the one
video of a camera watched for weeks was lost whole to a power cut or a kill, and could not be watched meanwhile.
A file's annotated video stays one video unless segments are asked for."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
from runtime_fixtures import QUERY

from sdqes_edge.cli.run_outputs import LIVE_ANNOTATION_SEGMENT_SECONDS, annotation_segment_seconds
from sdqes_edge.errors import UserError
from sdqes_edge.runtime.annotated_video import AnnotatedVideoSink, segment_path, segments_begun_before


def frames_in(path) -> int:
    video, count = cv2.VideoCapture(str(path)), 0
    while video.read()[0]:
        count += 1
    return count


def test_segments_each_hold_their_stretch_of_stream_time_under_names_of_their_own(tmp_path):
    sink = AnnotatedVideoSink(tmp_path / "annotated.avi", 1.0, lambda: {"q1": 0.5}, segment_seconds=2)
    for t in range(5):
        sink.on_frame(0, np.full((48, 64, 3), 30 * t, np.uint8), float(t), {"q1": 0.1 * t}, [])
    sink.close()
    assert [frames_in(path) for path in sink.written] == [2, 2, 1]
    assert len(set(sink.written)) == 3  # begun within one second here: told apart all the same
    assert all(p.name.startswith("annotated.2") and p.suffix == ".avi" for p in sink.written)
    whole = AnnotatedVideoSink(tmp_path / "whole.avi", 1.0, lambda: {}, segment_seconds=None)
    for t in range(5):
        whole.on_frame(0, np.zeros((48, 64, 3), np.uint8), float(t), {}, [])
    whole.close()
    assert whole.written == [tmp_path / "whole.avi"] and frames_in(tmp_path / "whole.avi") == 5


@pytest.mark.parametrize("frame_shape, video_shape", [
    ((48, 64), (384, 512)),  # a small frame: enlarged by whole pixels to at least 360 rows, the bars readable
    ((1, 2048), (360, 2048)),  # a line-scan camera's: 737,280 pixels wide, which no player opens
    ((16, 640), (360, 3840)),  # enlarged as far as 4K's width goes, between black bars
    ((16, 5760), (360, 5760)),  # wider than 4K already: its own size
])
def test_small_frames_are_enlarged_but_never_past_4k_width_the_rest_of_the_height_black(frame_shape, video_shape,
                                                                                       tmp_path):
    sink = AnnotatedVideoSink(tmp_path / "annotated.avi", 1.0, lambda: {"q1": 0.5})
    for t in range(2):
        sink.on_frame(0, np.full((*frame_shape, 3), 200, np.uint8), float(t), {"q1": 0.1}, [])
    sink.close()
    video = cv2.VideoCapture(str(tmp_path / "annotated.avi"))
    ok, first = video.read()
    assert ok and first.shape[:2] == video_shape and frames_in(tmp_path / "annotated.avi") == 2
    shown = frame_shape[0] * video_shape[1] // frame_shape[1]  # its rows in the video
    top = (video_shape[0] - shown) // 2
    assert first[top : top + shown + 1, video_shape[1] // 2].max() > 150  # the frame, centred (one row: MJPG blurs)
    above, below = first[: max(top - 8, 0)], first[top + shown + 8 : -60]  # the bars at the bottom aside
    assert above.max(initial=0) < 40 and below.max(initial=0) < 40  # black


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan"), True, "10"])
@pytest.mark.parametrize("name", ["segment_seconds", "keep_seconds"])
def test_a_segment_length_or_age_is_a_positive_number_of_seconds(tmp_path, name, seconds):
    with pytest.raises(UserError, match=f"{name} is a positive number of seconds"):
        AnnotatedVideoSink(tmp_path / "a.mp4", 1.0, lambda: {}, **{name: seconds})


def test_a_live_source_is_segmented_by_default_and_a_file_is_not_unless_asked():
    live, file = argparse.Namespace(live=True), argparse.Namespace(live=False)
    for given, expected in ((None, (LIVE_ANNOTATION_SEGMENT_SECONDS, None)), (0.0, (None, None)),
                            (30.0, (30.0, 30.0))):
        args = argparse.Namespace(annotate_segment=given)
        assert (annotation_segment_seconds(args, live), annotation_segment_seconds(args, file)) == expected


def test_a_killed_live_run_keeps_every_segment_it_had_finished(exported, endless_stream, tmp_path):
    _, bundle = exported
    command = ["run", str(bundle), "--source", endless_stream, "--query", QUERY, "--annotate",
               str(tmp_path / "cam.mp4"), "--annotate-segment", "1"]
    service = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", *command], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("cam.*.mp4"))) < 3 and service.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        service.kill()  # as a power cut ends it: the open segment is lost, none before it
        _, err = service.communicate()
    finished = sorted(tmp_path.glob("cam.*.mp4"))[:-1]
    assert len(finished) >= 2, err
    assert all(frames_in(path) >= 4 for path in finished)  # 1 s at the bundle's 5 fps each


def test_segments_begun_longer_ago_than_kept_are_removed_as_a_new_one_begins_and_nothing_else(tmp_path):
    """A camera watched for months filled its disk with segments (18 MB each at 384 px, 1 fps, 10 minutes), and the
    full disk then stopped the service. Old segments are told by the time in their names: an earlier run's too."""
    now = time.time()
    old = [segment_path(tmp_path / "cam.avi", now - hours * 3600) for hours in (50, 30)]
    kept = [segment_path(tmp_path / "cam.avi", now - 3600), tmp_path / "cam.avi", tmp_path / "cam.notes.avi",
            segment_path(tmp_path / "cam.mp4", now - 50 * 3600), segment_path(tmp_path / "other.avi", now - 50 * 3600)]
    for path in old + kept:
        path.write_bytes(b"")
    assert segments_begun_before(tmp_path / "cam.avi", now - 24 * 3600) == old
    sink = AnnotatedVideoSink(tmp_path / "cam.avi", 1.0, lambda: {}, segment_seconds=60, keep_seconds=24 * 3600)
    sink.on_frame(0, np.zeros((48, 64, 3), np.uint8), 0.0, {}, [])
    sink.close()
    assert not any(path.exists() for path in old) and all(path.exists() for path in kept + sink.written)


class Clocks:
    """annotated_video's view of the time module: a wall clock that can jump and a monotonic one that cannot."""

    def __init__(self, wall: float):
        self.wall, self.elapsed = wall, 0.0
        self.strptime = time.strptime

    def time(self) -> float:
        return self.wall + self.elapsed

    def monotonic(self) -> float:
        return self.elapsed


def test_a_segment_of_this_run_is_kept_for_its_hours_when_the_clock_jumps_on_by_days(tmp_path, monkeypatch):
    """A device without a clock battery boots on the time it last saved, days old after a week switched off, and
    moves it on when it reaches a time server. The segments it began before were named for the old time, and were
    removed as days old as the next one began, minutes after they were written. This run's segments are aged by the
    monotonic clock; an earlier run's, by their names as before."""
    from sdqes_edge.runtime import annotated_video

    now, day = time.time(), 24 * 3600.0
    clocks = Clocks(wall=now - 7 * day)  # the time saved at the last shutdown
    monkeypatch.setattr(annotated_video, "time", clocks)
    earlier_run = segment_path(tmp_path / "cam.avi", now - 8 * day)
    earlier_run.write_bytes(b"")
    sink = AnnotatedVideoSink(tmp_path / "cam.avi", 1.0, lambda: {}, segment_seconds=60, keep_seconds=day)
    image = np.zeros((48, 64, 3), np.uint8)
    sink.on_frame(0, image, 0.0, {}, [])
    clocks.elapsed, clocks.wall = 60.0, now  # a minute on, the time server's answer: a week later
    sink.on_frame(0, image, 60.0, {}, [])
    assert sink.written[0].exists() and not earlier_run.exists()
    clocks.elapsed = day + 30.0  # a day on by the clock that never jumps: the first is a day old, the second not
    sink.on_frame(0, image, 120.0, {}, [])
    sink.close()
    assert not sink.written[0].exists() and all(path.exists() for path in sink.written[1:])


def test_a_segment_of_this_run_is_removed_after_its_hours_when_the_clock_was_set_back(tmp_path, monkeypatch):
    """A clock set back (a device that booted a day fast) named this run's first segments in the future: by their
    names they were kept until the clock caught up, past what the disk was given for."""
    from sdqes_edge.runtime import annotated_video

    now, day = time.time(), 24 * 3600.0
    clocks = Clocks(wall=now + 3 * day)
    monkeypatch.setattr(annotated_video, "time", clocks)
    sink = AnnotatedVideoSink(tmp_path / "cam.avi", 1.0, lambda: {}, segment_seconds=60, keep_seconds=day)
    image = np.zeros((48, 64, 3), np.uint8)
    sink.on_frame(0, image, 0.0, {}, [])
    clocks.wall = now - 60.0  # set right
    clocks.elapsed = day + 60.0
    sink.on_frame(0, image, 60.0, {}, [])
    sink.close()
    assert not sink.written[0].exists() and sink.written[1].exists()
