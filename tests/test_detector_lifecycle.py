"""A detector's sinks are finished when its run ends (or by ``close``): a later step's alerts would reach none of
them. Such a step is refused, naming them, until sinks are added again; a detector used as a context manager closes
its sinks at the block's end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.runtime import Frame, JsonlSink, Sink, StreamingDetector, open_source

IMAGE = np.zeros((48, 64, 3), np.uint8)


class Kept(Sink):
    """A program's own sink, counting what reaches it."""

    def __init__(self):
        self.frames, self.closed = 0, 0

    def on_frame(self, stream, frame_bgr, time_s, probs, events):
        self.frames += 1

    def close(self):
        self.closed += 1


def alerting_detector() -> StreamingDetector:
    detector = StreamingDetector(DEMO_BUNDLE)
    detector.add_query("Tell me when the lamp turns on.", "Lamp!", threshold=1e-6)  # every first frame alerts
    return detector


def test_a_step_after_the_run_closed_its_sinks_is_refused_naming_them_and_a_sink_added_again_takes_it(tmp_path):
    """A second run on a detector whose first run ended yielded its alerts, and its JsonlSink never had them."""
    log = tmp_path / "alerts.jsonl"
    detector = alerting_detector()
    detector.add_sink(JsonlSink(log))
    detector.step([Frame(IMAGE, 0.0, 0)])
    detector.close()  # what the end of a run does
    with pytest.raises(UserError, match=rf"this detector's sinks \(JsonlSink\({log}\)\) were closed when its run "
                                        r"ended \(or by close\(\)\), each output finished, so this step's alerts"):
        detector.step([Frame(IMAGE, 0.5, 1)])
    detector.add_sink(JsonlSink(log))  # appends
    detector.reset()
    detector.step([Frame(IMAGE, 1.0, 2)])
    detector.close()
    assert [json.loads(line)["stream_time"] for line in log.read_text().splitlines()] == [0.0, 1.0]


def test_a_detector_without_sinks_runs_one_source_after_another(tmp_path):
    from runtime_fixtures import write_video

    video = write_video(tmp_path / "clip.avi", np.zeros((6, 48, 64, 3), np.uint8), fps=2.0)
    detector = alerting_detector()
    for _ in range(2):
        assert sum(1 for _ in detector.run(open_source(video, detector.fps), carry_state=False)) > 0


def test_a_detector_as_a_context_manager_closes_its_sinks_at_the_end_of_the_block():
    with StreamingDetector(DEMO_BUNDLE) as detector:
        kept = detector.add_sink(Kept())
        detector.step([Frame(IMAGE, 0.0, 0)])
    assert kept.frames == 1 and kept.closed == 1 and detector.sinks == []


def test_a_sink_finished_by_a_run_is_refused_when_added_again_rather_than_failing_at_its_first_alert(tmp_path):
    """A JsonlSink added again after its run ended failed at its next alert: "I/O operation on closed file"."""
    detector = alerting_detector()
    sink = detector.add_sink(JsonlSink(tmp_path / "alerts.jsonl"))
    detector.close()
    with pytest.raises(UserError, match=r"^this JsonlSink was finished as a run ended \(or by close\(\)\); add a new"):
        detector.add_sink(sink)
