"""A program may change the detector from another thread while a stream runs: add and remove queries (a voice
command, a ROS callback), reset a stream, save the state. Every such change happens between two steps, never
inside one: each frame's score of each query is that query's own (sigmoid of the frame's embedding against its
text's), and no step fails on a query removed under it. Before, a step read the query ids, then the embedding
matrix, and a removal between the two gave one query another's score, or a KeyError. A sink may change the
queries too, from inside the step that called it: a one-shot reminder removing its query at its alert."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.runtime import Frame, StreamingDetector
from sdqes_edge.runtime.sinks import Sink

TEXTS = ("Tell me when the lamp turns on.", "When the door opens", "a ball starts rolling", "a red square appears")
STEPS = 300


class Consistency(Sink):
    """Each frame's reported p of each query against the one its own text gives with this frame's embedding."""

    def __init__(self, detector: StreamingDetector):
        self.detector, self.worst, self.frames = detector, 0.0, 0

    def on_frame(self, stream, frame_bgr, time_s, probs, events):
        embedding = self.detector.last_embeddings[stream]
        for qid, p in probs.items():
            own = self.detector.queries.encoder.encode(self.detector.queries.queries[qid].text)
            self.worst = max(self.worst, abs(p - 1.0 / (1.0 + np.exp(-float(embedding @ own)))))
        self.frames += 1


@pytest.fixture
def fast_thread_switches():
    """Python switches threads every 5 ms by default; every 10 us here, so a step and a change interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def test_queries_changed_from_another_thread_never_land_inside_a_step(fast_thread_switches):
    detector = StreamingDetector(DEMO_BUNDLE)
    for text in TEXTS:
        detector.queries.encoder.encode(text)  # the texts' embeddings cached: the changes are then instant
    check = detector.add_sink(Consistency(detector))
    detector.add_query(TEXTS[0])
    stop, failures = threading.Event(), []

    def change_queries():
        try:
            k = 0
            while not stop.is_set():
                query = detector.add_query(TEXTS[1 + k % 3])
                detector.remove_query(query.id)
                if k % 50 == 0:
                    detector.reset()
                k += 1
        except Exception as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    changer = threading.Thread(target=change_queries)
    changer.start()
    rng = np.random.default_rng(0)
    try:
        for t in range(STEPS):
            image = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
            detector.step([Frame(image=image, time=t / detector.fps, index=t)])
    finally:
        stop.set()
        changer.join()
    assert failures == []
    assert check.frames == STEPS and check.worst < 1e-6
    assert [q.text for q in detector.queries.queries.values()] == [TEXTS[0]]


def test_a_one_shot_reminder_whose_sink_removes_its_query_at_its_alert_stops_every_stream_cleanly(tmp_path):
    """'Remind me once': a callback removing its query at the first alert. With several streams alerting on the
    same frame, the next stream's alerts then looked the removed query up, a KeyError mid-step."""
    from conftest import random_model

    from sdqes_edge.export import ExportOptions, export_bundle
    from sdqes_edge.runtime import CallbackSink

    bundle = tmp_path / "two-streams"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(batch=2, show_progress=False), log=lambda m: None)
    detector = StreamingDetector(bundle)
    seen = []

    def remind_once(alert):
        seen.append((alert.stream, alert.frame_index))
        detector.remove_query(alert.query_id)

    detector.add_sink(CallbackSink(remind_once))
    detector.add_query(TEXTS[0], threshold=0.01)  # every frame passes: both streams alert on the first
    image = np.zeros((48, 64, 3), np.uint8)
    for t in range(3):
        frame = Frame(image=image, time=t / detector.fps, index=t)
        detector.step([frame, frame])
    assert seen == [("stream0", 0)] and detector.queries.queries == {}


def test_one_run_at_a_time_a_second_from_another_thread_is_refused_and_the_first_goes_on():
    """Two runs of one detector stepped the same streams, each with its own frames between the other's (a stream's
    state and alerts a mix of two videos), and the first to end closed the sinks of both. The second is refused
    in one line; the first streams to its end, and the detector runs again once it has."""
    from sdqes_edge.errors import UserError
    from sdqes_edge.runtime.soak import NoiseSource

    detector = StreamingDetector(DEMO_BUNDLE)
    first = detector.run(NoiseSource(detector.fps, 20))
    next(first)  # the first run is streaming
    refused = []

    def second_run():
        try:
            next(detector.run(NoiseSource(detector.fps, 20)))
        except UserError as exc:
            refused.append(str(exc))

    worker = threading.Thread(target=second_run)
    worker.start()
    worker.join()
    assert len(refused) == 1 and refused[0].startswith("this detector is already running (a run not ended")
    assert 1 + sum(1 for _ in first) == 20  # the first run went on to its last frame
    assert sum(1 for _ in detector.run(NoiseSource(detector.fps, 5), carry_state=False)) == 5
    abandoned = detector.run(NoiseSource(detector.fps, 20), carry_state=False)
    next(abandoned)
    abandoned.close()  # a run closed part way through ends too
    assert sum(1 for _ in detector.run(NoiseSource(detector.fps, 5), carry_state=False)) == 5


def test_while_a_run_streams_a_step_from_another_thread_is_refused():
    """A step from another thread put its frames among the run's, in the same streams (their state and alerts a
    mix of two sources). Changes between steps (queries, reset, save) stay welcome from any thread."""
    from sdqes_edge.errors import UserError
    from sdqes_edge.runtime.soak import NoiseSource

    detector = StreamingDetector(DEMO_BUNDLE)
    frame = Frame(image=np.zeros((48, 64, 3), np.uint8), time=0.0, index=0)
    run = detector.run(NoiseSource(detector.fps, 10))
    next(run)
    outcomes = []

    def from_another_thread(call):
        try:
            call()
            outcomes.append("done")
        except UserError as exc:
            outcomes.append(str(exc))
        except Exception as exc:  # noqa: BLE001  (any other failure shows in the assertions, not lost in the thread)
            outcomes.append(repr(exc))

    for call in (lambda: detector.step([frame]), lambda: detector.add_query(TEXTS[0]), detector.reset):
        worker = threading.Thread(target=from_another_thread, args=(call,))
        worker.start()
        worker.join()
    assert outcomes[0].startswith("a run is streaming on this detector (in another thread)")
    assert outcomes[1:] == ["done", "done"]
    assert 1 + sum(1 for _ in run) == 10
    later = Frame(image=frame.image, time=10 / detector.fps, index=10)  # the stream's time goes on
    worker = threading.Thread(target=from_another_thread, args=(lambda: detector.step([later]),))
    worker.start()
    worker.join()
    assert outcomes[3:] == ["done"]  # the run has ended
