"""Saying, while a stream runs, that the disk an output is written to is nearly full.

OpenCV's video writer reports no error: a video written as one file (no --annotate-segment) found a full disk only
when it closed, hours of it cut off without a word. A watch on the disk's free space says so while there is time to
act, and says again once there is room.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Callable

from sdqes_edge.files import format_bytes

# Under this much free space an output that grows by megabytes a minute (an annotated 1080p video) has minutes left.
LOW_DISK_BYTES = 256 * 2**20
# How often the free space is read (one statvfs call), by the clock that never jumps.
DISK_CHECK_SECONDS = 30.0


class LowDiskWatch:
    """Reads the free space of ``path``'s disk at most every ``check_seconds``; says once when it falls under
    ``LOW_DISK_BYTES`` (``words``: what to do) and once when it is back over twice that."""

    def __init__(self, path: Path, what: str, words: str, log: Callable[[str], None]):
        self.path, self.what, self.words, self.log = Path(path), what, words, log
        self.check_seconds = DISK_CHECK_SECONDS
        self._last = -math.inf  # the first check is at the first frame: a disk nearly full from the start is said
        self.low = False

    def check(self) -> None:
        now = time.monotonic()
        if now - self._last < self.check_seconds:
            return
        self._last = now
        try:
            free = shutil.disk_usage(self.path.parent).free
        except OSError:  # the folder gone or unreadable: its writes say so themselves
            return
        if free < LOW_DISK_BYTES and not self.low:
            self.low = True
            self.log(f"warning: the disk {self.what} {self.path} is written to has {format_bytes(free)} free; "
                     f"{self.words}")
        elif free >= 2 * LOW_DISK_BYTES and self.low:
            self.low = False
            self.log(f"note: the disk of {self.what} {self.path} has {format_bytes(free)} free again")
