"""One step's frames gathered from several sources, a stream each.

A run of several sources steps them together, and ``gather_frames`` makes each step: every file's next frame, and
every live source's next frame unless it has not come one sample period after the step's first frame. A camera
that stalls (an RTSP stream's read blocks for up to FFmpeg's 30 s before its reconnection attempts) then idles its
stream, memory kept, while the others go on, instead of holding every stream's alerts for as long.
"""

from __future__ import annotations

import threading
import time

from .frame_source import Frame, FrameReader

# How long a step waits for a live source's frame after the step's first came, in sample periods: a source that
# keeps pace sends one within a period of any other's (each is sampled at the bundle's rate), and a longer wait
# would put the streams that do keep pace behind the world by as much.
LIVE_PATIENCE_PERIODS = 1.0


def gather_frames(readers: list[FrameReader | None], arrivals: threading.Condition, patience_s: float,
                  late: set[int]) -> list[Frame | None]:
    """One step's frames, a stream each (None: the stream idles, its memory kept): each file's next frame, waited
    for as long as decoding takes; each live source's next frame, waited for until ``patience_s`` after the step's
    first frame came. A live source that missed that wait is ``late`` (the caller keeps the set from step to step):
    until it sends a frame again, no step waits for it. A reader that ended is closed and set to None in
    ``readers``; all None: every source has ended."""
    frames: list[Frame | None] = [None] * len(readers)
    for k, reader in enumerate(readers):  # a file's frame is never late, only slower or faster to decode
        if reader is not None and not reader.source.live:
            frames[k] = _taken(readers, k, timeout=None)
    waiting = {k for k, reader in enumerate(readers) if reader is not None and reader.source.live}
    first = time.monotonic() if any(frame is not None for frame in frames) else None
    with arrivals:  # held while looking, so that no arrival is missed between a look and the wait
        while waiting:
            for k in sorted(waiting):
                if readers[k].ready():
                    waiting.discard(k)
                    late.discard(k)
                    frames[k] = _taken(readers, k, timeout=0)
                    first = first if first is not None or frames[k] is None else time.monotonic()
            if not waiting or (first is not None and waiting <= late):
                break
            remaining = None if first is None else first + patience_s - time.monotonic()
            if remaining is not None and remaining <= 0:
                late.update(waiting)
                break
            arrivals.wait(remaining)
    return frames


def _taken(readers: list[FrameReader | None], k: int, timeout: float | None) -> Frame | None:
    frame = readers[k].take(timeout)
    if frame is None and readers[k].ended:
        readers[k] = None
    return frame
