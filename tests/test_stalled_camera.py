"""Several live sources in one run: a camera that stalls idles its own stream, memory kept, while the others go on
stepping, instead of holding every stream's alerts for as long as it stalls (an RTSP stream's read blocks for up
to FFmpeg's 30 s before the reconnection attempts). Each stream's scores are those of its frames stepped alone."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
from conftest import random_model
from runtime_fixtures import QUERY

from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.runtime.frame_gathering import LIVE_PATIENCE_PERIODS
from sdqes_edge.runtime.frame_source import Arrivals, FrameSource
from sdqes_edge.runtime.sinks import ScoreTraceRecorder
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores

FPS = 5.0  # a sample every 0.2 s: a step of the tiny model takes a few ms, far from dropping a frame
A_FRAMES, B_FRAMES = 12, 6
B_STALLS_AFTER = 2  # B's frames before it stalls
A_FRAMES_DURING_STALL = 8  # B comes back once A has sent this many


class PacedCamera(FrameSource):
    """A camera sending ``images`` at the sample rate, stamped as a camera stamps them; it stalls before frame
    ``stall_at`` until ``resume`` is set, and sets ``reached`` before frame ``reach_at``."""

    live = True

    def __init__(self, name: str, images: list, stall_at: int | None = None, resume: threading.Event | None = None,
                 reach_at: int | None = None, reached: threading.Event | None = None):
        super().__init__(name, FPS)
        self.images, self.stall_at, self.resume, self.reach_at, self.reached = images, stall_at, resume, reach_at, \
            reached

    def _frames(self):
        period = 1.0 / FPS
        for k, image in enumerate(self.images):
            if k == self.reach_at:
                self.reached.set()
            if k == self.stall_at:
                assert self.resume.wait(timeout=20), "the other camera never got this far"
            time.sleep(period)
            yield (lambda image=image: image), (k + 0.01) * period


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[int, object]:
    """The same model for one stream and for two."""
    model, folder = random_model("qrnn"), tmp_path_factory.mktemp("bundles")
    for batch in (1, 2):
        export_bundle(model, folder / f"b{batch}", ExportOptions(fps=FPS, batch=batch, show_progress=False),
                      log=lambda m: None)
    return {batch: folder / f"b{batch}" for batch in (1, 2)}


def scores_of(bundle, sources: list, out) -> list[np.ndarray]:
    """Each stream's scores over a run of ``sources``, a stream each, every frame stepped (none dropped)."""
    detector = StreamingDetector(bundle)
    detector.add_query(QUERY)
    for stream, source in enumerate(sources):
        detector.add_sink(ScoreTraceRecorder(out / f"{stream}.npz", source.name, FPS, stream=stream))
    list(detector.run(sources))
    # Waiting for B's frames in every step (lockstep), A's frames were replaced, newest winning, while B stalled.
    dropped = {source.name: source.stats.dropped for source in sources}
    assert not any(dropped.values()), f"frames dropped, not stepped: {dropped}"
    return [load_scores(out / f"{stream}.npz").probs[:, 0] for stream in range(len(sources))]


def test_a_stalled_camera_idles_its_stream_while_the_other_goes_on_and_each_scores_as_it_would_alone(bundles,
                                                                                                     tmp_path):
    a_images, b_images = sample_frames(A_FRAMES, 48, 64, seed=1), sample_frames(B_FRAMES, 48, 64, seed=2)
    a_went_on = threading.Event()
    a = PacedCamera("a", a_images, reach_at=A_FRAMES_DURING_STALL + B_STALLS_AFTER, reached=a_went_on)
    b = PacedCamera("b", b_images, stall_at=B_STALLS_AFTER, resume=a_went_on)
    (tmp_path / "together").mkdir()
    together = scores_of(bundles[2], [a, b], tmp_path / "together")
    assert [len(s) for s in together] == [A_FRAMES, B_FRAMES]  # A stepped on every frame it sent while B stalled
    alone = []
    for name, images in (("a", a_images), ("b", b_images)):
        (tmp_path / name).mkdir()
        alone += scores_of(bundles[1], [PacedCamera(name, images)], tmp_path / name)
    for mine, single in zip(together, alone):  # B's memory was kept through the steps it idled
        np.testing.assert_allclose(mine, single, atol=1e-5)


def test_a_camera_that_keeps_pace_is_waited_for_so_the_streams_step_together(bundles, tmp_path):
    """Two cameras out of phase by half a sample period: each step waits for the second (less than the patience of
    LIVE_PATIENCE_PERIODS periods), so no stream idles and the steps are as many as either camera's frames."""
    assert LIVE_PATIENCE_PERIODS >= 1.0

    class HalfAPeriodLater(PacedCamera):
        def _frames(self):
            time.sleep(0.5 / FPS)
            yield from super()._frames()

    a, b = PacedCamera("a", sample_frames(8, 48, 64, seed=3)), HalfAPeriodLater("b", sample_frames(8, 48, 64, seed=4))
    detector = StreamingDetector(bundles[2])
    detector.add_query(QUERY)
    steps = [events for events in detector.run([a, b])]
    assert len(steps) == 8


class ScriptedReader:
    """What gather_frames asks of a FrameReader, with frames the test hands over (``send``)."""

    def __init__(self, live: bool, arrivals, name: str = "camera"):
        self.said: list[str] = []
        self.source = type("Source", (), {"live": live, "name": name, "log": staticmethod(self.said.append)})()
        self.arrivals, self.frames, self.ended, self.finished = arrivals, [], False, False

    def send(self, frame="frame"):
        with self.arrivals:
            self.frames.append(frame)
        self.arrivals.handed_over()

    def ready(self) -> bool:
        return bool(self.frames) or self.finished

    def take(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.frames and not self.finished and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.001)
        if self.frames:
            return self.frames.pop(0)
        self.ended = self.finished
        return None


def test_a_late_camera_is_not_waited_for_until_it_sends_again_as_sdqes_run_gathers_its_steps():
    """The twin of native/tests/test_step_gathering.cpp: a step that stopped waiting for B marks it late; the next
    steps do not wait for it at all, however long the patience; once B sends, it steps and is waited for again."""
    from sdqes_edge.runtime.frame_gathering import LateSources, gather_frames

    arrivals, late = Arrivals(), LateSources()
    a, b = ScriptedReader(True, arrivals), ScriptedReader(True, arrivals)
    readers = [a, b]
    a.send("a0")
    assert gather_frames(readers, arrivals, 0.02, late) == ["a0", None] and set(late.since) == {1}
    a.send("a1")
    asked = time.monotonic()
    assert gather_frames(readers, arrivals, 30.0, late) == ["a1", None]
    assert time.monotonic() - asked < 10.0  # at once: waiting for B, it took the patience, 30 s
    b.send("b0")
    threading.Timer(0.02, a.send, args=("a2",)).start()
    assert gather_frames(readers, arrivals, 30.0, late) == ["a2", "b0"] and not late.since
    assert a.said == b.said == []  # B was late for a moment, not long enough to be named
    a.finished = b.finished = True
    assert gather_frames(readers, arrivals, 30.0, late) == [None, None] and readers == [None, None]


def test_a_camera_late_for_seconds_is_named_once_and_again_when_it_sends():
    """A moment's lateness is the network's and goes unsaid; one that lasts is said once, in the source's log (a
    line on the command line, the journal under systemd), and its return too."""
    from sdqes_edge.runtime.frame_gathering import LateSources, gather_frames

    arrivals, late = Arrivals(), LateSources(notice_after_s=0.2)
    a, b = ScriptedReader(True, arrivals, "kitchen"), ScriptedReader(True, arrivals, "garage")
    readers = [a, b]
    for k in range(6):  # B silent for 6 steps of 0.05 s: past 0.2 s, said once
        a.send(f"a{k}")
        assert gather_frames(readers, arrivals, 0.05, late) == [f"a{k}", None]
        time.sleep(0.05)
    said = re.fullmatch(r"garage has sent no frame for ([\d.]+) s: its stream idles, memory kept, while the others "
                        r"step", b.said[0]) if len(b.said) == 1 else None
    assert said and float(said.group(1)) >= 0.2, b.said
    a.send("a6")
    b.send("b0")
    assert gather_frames(readers, arrivals, 0.05, late) == ["a6", "b0"]
    assert re.fullmatch(r"garage is sending frames again after \d\.\d s without; its stream steps again", b.said[1])
    assert a.said == []


def test_a_late_camera_that_ends_is_not_said_to_be_sending_again():
    """A camera lost for good ends its reader (the source says so itself): the gathering does not call that a
    return."""
    from sdqes_edge.runtime.frame_gathering import LateSources, gather_frames

    arrivals, late = Arrivals(), LateSources(notice_after_s=0.0)
    a, b = ScriptedReader(True, arrivals, "kitchen"), ScriptedReader(True, arrivals, "garage")
    readers = [a, b]
    a.send("a0")
    assert gather_frames(readers, arrivals, 0.02, late) == ["a0", None]
    assert len(b.said) == 1 and b.said[0].startswith("garage has sent no frame for ")
    a.send("a1")
    b.finished = True
    assert gather_frames(readers, arrivals, 0.02, late) == ["a1", None] and readers == [a, None]
    assert len(b.said) == 1 and not late.since and not late.said


def test_a_stop_while_the_camera_stalls_ends_the_run_at_once_with_every_output_complete(bundles, tmp_path):
    """SIGTERM (docker stop, systemd) asks the run to finish the frame in hand and stop. With the camera stalled
    there is none in hand, and the run waited for its next frame, up to FFmpeg's 30 s, while docker killed it after
    10 with its outputs unfinished. It now stops at once: within docker's 10 s, exit 143, the video playable."""
    import signal
    import subprocess
    import sys

    import cv2
    from runtime_fixtures import EndlessMJPEG, seconds_to_stop, serving

    class Stalls(EndlessMJPEG):
        frames = 6

        def do_GET(self):
            super().do_GET()  # six frames, then silence with the connection held (the read OpenCV is in blocks)
            time.sleep(60)

    annotated, events = tmp_path / "annotated.mp4", tmp_path / "events.jsonl"
    with serving(Stalls) as address:
        process = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundles[1]), "--source",
                                    f"{address}/cam.mjpg", "--query", QUERY, "--threshold", "0.01", "--annotate",
                                    str(annotated), "--events", str(events)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (events.is_file() and events.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)  # the six frames sent: the camera is silent now
        stopped_after = seconds_to_stop(process)
    stderr = process.stderr.read()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert stopped_after < 10, f"stopped {stopped_after:.1f} s after SIGTERM: docker stop would have killed it"
    assert "interrupted after" in stderr and "Traceback" not in stderr, stderr
    segments = sorted(tmp_path.glob("annotated.*.mp4"))  # a camera's annotated video is in timed segments
    assert len(segments) == 1 and cv2.VideoCapture(str(segments[0])).read()[0], "complete and playable"


def test_a_gathering_wait_ends_once_the_frames_it_waits_for_are_all_in_or_a_reader_ends():
    """A step waiting for 32 cameras woke at each camera's frame and looked at every reader (1.9 ms of a step's CPU on
    this project's 2-core CPU). Now it is woken by the first frame, and then once the frames it waits for are in."""
    arrivals, woken = Arrivals(), []

    def wait_for(frames: int) -> threading.Thread:
        def waiter():
            with arrivals:
                arrivals.wake_after(frames)
                woken.append(arrivals.wait(timeout=10.0))
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.1)  # waiting now
        return thread

    waiter = wait_for(3)
    arrivals.handed_over(ended=False)
    arrivals.handed_over(ended=False)
    time.sleep(0.2)
    assert woken == []  # two of the three: still asleep
    arrivals.handed_over(ended=False)
    waiter.join(timeout=5.0)
    assert woken == [True]
    waiter = wait_for(3)
    arrivals.handed_over(ended=True)  # a reader that ends is news at once: its stream is no longer waited for
    waiter.join(timeout=5.0)
    assert woken == [True, True]
