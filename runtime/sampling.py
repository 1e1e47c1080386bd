"""Which decoded frames of a file the stream steps on, at what stream time, and an image folder's frame order.

A file is sampled at the bundle's fps by timestamp: sample time ``k / fps`` is served by the first frame at or
after it, and that frame steps at stream time ``k / fps``. Where the video has fewer frames per second than the
bundle samples (a 2-fps security recording, a bundle at 4 fps), one frame serves several sample times and is
repeated, so stream time, alert times and the rate the model sees stay true; taking each frame once instead
compressed such a stream in time (a 60-s video at 2 fps ran as 30 s at 4 fps). A live source keeps the same
sample times from its start, but steps each frame it keeps once: sample times a camera missed (a slow camera, a
stall) are skipped, not filled with a stale frame. Its samples stay on the grid k / fps: waiting a period after the
last frame kept instead stepped slower than the bundle by the wait for the next frame, every time (a 15-fps camera
at 15 fps stepped 9.5 times a second, a 30-fps camera at 10 fps 8.4). The native runtime (``sdqes::samples_served``)
follows the same rule; ``tests/vectors/sampling.json`` holds both to it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from sdqes_edge.contract import MAX_FPS
from sdqes_edge.errors import UserError, is_number

# A container's millisecond timestamps may land a hair below the sample time they stand for (999.9999 ms).
STAMP_TOLERANCE_S = 1e-6
# How far past the end its container states a file's timestamps may run before they are taken as broken: a
# frame stamped far beyond the end (a damaged index) would otherwise be repeated up to its stamp.
END_SLACK_S = 1.0


def checked_rate(fps: object, what: str) -> float:
    """``fps`` as a float, refused unless it is a number of frames per second in (0, MAX_FPS]; ``what`` samples or
    records at it ("a source samples", "ScoreTraceRecorder records")."""
    if not is_number(fps) or not 0 < fps <= MAX_FPS:  # NaN too
        raise UserError(f"{what} at a positive number of frames per second up to {MAX_FPS:g}, not {fps!r}; give the "
                        "bundle's (detector.fps)")
    return float(fps)


def check_source_rates(sources: list, fps: float) -> None:
    """Refuse a source (``FrameSource``) sampled at another rate than the model steps at: it would see time run
    fast or slow."""
    for source in sources:
        if not math.isclose(source.fps, fps, rel_tol=1e-9):
            raise UserError(f"source {source.name} samples at {source.fps:g} frames per second, but this bundle's "
                            f"model steps at {fps:g}: open it at the bundle's rate, open_source(path, detector.fps)")


def samples_served(stamp: float, next_index: int, period: float, end_time: float | None = None) -> int:
    """How many sample times ``k * period`` (``k >= next_index``) the frame at ``stamp`` seconds serves as the
    first frame at or after them: 0 (a frame between samples), 1, or more (a video slower than the samples).
    ``end_time``: the file's stated length plus ``END_SLACK_S`` (None: not stated), past which none is served."""
    limit = stamp if end_time is None else min(stamp, end_time)
    count = 0
    while (next_index + count) * period <= limit + STAMP_TOLERANCE_S:
        count += 1
    return count


def stated_end_time(frame_count: int, native_fps: float) -> float | None:
    """The last time a file's samples may take, from its container's frame count and rate (None: not stated)."""
    return frame_count / native_fps + END_SLACK_S if frame_count > 0 and native_fps > 0 else None


def frame_order(path: Path) -> tuple[list, str]:
    """A sort key that orders numbered names by number: frame_2.jpg before frame_10.jpg, as the frames were taken
    (a plain sort put frame_10 .. frame_19 between frame_1 and frame_2); zero-padded names keep their order, and
    the name itself settles ties (7.jpg, 007.jpg)."""
    parts = [(0, int(part), "") if part.isdigit() else (1, 0, part.lower()) for part in re.split(r"(\d+)", path.name)]
    return parts, path.name
