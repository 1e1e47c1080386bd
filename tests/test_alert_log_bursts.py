"""Many alerts at once (a hundred queries above their thresholds at a stream's first frame, a service's queries
file of a dataset's) go into the alert log in one write and one sync per stream and step, every one of them: a sync
per alert had held such a step for seconds (11,828 EgoSDQES queries: 3.8 s where the step took 6 ms), a camera's
frames dropped meanwhile, and a sync is tens of milliseconds on a Jetson's SD card."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from test_full_disk import file_size_limit

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.runtime import AlertEvent, Frame, JsonlSink, StreamingDetector
from sdqes_edge.runtime import alert_log as alert_log_module
from sdqes_edge.runtime.queries import ThresholdOutOfReachWarning

QUERIES = 60


def alert(query: int, frame: int = 0) -> AlertEvent:
    return AlertEvent(f"q{query}", f"query {query}", "Wash!", "cam", frame / 2.0, frame, 0.9, 0.2, 3.0)


def logged(path) -> list[tuple[str, int]]:
    lines = path.read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines)  # whole lines only
    return [(json.loads(line)["query_id"], json.loads(line)["frame_index"]) for line in lines]


@pytest.fixture
def syncs(monkeypatch) -> list[int]:
    """The file descriptors the alert log syncs, in order (the real os.fsync still runs)."""
    synced: list[int] = []

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    real_fsync = os.fsync
    monkeypatch.setattr(alert_log_module.os, "fsync", fsync)
    return synced


def test_a_steps_alerts_of_a_stream_are_one_write_and_one_sync_in_the_order_they_were_raised(tmp_path, syncs):
    log = tmp_path / "alerts.jsonl"
    detector = StreamingDetector(DEMO_BUNDLE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThresholdOutOfReachWarning)  # every query alerts at the first frame
        ids = [detector.add_query(f"Tell me when the lamp turns on, number {n}.", threshold=1e-6).id
               for n in range(QUERIES)]
    detector.add_sink(JsonlSink(log))
    image = np.zeros((48, 64, 3), np.uint8)
    raised = [event.query_id for event in detector.step([Frame(image, 0.0, 0)])[0]]
    assert len(syncs) == 1 and sorted(raised) == sorted(ids)
    assert logged(log) == [(query_id, 0) for query_id in raised]
    detector.step([Frame(image, 1.0, 1)])  # nothing new alerts (each query is still on): nothing to sync
    detector.close()
    assert len(syncs) == 1 and len(logged(log)) == QUERIES


def test_more_alerts_at_once_than_a_refused_disk_holds_are_all_written_while_the_disk_takes_them(tmp_path, syncs):
    log, said = tmp_path / "alerts.jsonl", []
    sink = JsonlSink(log)
    sink.log = said.append
    sink.HELD_ALERTS = 3
    sink.on_events([alert(q) for q in range(10)])
    assert logged(log) == [(f"q{q}", 0) for q in range(10)] and len(syncs) == 1 and said == []
    with file_size_limit(log.stat().st_size + 50):  # room for less than a line
        sink.on_events([alert(q, frame=1) for q in range(10)])
    assert len(said) == 1 and said[0].startswith("warning: cannot append alerts")
    sink.on_events([alert(10, frame=2)])  # room again: the latest held, then this step's
    sink.close()
    assert logged(log)[10:] == [("q8", 1), ("q9", 1), ("q10", 2)]
    assert said[1].endswith("(8 older ones were let go)")


def test_a_log_of_its_own_that_leaves_alerts_out_one_by_one_still_has_each_alert(tmp_path):
    """A subclass's on_event, written when alerts came one at a time, is not passed by the step's batch."""

    class ConfidentAlerts(JsonlSink):
        def on_event(self, event: AlertEvent) -> None:
            if event.score > 0.8:
                super().on_event(event)

    log = tmp_path / "alerts.jsonl"
    sink = ConfidentAlerts(log)
    sink.on_events([alert(0), AlertEvent("q1", "query 1", "Wash!", "cam", 0.0, 0, 0.5, 0.0, 3.0), alert(2)])
    sink.close()
    assert logged(log) == [("q0", 0), ("q2", 0)]
