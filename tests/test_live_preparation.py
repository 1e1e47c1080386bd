"""A live source's sampled frames are preprocessed by its reader thread, as the native runtime's are: the thread that
steps only steps. Before, that thread preprocessed each camera's frame itself, one camera after another (a 1280x720
frame takes 4.3 ms at 224 px: 140 ms a step for 32 cameras, beside a GPU step of 7)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from runtime_fixtures import QUERY

from sdqes_edge.errors import UserError
from sdqes_edge.runtime import StreamingDetector
from sdqes_edge.runtime.frame_source import FrameSource
from sdqes_edge.sample import sample_frames


class Camera(FrameSource):
    """A live source: a new frame every 1/rate seconds for ``frames`` frames, each a little different."""

    live = True

    def __init__(self, fps: float, frames: int = 12, rate: float = 100.0):
        super().__init__("camera", fps=fps)
        self.images, self.rate = sample_frames(frames, 60, 80), rate

    def _frames(self):
        start = time.monotonic()
        for image in self.images:
            yield (lambda image=image: image), time.monotonic() - start
            time.sleep(1.0 / self.rate)


def test_a_live_frame_comes_out_of_its_reader_prepared_by_the_reader_thread():
    threads = []

    def prepare(image: np.ndarray) -> np.ndarray:
        threads.append(threading.current_thread().name)
        return image.mean(axis=(0, 1))

    frames = list(Camera(fps=1000.0).threaded(prepare=prepare))
    assert len(frames) >= 5
    for frame in frames:
        np.testing.assert_array_equal(frame.tensor, frame.image.mean(axis=(0, 1)))
    assert threads and all(name == "source-camera" for name in threads)


def test_the_thread_that_steps_a_live_source_never_preprocesses(exported):
    _, bundle = exported
    detector = StreamingDetector(bundle)
    detector.add_query(QUERY)
    preprocess, threads = detector.preprocess, []

    def recorded(image: np.ndarray) -> np.ndarray:
        threads.append(threading.current_thread().name)
        return preprocess(image)

    detector.preprocess = recorded
    stepped = sum(1 for _ in detector.run(Camera(fps=detector.fps, frames=30, rate=20.0)))
    assert stepped >= 3 and threads
    assert threading.current_thread().name not in threads and all(name == "source-camera" for name in threads)


def test_a_live_frame_that_cannot_be_prepared_ends_the_run_with_the_reason(exported):
    _, bundle = exported
    detector = StreamingDetector(bundle)
    detector.add_query(QUERY)

    def refuses(image: np.ndarray) -> np.ndarray:
        raise UserError("this camera's frame cannot be prepared")

    detector.preprocess = refuses
    with pytest.raises(UserError, match="cannot be prepared"):
        for _ in detector.run(Camera(fps=detector.fps, frames=30, rate=20.0)):
            pass
