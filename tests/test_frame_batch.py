"""A step's frames are assembled into one batch where the backend uploads from; from PARALLEL_BYTES a step on, by
several threads (at 32 streams of 224 px, 19 MB a step: 1.4 ms on one core of a 2-core CPU, a fifth of a GPU's
step). The batch is the same however many threads made it."""

from __future__ import annotations

import threading
import time

import numpy as np

from sdqes_edge.runtime.frame_batch import ASSEMBLY_THREADS, PARALLEL_BYTES, FrameBatch
from sdqes_edge.runtime.frame_source import Frame


class HostBackend:
    """A backend without an upload buffer of its own: the batch gets one."""


SIZE = 128  # a frame's side: 192 KiB a frame
FRAME_BYTES = 3 * SIZE * SIZE * 4
MANY, FEW = -(-PARALLEL_BYTES // FRAME_BYTES), PARALLEL_BYTES // FRAME_BYTES - 1


def frames_of(streams: int, rng: np.random.Generator) -> list[Frame | None]:
    """Every third stream idle, every fourth prepared by its reader, the rest to prepare."""
    frames = []
    for i in range(streams):
        image = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
        tensor = rng.standard_normal((3, SIZE, SIZE)).astype(np.float32) if i % 4 == 1 else None
        frames.append(None if i % 3 == 2 else Frame(image, 0.0, 0, tensor))
    return frames


def prepared_by(threads: list[str], seconds: float = 0.0):
    def prepare(image: np.ndarray, channels: str = "bgr") -> np.ndarray:
        threads.append(threading.current_thread().name)
        time.sleep(seconds)  # long enough that every thread gets its share
        return np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32) / 255.0
    return prepare


def expected(frames: list[Frame | None], prepare) -> np.ndarray:
    return np.stack([np.zeros((3, SIZE, SIZE), np.float32) if f is None else
                     f.tensor if f.tensor is not None else prepare(f.image) for f in frames])


def test_a_large_batch_is_assembled_by_several_threads_into_the_same_batch():
    rng = np.random.default_rng(0)
    batch, threads = FrameBatch(HostBackend(), (MANY, 3, SIZE, SIZE)), []
    batch.buffer[:] = 7.0  # last step's frames: every row is written again, idle ones with zeros
    frames = frames_of(MANY, rng)
    assembled = batch.of(frames, prepared_by(threads, seconds=0.01))
    np.testing.assert_array_equal(assembled, expected(frames, prepared_by([])))
    assert assembled is batch.buffer
    if ASSEMBLY_THREADS > 1:  # a machine of one core copies on the stepping thread
        assert len(set(threads)) == ASSEMBLY_THREADS and all(name.startswith("frame-batch") for name in threads)


def test_a_small_batch_is_assembled_by_the_stepping_thread():
    rng = np.random.default_rng(1)
    batch, threads = FrameBatch(HostBackend(), (FEW, 3, SIZE, SIZE)), []
    frames = frames_of(FEW, rng)
    np.testing.assert_array_equal(batch.of(frames, prepared_by(threads)), expected(frames, prepared_by([])))
    assert set(threads) == {threading.current_thread().name}


def test_one_prepared_frame_goes_to_the_backend_as_it_is():
    frame = Frame(np.zeros((6, 8, 3), np.uint8), 0.0, 0, np.ones((3, SIZE, SIZE), np.float32))
    assert np.shares_memory(FrameBatch(HostBackend(), (1, 3, SIZE, SIZE)).of([frame], prepared_by([])), frame.tensor)
