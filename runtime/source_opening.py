"""Opening a run's sources: side by side, each on a thread of its own, and stoppable while they open.

OpenCV's open of a stream blocks inside C++: a server that answers but sends nothing holds it for the open's timeout
(``STREAM_TIMEOUT_S``, 10 s; FFmpeg's own is 30 s), and Python runs a signal handler only once that call returns.
Opened in the main thread, a run asked to stop there (Ctrl-C, ``docker stop``, systemd) went on waiting for it, while
docker kills after 10 s. Here the main thread only waits for the opener threads, a wait that a signal cuts short.
Cameras (V4L2) and GStreamer pipelines open side by side; OpenCV's FFmpeg backend (RTSP and HTTP streams, video
files) opens one at a time, under a lock of its own.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterable

from sdqes_edge.errors import SourceUnavailable
from sdqes_edge.stopping import may_outlive_a_stop

from .frame_gathering import STALL_NOTICE_S
from .frame_source import SOURCE_LOG, STREAM_TIMEOUT_S, FrameSource
from .live_source import Cameras, LiveSource, without_password
from .sources import open_source, source_kind, unopened_live_source

# A source still opening after this long is named, once, as a camera that stalls is: the run is not silent meanwhile.
OPEN_NOTICE_S = STALL_NOTICE_S


class _Openings:
    """The outcomes of the opener threads (a source, or what its open raised), in the order they come; once
    abandoned, a source whose open ends later is closed at once, not left holding its camera or connection."""

    def __init__(self) -> None:
        self.outcomes: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # abandoning and handing over never interleave: no source is lost between
        self._abandoned = False

    def open(self, index: int, spec: str | int, fps: float, stream_timeout_s: float,  # a thread's whole life
             images_fps: float | None) -> None:
        try:
            outcome = open_source(spec, fps, stream_timeout_s, images_fps)
        except BaseException as error:  # noqa: BLE001 (handed to the waiting thread, which raises it)
            outcome = error
        with self._lock:
            if not self._abandoned:
                self.outcomes.put((index, outcome))
                return
        if isinstance(outcome, FrameSource):
            outcome.close()

    def abandon(self, opened: Iterable[FrameSource]) -> None:
        """No source is wanted any more (one failed, or the run was stopped): close those opened."""
        with self._lock:
            self._abandoned = True
        leftovers = []
        while not self.outcomes.empty():
            leftovers.append(self.outcomes.get_nowait()[1])
        for source in [*opened, *leftovers]:
            if isinstance(source, FrameSource):
                source.close()


def open_sources(specs: Iterable[str | int], fps: float, log: Callable[[str], None] | None = None,
                 stream_timeout_s: float = STREAM_TIMEOUT_S, images_fps: float | None = None) -> list[FrameSource]:
    """``open_source`` of every spec, each on a thread of its own; the sources in the order given. The first failure
    to come is raised at once (the other sources closed, or closed as their opens end); so is a KeyboardInterrupt
    (Ctrl-C, or SIGTERM turned into one by ``stopping.raise_on_termination``), while OpenCV is still opening.
    ``log`` (default: the sources' logger, as a source's own news) is told of the sources still opening after
    ``OPEN_NOTICE_S``. ``stream_timeout_s``: how long a stream URL's open, or its wait for a frame, may take.
    ``images_fps``: the rate the image folders' images were taken at (the other sources keep their own times).

    Several cameras (every source live) are a run that goes on while any of them sends: a camera that cannot be
    opened at the start is not raised while another opened (it is said through ``log``, and starts unopened, its
    reading beginning by reconnecting), and each keeps trying when lost while another sends (``Cameras``)."""
    # One spec alone (a str) is one source, not one a letter ("source w is neither a file, ...").
    specs, log = [specs] if isinstance(specs, (str, int)) else list(specs), log or SOURCE_LOG.warning
    openings = _Openings()
    for index, spec in enumerate(specs):
        # A daemon thread: one left inside a stalled open must not hold the process's exit after a stop.
        rate = images_fps if source_kind(str(spec)) == "folder" else None  # a video keeps its own frames' times
        may_outlive_a_stop(threading.Thread(target=openings.open, args=(index, spec, fps, stream_timeout_s, rate),
                                            name=f"open-source-{index}", daemon=True)).start()
    opened: dict[int, FrameSource] = {}
    absent: dict[int, SourceUnavailable] = {}  # cameras not there now, held until the others are open
    notice_at: float | None = time.monotonic() + OPEN_NOTICE_S
    try:
        while len(opened) + len(absent) < len(specs):
            wait = None if notice_at is None else max(0.0, notice_at - time.monotonic())
            try:
                index, outcome = openings.outcomes.get(timeout=wait)  # a signal's handler runs within this wait
            except queue.Empty:
                log(_still_opening_words([spec for i, spec in enumerate(specs) if i not in opened and i not in absent],
                                         stream_timeout_s))
                notice_at = None
                continue
            if isinstance(outcome, SourceUnavailable) and len(specs) > 1:
                absent[index] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                opened[index] = outcome
        if absent and not (opened and all(source.live for source in opened.values())):
            raise absent[min(absent)]  # none opened, or a run with files: it cannot go on without them
    except BaseException:
        openings.abandon(opened.values())
        raise
    for index, failure in sorted(absent.items()):
        opened[index] = unopened_live_source(specs[index], fps, stream_timeout_s)
        log(f"warning: {failure}. The other cameras start without it; it is tried again as a lost camera is, its "
            "stream idling meanwhile")
    sources = [opened[index] for index in range(len(specs))]
    if len(sources) > 1 and all(isinstance(source, LiveSource) for source in sources):
        Cameras(sources)
    return sources


def _still_opening_words(specs: list[str | int], stream_timeout_s: float) -> str:
    shown = ", ".join(without_password(str(spec)) for spec in specs)
    return (f"still opening {shown} after {OPEN_NOTICE_S:g} s: OpenCV waits up to {stream_timeout_s:g} s for a stream "
            "that answers but sends nothing; Ctrl-C stops the run")
