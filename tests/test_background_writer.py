"""An annotated video is encoded by a thread of its own (``BackgroundWriter``), so that the encoding does not hold
the step that made the frame: every frame is still written, in order, and what the encoder raises is raised in
the stepping thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from sdqes_edge.runtime import annotated_video
from sdqes_edge.runtime.annotated_video import QUEUED_FRAMES, AnnotatedVideoSink, BackgroundWriter


class HeldEncoder:
    """A VideoWriter stand-in whose writes wait until ``go`` is set, recording each frame's first pixel."""

    def __init__(self):
        self.go, self.written, self.released = threading.Event(), [], False

    def write(self, image):
        self.go.wait(timeout=30)
        self.written.append(int(image[0, 0, 0]))

    def release(self):
        self.released = True


def frame(k: int) -> np.ndarray:
    return np.full((8, 8, 3), k, np.uint8)


def test_frames_are_handed_over_without_waiting_for_the_encoder_and_all_written_in_order():
    encoder = HeldEncoder()
    writer = BackgroundWriter(encoder)
    handed = 0
    for k in range(QUEUED_FRAMES + 1):  # one being encoded (held), the rest waiting: none waits for the encoder
        writer.write(frame(k))
        handed += 1
    assert handed == QUEUED_FRAMES + 1 and encoder.written == []
    encoder.go.set()
    for k in range(QUEUED_FRAMES + 1, 20):
        writer.write(frame(k))
    writer.release()
    assert encoder.written == list(range(20)) and encoder.released


def test_a_frame_waits_for_room_once_the_encoder_is_that_far_behind():
    """The encoder, the slower, sets the pace: nothing is dropped, and memory holds a few frames at most."""
    encoder = HeldEncoder()
    writer = BackgroundWriter(encoder)
    for k in range(QUEUED_FRAMES + 1):
        writer.write(frame(k))
    late = threading.Thread(target=writer.write, args=(frame(99),))
    late.start()
    late.join(timeout=0.3)
    assert late.is_alive(), "handed over although the encoder had no room"
    encoder.go.set()
    late.join(timeout=30)
    writer.release()
    assert encoder.written == [*range(QUEUED_FRAMES + 1), 99]


def test_what_the_encoder_raises_is_raised_in_the_stepping_thread_at_the_next_write_or_at_release():
    class Failing(HeldEncoder):
        def write(self, image):
            raise OSError(28, "No space left on device")

    writer = BackgroundWriter(Failing())
    writer.write(frame(0))
    with pytest.raises(OSError, match="No space left"):
        for k in range(1, 100):  # raised by a later write, once the thread has met it
            writer.write(frame(k))
            time.sleep(0.01)  # the thread's turn
    writer.release()  # said once: the thread ends, nothing raised again
    writer = BackgroundWriter(Failing())
    writer.write(frame(0))
    with pytest.raises(OSError, match="No space left"):
        writer.release()


def test_the_sink_hands_its_frames_to_the_writer_thread(tmp_path, monkeypatch):
    """The stepping thread draws the frame; the writer thread encodes it."""
    encoders = []

    class Recorded(HeldEncoder):
        def __init__(self, *args):
            super().__init__()
            self.go.set()
            self.threads = set()
            encoders.append(self)

        def isOpened(self):
            return True

        def write(self, image):
            self.threads.add(threading.current_thread().name)
            super().write(image)

    monkeypatch.setattr(annotated_video.cv2, "VideoWriter", Recorded)
    sink = AnnotatedVideoSink(tmp_path / "a.mp4", 5.0, lambda: {"q": 0.5})
    for k in range(5):
        sink.on_frame(0, np.zeros((360, 480, 3), np.uint8), k / 5, {"q": 0.2}, [])
    sink._writer.release()  # not close(): nothing real was written to read back
    assert len(encoders[0].written) == 5 and encoders[0].threads == {"annotated-video-writer"}
