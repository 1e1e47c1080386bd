"""One step's frames as one batch [B, 3, R, R], assembled where the backend uploads from, by several threads where
the batch is large."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from .backend import StepBackend, frame_batch_buffer
from .cores import usable_cores
from .frame_source import Frame

# From this many bytes a step's frames are copied into the batch by several threads: at 224 px a frame is 600 KB,
# and one core copies about 10 GB/s, so 32 streams (19 MB a step) took 1.4 ms on one core of this project's 2-core
# CPU, a fifth of a GPU's 32-stream step; numpy lets go of the GIL while it copies. A smaller batch (8 streams at
# 224 px is 4.6 MiB): one thread, as handing the rows to others (80 us a step) would cost more than it saves.
PARALLEL_BYTES = 4 * 2**20
ASSEMBLY_THREADS = min(4, usable_cores())  # beyond four the copy is bound by the memory, not by the cores


class FrameBatch:
    """The buffer a detector's steps assemble their frames in (``frame_batch_buffer``: the bound step's page-locked
    upload buffer, where it has one), reused step after step."""

    def __init__(self, backend: StepBackend, shape: tuple[int, ...]):
        self.buffer = frame_batch_buffer(backend, shape)
        self._threads = min(ASSEMBLY_THREADS, shape[0]) if self.buffer.nbytes >= PARALLEL_BYTES else 1
        self._pool = (ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="frame-batch")
                      if self._threads > 1 else None)

    def of(self, frames: list[Frame | None], preprocess: Callable[[np.ndarray, str], np.ndarray]) -> np.ndarray:
        """The frames as one batch: one frame prepared by its reader goes as it is (a view: at 224 px a copy and a
        fresh batch cost a GPU step a few percent); else the buffer, each idle slot zero and each frame not yet
        prepared prepared. A backend copies what it is given (into its bound buffer, or as an input) and keeps no
        reference to it."""
        if len(frames) == 1 and frames[0] is not None and frames[0].tensor is not None:
            return frames[0].tensor[None]
        if self._pool is None:
            self._fill(frames, preprocess, 0, 1)
        else:  # each thread every n-th row: as many tasks as threads, not one a row
            for done in [self._pool.submit(self._fill, frames, preprocess, k, self._threads)
                         for k in range(self._threads)]:
                done.result()
        return self.buffer

    def _fill(self, frames: list[Frame | None], preprocess: Callable[[np.ndarray, str], np.ndarray], first: int,
              every: int) -> None:
        for i in range(first, len(frames), every):
            frame = frames[i]
            if frame is None:
                self.buffer[i] = 0.0
            else:
                self.buffer[i] = frame.tensor if frame.tensor is not None else preprocess(frame.image, frame.channels)
