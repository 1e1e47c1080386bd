"""One step's frames gathered from several sources, a stream each.

A run of several sources steps them together, and ``gather_frames`` makes each step: every file's next frame, and
every live source's next frame unless it has not come one sample period after the step's first frame. A camera
that stalls (a stream's read blocks for up to STREAM_TIMEOUT_S, 10 s, before its reconnection attempts) then idles its
stream, memory kept, while the others go on, instead of holding every stream's alerts for as long.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .frame_source import READER_STOP_TIMEOUT_S, Arrivals, Frame, FrameReader

# How long a step waits for a live source's frame after the step's first came, in sample periods: a source that
# keeps pace sends one within a period of any other's (each is sampled at the bundle's rate), and a longer wait
# would put the streams that do keep pace behind the world by as much.
LIVE_PATIENCE_PERIODS = 1.0
# A late camera is named (its source's log: a line on the command line, the journal under systemd) once it has sent
# nothing for this long, and again when it sends: a moment's lateness is the network's; seconds are a stall.
STALL_NOTICE_S = 5.0
# A wait for a live source's frame is cut into slices this long, so that a stop asked meanwhile is seen. The command
# line's handler of Ctrl-C and SIGTERM (docker, systemd) only asks the loop to finish the frame in hand; a loop
# waiting for a stalled camera's next frame saw that only when the frame came, up to FFmpeg's 30 s, while `docker
# stop` killed it after 10 with its outputs unfinished (gather_frames' stop_requested).
STOP_CHECK_S = 0.1


@dataclass
class LateSources:
    """The live sources a step stopped waiting for (``gather_frames``), kept from step to step: since when each has
    been late, and which of them were said to have stalled."""

    since: dict[int, float] = field(default_factory=dict)
    said: set[int] = field(default_factory=set)
    notice_after_s: float = STALL_NOTICE_S

    def __contains__(self, stream: int) -> bool:
        return stream in self.since

    def heard_from(self, stream: int, source, ended: bool = False) -> None:
        """``stream`` sent a frame (or ended): no longer late, and back in words where its stall was said (an end
        is said by the source itself: a camera lost for good)."""
        since = self.since.pop(stream, None)
        if stream in self.said:
            self.said.discard(stream)
            if not ended:
                source.log(f"{source.name} is sending frames again after {_seconds(time.monotonic() - since)} "
                           "without; its stream steps again")

    def missed(self, streams: set[int], when: float) -> None:
        for stream in streams:
            self.since.setdefault(stream, when)

    def say_stalls(self, readers: list) -> None:
        """Name each source late for ``notice_after_s`` and not yet named."""
        now = time.monotonic()
        for stream, since in self.since.items():
            if stream not in self.said and now - since >= self.notice_after_s and readers[stream] is not None:
                self.said.add(stream)
                source = readers[stream].source
                source.log(f"{source.name} has sent no frame for {_seconds(now - since)}: its stream idles, memory "
                           "kept, while the others step")


class StepFrames:
    """Every source's reader (a stream each, the bundle's other streams idle), and each step's frames from them."""

    def __init__(self, sources: list, streams: int, prepare, patience_s: float,
                 stop_requested: Callable[[], bool] | None = None):
        # Every live source's frames, for gather_frames to wait on whichever comes (a file's are waited for one by
        # one: its reader need not tell of them).
        self.arrivals = Arrivals()
        self.readers: list[FrameReader | None] = [
            s.threaded(prepare=prepare, arrivals=self.arrivals if s.live else None) for s in sources]
        self.readers += [None] * (streams - len(sources))
        self._sources = list(sources)
        self.late = LateSources()
        self.patience_s, self.stop_requested = patience_s, stop_requested

    def next(self) -> list[Frame | None] | None:
        """The next step's frames (``gather_frames``); None once every source has ended, or when a stop was asked
        while no frame was in hand."""
        if all(reader is None for reader in self.readers):
            return None
        frames = gather_frames(self.readers, self.arrivals, self.patience_s, self.late, self.stop_requested)
        return None if all(frame is None for frame in frames) else frames

    @property
    def sources_ended(self) -> list[bool]:
        """Per stream, whether its source has ended (its reader gone: a file's last frame taken, a camera lost for
        good); False for one stopped first, for a file cut short (its end is not the video's), and for the streams
        no source feeds."""
        return [k < len(self._sources) and reader is None and not self._sources[k].stats.truncated
                for k, reader in enumerate(self.readers)]

    def look_for_ends(self) -> None:
        """After a run's last step (``max_frames``): each file's next sample taken, to know whether that step took its
        last (a --max-frames of exactly its samples stepped it to its end). A live source is not waited for."""
        for k, reader in enumerate(self.readers):
            if reader is not None and not reader.source.live:
                try:
                    _taken(self.readers, k, timeout=None)
                except Exception:  # noqa: BLE001  (a frame past the run's last: its failure is no failure of the run)
                    pass

    def close(self) -> None:
        """Stop every reader, then wait for them all for READER_STOP_TIMEOUT_S at most (not that long each: a
        stop with three stalled cameras must still end within docker's 10 s)."""
        readers = [reader for reader in self.readers if reader is not None]
        for reader in readers:
            reader.stop()
        deadline = time.monotonic() + READER_STOP_TIMEOUT_S
        for reader in readers:
            reader.close(deadline)


def gather_frames(readers: list[FrameReader | None], arrivals: Arrivals, patience_s: float,
                  late: LateSources, stop_requested: Callable[[], bool] | None = None) -> list[Frame | None]:
    """One step's frames, a stream each (None: the stream idles, its memory kept): each file's next frame, waited
    for as long as decoding takes; each live source's next frame, waited for until ``patience_s`` after the step's
    first frame came. A live source that missed that wait is ``late`` (the caller keeps it from step to step): until
    it sends a frame again, no step waits for it. A reader that ended is closed and set to None in ``readers``; all
    None: every source has ended. ``stop_requested`` (asked every STOP_CHECK_S while waiting) ends the wait with
    the frames in hand: a stop asked while a camera stalls is not put off until it sends."""
    frames: list[Frame | None] = [None] * len(readers)
    for k, reader in enumerate(readers):  # a file's frame is never late, only slower or faster to decode
        if reader is not None and not reader.source.live:
            frames[k] = _taken(readers, k, timeout=None)
    waiting = {k for k, reader in enumerate(readers) if reader is not None and reader.source.live}
    if not waiting:  # files alone (or every live source ended): nothing to wait on
        return frames
    first = time.monotonic() if any(frame is not None for frame in frames) else None
    with arrivals:  # held while looking, so that no arrival is missed between a look and the wait
        while waiting:
            for k in sorted(waiting):
                if not readers[k].ready():
                    continue
                source = readers[k].source
                frames[k] = _taken(readers, k, timeout=0)
                if frames[k] is None and readers[k] is not None:
                    continue  # the frame was being replaced by a newer one that moment: still waited for
                waiting.discard(k)
                late.heard_from(k, source, ended=frames[k] is None)
                if first is None and frames[k] is not None:
                    first = time.monotonic()
            if not waiting or (first is not None and all(k in late for k in waiting)):
                break
            remaining = None if first is None else first + patience_s - time.monotonic()
            if remaining is not None and remaining <= 0:
                late.missed(waiting, first)
                break
            if stop_requested is not None and stop_requested():
                break
            # Woken by the first frame, then once the others it waits for are all in.
            arrivals.wake_after(1 if first is None else sum(1 for k in waiting if k not in late))
            arrivals.wait(STOP_CHECK_S if remaining is None else min(remaining, STOP_CHECK_S))
    late.say_stalls(readers)
    return frames


def _taken(readers: list[FrameReader | None], k: int, timeout: float | None) -> Frame | None:
    frame = readers[k].take(timeout)
    if frame is None and readers[k].ended:
        readers[k] = None
    return frame


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
