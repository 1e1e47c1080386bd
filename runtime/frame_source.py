"""What every frame source shares: sampling at the bundle's fps by timestamp, and the reader thread.

Frames are sampled by timestamp, not by frame count (a 29.97 fps file and a camera that stutters give the same
stream times; ``sampling``). A reader thread (``FrameReader``) fills a bounded queue: a file blocks when the queue
is full, so every sampled frame is processed; a live source keeps only the newest frame and counts the ones it
dropped, so a slow model never falls behind the world. A file's frames are preprocessed by a few threads while the
reader decodes the next ones, in order. The sources themselves are in ``sources`` (files, image folders) and
``live_source``.
"""

from __future__ import annotations

import abc
import atexit
import functools
import logging
import math
import numbers
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from sdqes_edge.compat import shutdown_cancelling
from sdqes_edge.errors import UserError, is_whole_number
from sdqes_edge.stopping import may_outlive_a_stop

from .cores import usable_cores
from .preprocess import CHANNEL_ORDERS
from .sampling import checked_rate, samples_served

SOURCE_LOG = logging.getLogger("sdqes_edge.runtime.sources")  # WARNING: Python shows it on stderr unconfigured

# Threads preprocessing a file's frames while the reader decodes the next ones (numpy releases the GIL in its
# products): one core is left to the decoder, and beyond four the step, not the source, is the bottleneck.
PREPARE_WORKERS = min(4, max(1, usable_cores() - 1))
NAMED_UNREADABLE_IMAGES = 3  # an image folder's unreadable images named as met (a line each) and in the summary
READER_STOP_TIMEOUT_S = 2.0  # how long a stopped reader thread may take to leave OpenCV and end
# How long OpenCV's FFmpeg may wait for a stream URL to open, or for its next frame, before it gives up (live_source's
# open_capture; run --stream-timeout): its own default is 30 s, so a stream that stalled (a camera frozen, a network
# cut that resets nothing) was reconnected only 30 s on, and a reader asked to stop could stay inside its read as
# long. The native sdqes-run waits as long. Here, torch- and OpenCV-free, for the command line's --help.
STREAM_TIMEOUT_S = 10.0
STREAM_TIMEOUT_MIN_S = 0.1  # the least a run may be given: FFmpeg counts it in milliseconds
_END = object()  # the queue's last item: the source has no more frames

# Reader threads not yet joined. A stream left unfinished by an exception (SIGTERM in the middle of `score`) may
# keep its reader alive until Python exits; a daemon thread still inside an OpenCV call when Python finalizes is
# killed inside a C++ frame, and the process aborts ("FATAL: exception not rethrown", exit -6) after its outputs
# were written. So every reader still running is stopped and joined first.
_LIVE_READERS: dict[threading.Thread, threading.Event] = {}


@atexit.register
def _stop_live_readers() -> None:  # (_LIVE_READERS says why)
    readers = list(_LIVE_READERS.items())
    for _, stop in readers:
        stop.set()
    deadline = time.monotonic() + READER_STOP_TIMEOUT_S  # one wait for them all, not one each
    for thread, _ in readers:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


@dataclass
class Frame:
    image: np.ndarray  # uint8 [H, W, 3], BGR as OpenCV reads it unless ``channels`` says otherwise
    time: float  # stream time in seconds
    index: int  # sampled frame index (time * fps for files)
    tensor: np.ndarray | None = None  # the preprocessed frame, when the reader thread prepared it
    channels: str = "bgr"  # the order of the image's channels: "rgb" for PIL, a ROS 2 rgb8 image, most SDKs

    @functools.cached_property
    def bgr(self) -> np.ndarray:
        """The image in OpenCV's order, as sinks take it (an RGB frame's reversed once, where a sink asks)."""
        return self.image if self.channels == "bgr" else np.ascontiguousarray(self.image[:, :, ::-1])


def check_frames(frames: list[Frame | None], batch: int) -> None:
    """What ``StreamingDetector.step`` takes: one Frame (or None, for an idle stream) per stream of a bundle that
    steps ``batch`` at once, each timed and counted so that alerts, cooldowns and resumes hold."""
    if not isinstance(frames, (list, tuple)):
        raise UserError(f"step takes a list of frames, one per stream (None for an idle one), not a "
                        f"{type(frames).__name__}: detector.step([frame])")
    if len(frames) != batch:
        raise UserError(f"this bundle steps {batch} stream(s) at once; got {len(frames)} frames")
    for frame in frames:
        if frame is not None and not isinstance(frame, Frame):
            raise UserError(f"step takes one Frame (or None, for an idle stream) per stream, not a "
                            f"{type(frame).__name__}: wrap an image as sdqes_edge.runtime.Frame(image=bgr, "
                            "time=seconds, index=n), with channels='rgb' for an RGB one")
        if frame is not None and frame.channels not in CHANNEL_ORDERS:  # said before the step, not in its threads
            raise UserError(f"a Frame's channels name the order of its image's colours, one of "
                            f"{', '.join(CHANNEL_ORDERS)}, not {frame.channels!r}")
        if frame is None or (type(frame.time) is float and math.isfinite(frame.time)  # what sources give: at once
                             and type(frame.index) is int and frame.index >= 0):
            continue
        if not (isinstance(frame.time, numbers.Real) and math.isfinite(frame.time)):
            raise UserError(f"a Frame's time is seconds into its stream, a finite number, not {frame.time!r}")
        if not is_whole_number(frame.index, least=0):  # a snapshot resumes a file at the frame after it
            raise UserError(f"a Frame's index counts the stream's frames from 0, not {frame.index!r}")


def check_run_arguments(sources, max_frames) -> list[FrameSource]:
    """``StreamingDetector.run``'s arguments checked before anything opens -> the sources as a list."""
    if max_frames is not None and not is_whole_number(max_frames, least=1):  # 0, -1 stepped a frame; "3" failed
        raise UserError(f"max_frames is a number of steps, at least 1 (or None for the whole stream), not "
                        f"{max_frames!r}")
    sources = list(sources) if isinstance(sources, (list, tuple)) else [sources]
    if not sources:  # it ended at once, nothing streamed and no word why
        raise UserError("run takes at least one source: detector.run([open_source(path, detector.fps)])")
    for source in sources:
        if not isinstance(source, FrameSource):  # a path failed with "'str' object has no attribute 'name'"
            raise UserError(f"run takes sources, not a {type(source).__name__}: open_source({source!r}, "
                            "detector.fps)")
    return sources


@dataclass
class SourceStats:
    read: int = 0  # frames decoded
    sampled: int = 0  # frames kept by the fps sampler
    dropped: int = 0  # sampled frames a live source discarded because the model was busy
    reconnects: int = 0
    expected: int | None = None  # frames the file's container lists, where it says
    truncated: bool = False  # the file stopped decoding well short of ``expected``
    gave_up_after: int = 0  # reconnection attempts a live source made in vain before it ended (0: it did not)
    reconnecting: bool = False  # a live source had no frame since it dropped (or never opened) when last seen
    unreadable: list[str] = field(default_factory=list)  # an image folder's images OpenCV could not read, skipped

    def shortfall_words(self, name: str) -> str | None:
        if self.unreadable:
            count, named = len(self.unreadable), ", ".join(self.unreadable[:NAMED_UNREADABLE_IMAGES])
            more = ", ..." if count > NAMED_UNREADABLE_IMAGES else ""
            return (f"{name}: {count} image{'s' if count > 1 else ''} could not be read and "
                    f"{'were' if count > 1 else 'was'} skipped ({named}{more}), the next image stepping in for each")
        if not self.truncated:
            return None
        return (f"{name} ended after {self.read} of the {self.expected} frames its container lists: the file is "
                "truncated or damaged, and the stream stopped there")

    def lost_words(self, name: str, kept_trying: bool = False) -> str | None:
        """What to say of a live source lost at the end of the run (None: it was not); ``kept_trying``: it was
        being tried again rather than given up (a camera of several)."""
        attempts = f"{self.gave_up_after} reconnection attempt{'' if self.gave_up_after == 1 else 's'}"
        if kept_trying and (self.gave_up_after or self.reconnecting):
            how = f"lost after {attempts} in vain, then tried again every few seconds" if self.gave_up_after else \
                "it was being reconnected"
            return f"{name} was not sending frames when the run ended ({how})"
        if not self.gave_up_after:
            return None
        return (f"{name} stopped sending frames and did not come back after {attempts}: the stream ended there, every "
                "output complete")


class Arrivals(threading.Condition):
    """Where a run's readers tell of the frames they hand over, and of their ends, for one loop to wait on whichever
    comes. ``wake_after(n)``: the next wait ends after n more frames (or an end), not at each frame (the default, 0):
    a step waiting for 32 cameras woke at each camera's frame and looked at every reader, 1.9 ms of a step's CPU."""

    def __init__(self):
        super().__init__()
        self.frames = 0  # handed over so far
        self._wake_at = 0  # the count that ends a wait (at most ``frames``: every frame)

    def wake_after(self, frames: int) -> None:
        """Called holding the lock, before a wait."""
        self._wake_at = self.frames + frames

    def handed_over(self, ended: bool = False) -> None:
        with self:
            self.frames += 1
            if ended or self.frames >= self._wake_at:
                self.notify_all()


class FrameSource(abc.ABC):
    """Base: subclasses yield (image, timestamp seconds) in ``_frames``; this samples and threads them."""

    live = False
    end_time: float | None = None  # a file's: no sample time past it (sampling.samples_served)

    def __init__(self, name: str, fps: float):
        self.fps = checked_rate(fps, "a source samples")
        self.name = name
        self.stats = SourceStats()
        self.start_index = 0  # samples before it are not stepped: a resumed run goes on after them (start_at)
        # A source's own news (a camera reconnecting or lost, a file cut short or slower than the bundle): to the
        # logger below unless a program sets its own (the command line prints each as one line). It went nowhere.
        self.log: Callable[[str], None] = SOURCE_LOG.warning

    @property
    def identity(self) -> str:
        """What a state snapshot records to know this source again (a live source: its name)."""
        return self.name

    def close(self) -> None:
        """Let go of what opening took, for a source that will not be read (``open_sources`` abandoned it): a live
        source's connection. A file holds nothing open until it is read."""

    def lost_words(self) -> str | None:
        """What to say of this source if it was lost at the run's end (a live one; None: it was not)."""
        return self.stats.lost_words(self.name)

    def interrupt(self) -> None:
        """Asked by its reader's consumer, from another thread, to stop waiting (a live source's reconnection
        back-off) and end: the reader is being stopped."""

    def start_at(self, index: int) -> None:
        """Step from sample ``index`` on (at stream time index / fps): the samples before it are decoded to keep
        the timeline, never stepped. For a resumed run; a live source has no past to skip."""
        if self.live:
            raise UserError(f"{self.name} is live: it has no earlier samples to skip")
        self.start_index = int(index)

    @abc.abstractmethod
    def _frames(self) -> Iterator[tuple[Callable[[], np.ndarray], float]]:
        """(image getter, timestamp seconds): the getter runs only for frames the sampler keeps, so a file
        source can skip colour conversion of the frames between samples."""

    def sampled(self) -> Iterator[Frame]:
        """Frames at ``fps`` by timestamp: sample time k / fps is served by the first frame at or after it
        (``sampling``). A file's frame steps at stream time k / fps, repeated where the video is slower than the
        samples. A live frame steps once, at its own time: the sample times a slow camera or a stall left without
        a frame are skipped, since repeating a stale frame would put the model behind the world."""
        next_sample, index = 0, 0
        period = 1.0 / self.fps
        for get_image, stamp in self._frames():
            self.stats.read += 1
            served = samples_served(stamp, next_sample, period, self.end_time)
            if not served:
                continue
            next_sample += served
            steps = 1 if self.live else served
            skipped = min(steps, max(0, self.start_index - index))  # before where a resumed run goes on
            index += skipped
            if skipped == steps:
                continue
            image = get_image()
            if image is None:  # the decoder failed on this frame: the stream ends here
                return
            for _ in range(steps - skipped):
                self.stats.sampled += 1
                yield Frame(image, stamp if self.live else index * period, index)
                index += 1

    def hand_over(self, item: tuple, q: queue.Queue, stop: threading.Event) -> None:
        """A file's frame waits for room in the queue; a live one replaces the frame not yet taken (counted)."""
        if not self.live:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue
            return
        try:
            q.put_nowait(item)
        except queue.Full:
            try:
                q.get_nowait()
                self.stats.dropped += 1
            except queue.Empty:
                pass
            q.put_nowait(item)

    def threaded(self, capacity: int = 8, prepare: Callable[[np.ndarray], np.ndarray] | None = None,
                 workers: int = PREPARE_WORKERS, arrivals: Arrivals | None = None) -> FrameReader:
        """The sampled frames through a reader thread (live: a queue of one, newest wins): an iterator of them
        (``FrameReader``). ``prepare`` (the preprocessing) of a file's frames runs in ``workers``
        threads beside the reader, a live source's on the reader thread; ``arrivals`` is notified at each frame (a run
        gathering several sources', ``Arrivals``)."""
        return FrameReader(self, capacity, prepare, workers, arrivals)


class FrameReader:
    """The sampled frames of ``source`` through a reader thread (live: a queue of one, newest wins).

    ``prepare`` (the preprocessing) of a file's frames runs in ``workers`` threads beside the reader, so decoding,
    preprocessing and the model stepping on the current frame overlap; frames come out in order all the same. A
    live source's sampled frame is prepared by its reader thread before it is handed over, as the native runtime
    prepares it: the consumer had prepared it, one camera after another on the thread that steps (a 1280x720 frame
    4.3 ms at 224 px: 32 cameras, 140 ms a step beside a GPU's step of 7). A frame dropped for a newer one was
    prepared for nothing, at most one a sample period. ``arrivals``, where given, is notified at every frame handed
    over and at the end, so that one loop can wait for whichever of several readers has one.
    """

    def __init__(self, source: FrameSource, capacity: int, prepare: Callable[[np.ndarray], np.ndarray] | None,
                 workers: int, arrivals: Arrivals | None = None):
        self.source = source
        self.ended = False  # the end taken: no frame will come
        self._queue: queue.Queue = queue.Queue(maxsize=1 if source.live else capacity)
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._pool = (ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"prepare-{source.name}")
                      if prepare is not None and not source.live else None)
        # The thread holds what it reads into, not this reader: one dropped unfinished is collected, and stops it.
        notify = arrivals.handed_over if arrivals is not None else None
        self._thread = threading.Thread(target=_read, args=(source, self._queue, self._stop, self._errors,
                                                            self._pool, prepare, notify),
                                        name=f"source-{source.name}", daemon=True)
        _LIVE_READERS[self._thread] = self._stop
        if source.live:  # its read of a stalled stream can outlast any wait (a file's is waited for to its end)
            may_outlive_a_stop(self._thread)
        self._thread.start()

    def ready(self) -> bool:
        """Whether ``take`` has something without waiting: a frame, or the end. The queue's items are looked at
        without its lock (one read, whole under the GIL): a run of 32 cameras asks this some 500 times a step."""
        return self.ended or bool(self._queue.queue)

    def take(self, timeout: float | None = None) -> Frame | None:
        """The next frame, waiting at most ``timeout`` seconds for it (None: as long as it takes); None where none
        came in time or the source has ended (``ended`` says which). Raises what the reader or the preprocessing
        raised, in frame order."""
        if self.ended:
            return None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            self.ended = True
            self.close()
            if self._errors:
                raise self._errors[0]
            return None
        frame, prepared = item
        if prepared is not None:
            frame.tensor = prepared.result()
        return frame

    def __iter__(self) -> FrameReader:
        return self

    def __next__(self) -> Frame:
        try:
            frame = self.take()
        except BaseException:
            self.close()
            raise
        if frame is None:
            raise StopIteration
        return frame

    def stop(self) -> None:
        """Ask the reader to stop, without waiting for it (``close`` waits)."""
        self._stop.set()
        self.source.interrupt()

    def close(self, deadline: float | None = None) -> None:
        """Stop the reader and wait for it until ``deadline`` (``time.monotonic()``; None: READER_STOP_TIMEOUT_S
        from now). One inside a stalled read is left to end with the process."""
        self.stop()
        if self._thread is not threading.current_thread():
            deadline = time.monotonic() + READER_STOP_TIMEOUT_S if deadline is None else deadline
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():  # else it stays listed, to be joined again before Python exits
            _LIVE_READERS.pop(self._thread, None)
        if self._pool is not None:
            shutdown_cancelling(self._pool, wait=False)

    def __del__(self) -> None:  # an iterator dropped unfinished: its reader stops reading, as a generator's would
        if getattr(self, "_stop", None) is not None:  # (not where __init__ failed before making it)
            self.stop()


def _read(source: FrameSource, q: queue.Queue, stop: threading.Event, errors: list[BaseException],
          pool: ThreadPoolExecutor | None, prepare: Callable[[np.ndarray], np.ndarray] | None,
          notify: Callable[..., None] | None) -> None:
    """A FrameReader's thread: ``source``'s sampled frames into ``q``, then the end marker."""
    image, prepared = None, None
    try:
        for frame in source.sampled():
            if stop.is_set():
                return
            if pool and frame.image is not image:  # a repeated frame (a slow video) is prepared once
                image, prepared = frame.image, pool.submit(prepare, frame.image)
            elif source.live and prepare is not None:  # here, so that the thread that steps only steps
                frame.tensor = prepare(frame.image)
            # (frame, its preprocessing under way or None): the queue bounds the frames in flight.
            source.hand_over((frame, prepared), q, stop)
            if notify:
                notify()
    except BaseException as exc:  # delivered to the consumer, which raises it
        errors.append(exc)
    while True:  # the end marker, after everything (exceptions included), unless the consumer stopped listening
        try:
            q.put(_END, timeout=0.1)
            break
        except queue.Full:
            if stop.is_set():
                return
    if notify:
        notify(ended=True)


