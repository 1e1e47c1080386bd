"""Frame sources with OpenCV: a video file, a camera index, a URL (RTSP/HTTP/GStreamer), an image folder.

Frames are sampled at the bundle's fps by timestamp, not by frame count (a
29.97 fps file and a camera that stutters give the same stream times). A
reader thread fills a bounded queue: a file blocks when the queue is full, so
every sampled frame is processed; a live source keeps only the newest frame and
counts the ones it dropped, so a slow model never falls behind the world. A
file's frames are preprocessed by a few threads while the reader decodes the
next ones, in order. A live source that disconnects is reopened with back-off.
"""

from __future__ import annotations

import abc
import atexit
import itertools
import math
import numbers
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import cv2
import numpy as np

from sdqes_edge.errors import UserError

from .cores import usable_cores
from .sampling import STAMP_TOLERANCE_S, frame_order, samples_served, stated_end_time

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
URL_PREFIXES = ("rtsp://", "rtsps://", "http://", "https://", "udp://", "tcp://")
RECONNECT_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # back-off between attempts; then the source gives up
TRUNCATION_SLACK_FRAMES = 2  # a file may decode this many frames (or 1%) fewer than its container lists
# Threads preprocessing a file's frames while the reader decodes the next ones (numpy releases the GIL in its
# products): one core is left to the decoder, and beyond four the step, not the source, is the bottleneck.
PREPARE_WORKERS = min(4, max(1, usable_cores() - 1))
READER_STOP_TIMEOUT_S = 2.0  # how long a stopped reader thread may take to leave OpenCV and end

# Reader threads not yet joined. A stream left unfinished by an exception (SIGTERM in the middle of `score`) may
# keep its frame generator, and so its reader, alive until Python exits; a daemon thread still inside an OpenCV
# call when Python finalizes is killed inside a C++ frame, and the process aborts ("FATAL: exception not
# rethrown", exit -6) after its outputs were written. So every reader still running is stopped and joined first.
_LIVE_READERS: dict[threading.Thread, threading.Event] = {}


@atexit.register
def _stop_live_readers() -> None:
    readers = list(_LIVE_READERS.items())
    for _, stop in readers:
        stop.set()
    for thread, _ in readers:
        thread.join(timeout=READER_STOP_TIMEOUT_S)


def quiet_opencv_logs() -> None:
    """Silence OpenCV's and FFmpeg's own logs, for an application that reports a source's problems itself.

    Process-wide, so the library never does it on import: the command line calls it; a program embedding the
    runtime decides for itself. OpenCV warns about a camera or file it cannot open, and FFmpeg inside it about a
    damaged file ("moov atom not found"); the runtime says what went wrong in one line. FFmpeg reads its level
    when OpenCV first opens a file, so call this before opening any source.
    """
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)


@dataclass
class Frame:
    image: np.ndarray  # BGR uint8 [H, W, 3]
    time: float  # stream time in seconds
    index: int  # sampled frame index (time * fps for files)
    tensor: np.ndarray | None = None  # the preprocessed frame, when the reader thread prepared it


@dataclass
class SourceStats:
    read: int = 0  # frames decoded
    sampled: int = 0  # frames kept by the fps sampler
    dropped: int = 0  # sampled frames a live source discarded because the model was busy
    reconnects: int = 0
    expected: int | None = None  # frames the file's container lists, where it says
    truncated: bool = False  # the file stopped decoding well short of ``expected``

    def shortfall_words(self, name: str) -> str | None:
        if not self.truncated:
            return None
        return (f"{name} ended after {self.read} of the {self.expected} frames its container lists: the file is "
                "truncated or damaged, and the stream stopped there")


class FrameSource(abc.ABC):
    """Base: subclasses yield (image, timestamp seconds) in ``_frames``; this samples and threads them."""

    live = False
    end_time: float | None = None  # a file's: no sample time past it (sampling.samples_served)

    def __init__(self, name: str, fps: float):
        if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not 0 < fps < math.inf:
            raise UserError(f"a source samples at a positive number of frames per second, not {fps!r}; give the "
                            "bundle's (detector.fps)")
        self.name = name
        self.fps = float(fps)
        self.stats = SourceStats()
        self.log: Callable[[str], None] = lambda message: None

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
            image = get_image()
            if image is None:  # the decoder failed on this frame: the stream ends here
                return
            next_sample += served
            for _ in range(1 if self.live else served):
                self.stats.sampled += 1
                yield Frame(image, stamp if self.live else index * period, index)
                index += 1

    def _hand_over(self, item: tuple, q: queue.Queue, stop: threading.Event) -> None:
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
                 workers: int = PREPARE_WORKERS) -> Iterator[Frame]:
        """The sampled frames through a reader thread (live: a queue of one, newest wins).

        ``prepare`` (the preprocessing) of a file's frames runs in ``workers`` threads beside the reader, so
        decoding, preprocessing and the model stepping on the current frame overlap; frames come out in
        order all the same. A live frame is prepared by the consumer, since it may yet be dropped.
        """
        q: queue.Queue = queue.Queue(maxsize=1 if self.live else capacity)
        done = object()
        stop = threading.Event()
        errors: list[BaseException] = []
        pool = (ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"prepare-{self.name}")
                if prepare is not None and not self.live else None)

        def reader() -> None:
            image, prepared = None, None
            try:
                for frame in self.sampled():
                    if stop.is_set():
                        return
                    if pool and frame.image is not image:  # a repeated frame (a slow video) is prepared once
                        image, prepared = frame.image, pool.submit(prepare, frame.image)
                    # (frame, its preprocessing under way or None): the queue bounds the frames in flight.
                    self._hand_over((frame, prepared), q, stop)
            except BaseException as exc:  # delivered to the consumer, which raises it
                errors.append(exc)
            deliver_end()  # after everything, exceptions included (all are caught above)

        def deliver_end() -> None:
            """The end marker, put on the queue unless the consumer has stopped listening."""
            while True:
                try:
                    q.put(done, timeout=0.1)
                    return
                except queue.Full:
                    if stop.is_set():
                        return

        thread = threading.Thread(target=reader, name=f"source-{self.name}", daemon=True)
        _LIVE_READERS[thread] = stop
        thread.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    break
                frame, prepared = item
                if prepared is not None:
                    frame.tensor = prepared.result()  # raises what the preprocessing raised, in frame order
                yield frame
            if errors:
                raise errors[0]
        finally:
            stop.set()
            thread.join(timeout=READER_STOP_TIMEOUT_S)
            if not thread.is_alive():  # else it stays listed, to be joined again before Python exits
                _LIVE_READERS.pop(thread, None)
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


class VideoFileSource(FrameSource):
    def __init__(self, path: str | Path, fps: float):
        super().__init__(Path(path).stem, fps)
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"video {self.path} does not exist")
        capture = cv2.VideoCapture(str(self.path))
        ok = capture.isOpened() and capture.read()[0]
        self.frame_count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) if ok else 0
        self.native_fps = capture.get(cv2.CAP_PROP_FPS) if ok else 0.0
        self.end_time = stated_end_time(self.frame_count, self.native_fps)
        capture.release()
        if not ok:
            raise UserError(f"OpenCV cannot decode a frame of {self.path} (unreadable or empty video); check it "
                            "plays, or re-encode it to H.264 mp4 or MJPG avi")

    @property
    def duration_frames(self) -> int | None:
        """Sampled frames the file will give (for a progress bar), if the container says."""
        if self.frame_count > 0 and self.native_fps > 0:
            return int(self.frame_count / self.native_fps * self.fps) + 1
        return None

    def _frames(self):
        capture = cv2.VideoCapture(str(self.path))
        native = self.native_fps if self.native_fps > 0 else 30.0
        self.stats.expected = self.frame_count if self.frame_count > 0 else None
        if 0 < self.native_fps < self.fps - STAMP_TOLERANCE_S:
            self.log(f"note: {self.path} has {self.native_fps:g} frames per second, fewer than the {self.fps:g} the "
                     "bundle samples: each frame is repeated for the sample times it covers, so stream times stay true")
        try:
            index = 0
            while capture.grab():  # decode only; the BGR image is made for sampled frames alone
                stamp = capture.get(cv2.CAP_PROP_POS_MSEC) / 1000.0
                # Some backends report 0 for every frame; fall back to the frame index over the native rate.
                yield (lambda: capture.retrieve()[1]), (stamp if stamp > 0 or index == 0 else index / native)
                index += 1
            self._check_length(index)
        finally:
            capture.release()

    def _check_length(self, decoded: int) -> None:
        """Containers' frame counts are often off by a frame or two; a file cut short misses far more."""
        expected = self.stats.expected
        if expected is not None and expected - decoded > max(TRUNCATION_SLACK_FRAMES, 0.01 * expected):
            self.stats.truncated = True
            self.log(f"warning: {self.stats.shortfall_words(str(self.path))}")


class ImageFolderSource(FrameSource):
    """Images in frame order (``frame_order``), one per sampled frame (the folder is taken to be sampled at ``fps``
    already)."""

    def __init__(self, folder: str | Path, fps: float):
        super().__init__(Path(folder).name, fps)
        self.files = sorted((p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES), key=frame_order)
        if not self.files:
            raise UserError(f"{folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")

    @property
    def duration_frames(self) -> int:
        return len(self.files)

    def _frames(self):
        for i, path in enumerate(self.files):
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is None:
                raise UserError(f"OpenCV cannot read the image {path}; remove or re-save it")
            yield (lambda image=image: image), i / self.fps


class LiveSource(FrameSource):
    """A camera index or a stream URL: stamped by the wall clock, reopened with back-off when it drops."""

    live = True

    def __init__(self, target: int | str, fps: float, reconnect_delays: tuple[float, ...] = RECONNECT_DELAYS_S):
        super().__init__(f"camera{target}" if isinstance(target, int) else str(target), fps)
        self.target = target
        self.reconnect_delays = reconnect_delays
        capture = self._open()
        if capture is None:
            what = f"camera index {target}" if isinstance(target, int) else f"stream {target}"
            raise UserError(f"OpenCV cannot open {what}; check it is connected (ls /dev/video*) or the URL plays "
                            "(e.g. in ffplay), and that no other program holds it")
        self._capture = capture

    def _open(self):
        capture = cv2.VideoCapture(self.target)
        if capture.isOpened():
            return capture
        capture.release()
        return None

    @property
    def duration_frames(self) -> None:
        return None

    def _frames(self):
        capture, start = self._capture, time.monotonic()
        try:
            while True:
                ok, image = capture.read() if capture is not None else (False, None)
                if ok:
                    yield (lambda image=image: image), time.monotonic() - start
                    continue
                if capture is not None:
                    capture.release()
                capture = None
                for attempt, delay in enumerate(self.reconnect_delays, 1):
                    self.log(f"{self.name}: no frame; reconnecting in {delay:g} s (attempt {attempt} of "
                             f"{len(self.reconnect_delays)})")
                    time.sleep(delay)
                    capture = self._open()
                    if capture is not None:
                        self.stats.reconnects += 1
                        self.log(f"{self.name}: reconnected")
                        break
                if capture is None:
                    self.log(f"{self.name}: gave up after {len(self.reconnect_delays)} attempts")
                    return
        finally:
            if capture is not None:
                capture.release()


def frames_spread_over(path: str | Path, count: int) -> Iterator[np.ndarray]:
    """Up to ``count`` BGR frames spread evenly over a video file (int8 calibration), by the same sampler, one at a
    time: 2,000 drift frames of a 1080p video held whole were 12 GB."""
    source = VideoFileSource(path, fps=1.0)
    if source.frame_count > 0 and source.native_fps > 0:
        # Never above the video's own rate: the sampler would repeat frames, and a calibration set wants distinct
        # ones (a short video is cycled through by the caller instead).
        source.fps = min(count / (source.frame_count / source.native_fps), source.native_fps)
    else:  # the container does not say how long it is: take the first `count` frames
        source.fps = source.native_fps if source.native_fps > 0 else 30.0
    return (frame.image for frame in itertools.islice(source.sampled(), count))


def give_distinct_names(sources: list[FrameSource]) -> list[str]:
    """Rename sources whose names clash (two videos named clip.mp4 in different folders) to clip, clip-2, ...:
    alerts, score traces and annotated videos are named after their source, and two traces of one name
    overwrote each other. Returns the names given (empty: none clashed)."""
    taken = {source.name for source in sources}
    seen: set[str] = set()
    renamed = []
    for source in sources:
        if source.name in seen:
            base, n = source.name, 2
            while f"{base}-{n}" in taken:
                n += 1
            source.name = f"{base}-{n}"
            taken.add(source.name)
            renamed.append(source.name)
        seen.add(source.name)
    return renamed


def open_source(spec: str | Path | int, fps: float) -> FrameSource:
    """A camera index ("0" or 0), a URL or GStreamer pipeline, an image folder, or a video file."""
    if isinstance(spec, bool) or not isinstance(spec, (str, Path, int)):
        raise UserError(f"a source is a path, a camera index or a URL, not a {type(spec).__name__}")
    spec = str(spec)
    if spec.isdigit():
        return LiveSource(int(spec), fps)
    if spec.startswith(URL_PREFIXES) or "!" in spec:  # "!" joins GStreamer pipeline elements
        return LiveSource(spec, fps)
    path = Path(spec)
    if path.is_dir():
        return ImageFolderSource(path, fps)
    if not path.exists():
        raise UserError(f"source {spec} is neither a file, a folder, a camera index nor a URL")
    return VideoFileSource(path, fps)
