"""A live source: a camera index or a stream URL (RTSP/HTTP, a GStreamer pipeline), read with OpenCV."""

from __future__ import annotations

import functools
import itertools
import os
import re
import threading
import time
from pathlib import PurePosixPath
from urllib.parse import urlsplit

import cv2

from sdqes_edge.errors import SourceUnavailable, UserError

from .frame_source import STREAM_TIMEOUT_S, FrameSource

RECONNECT_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # back-off between attempts; then the source gives up
URL_PREFIXES = ("rtsp://", "rtsps://", "http://", "https://", "udp://", "tcp://")
WEB_PREFIXES = ("http://", "https://")  # what serves a live stream (an IP camera's MJPEG) or a video file alike
GSTREAMER_LINK = "!"  # joins a GStreamer pipeline's elements: "nvarguscamerasrc ! ... ! appsink"
NAME_LIMIT = 64  # characters of a stream's name: it names output files (out.NAME.mp4, NAME.npz)
HIDDEN_PASSWORD = "***"


def is_stream_url(target: int | str) -> bool:
    """A URL, which OpenCV's FFmpeg opens (RTSP, HTTP(S), UDP, TCP): not a camera, a file or a GStreamer pipeline."""
    return isinstance(target, str) and target.startswith(URL_PREFIXES)


def open_capture(target: int | str, timeout_s: float = STREAM_TIMEOUT_S) -> cv2.VideoCapture:
    """``cv2.VideoCapture(target)``; a stream URL through FFmpeg with open and read timeouts of ``timeout_s``, where
    this OpenCV has FFmpeg (pip's wheels do). Given to FFmpeg alone: a backend that does not know the timeouts refuses
    to open with them."""
    if is_stream_url(target) and cv2.videoio_registry.hasBackend(cv2.CAP_FFMPEG):
        milliseconds = int(timeout_s * 1000)
        return cv2.VideoCapture(target, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, milliseconds,
                                                         cv2.CAP_PROP_READ_TIMEOUT_MSEC, milliseconds])
    if isinstance(target, str) and os.path.isfile(target):  # not a camera's device file: FFmpeg reads /dev/video0
        return open_video_file(target)
    return cv2.VideoCapture(target)


def open_video_file(path: str | os.PathLike) -> cv2.VideoCapture:
    """A video file opened by the readers OpenCV would try, in its order, but its own MJPEG AVI reader where it has
    FFmpeg, which reads every file that one does: for a file FFmpeg cannot open (cut off, damaged) that reader printed
    its complaint straight to stderr, past every log level ("Unexpected element. Expected: LIST. Got: ...", bytes of
    the file among the words), above the one-line error that says what is wrong with the file."""
    path = os.fspath(path)
    registry = cv2.videoio_registry
    if not registry.hasBackend(cv2.CAP_FFMPEG):
        return cv2.VideoCapture(path)
    capture = cv2.VideoCapture(path, cv2.CAP_FFMPEG)
    for backend in registry.getStreamBackends():
        if capture.isOpened():
            break
        if backend not in (cv2.CAP_FFMPEG, cv2.CAP_OPENCV_MJPEG):
            capture = cv2.VideoCapture(path, backend)
    return capture


def is_gstreamer_pipeline(target: int | str) -> bool:
    return isinstance(target, str) and GSTREAMER_LINK in target and not is_stream_url(target)


def is_device_path(target: int | str) -> bool:
    """A live target given as a file path: a camera's device file (``open_source`` opens one live)."""
    return isinstance(target, str) and target.startswith("/")


def without_password(url: str) -> str:
    """``url`` as messages show it: an IP camera's RTSP URL carries its password (rtsp://admin:PASSWORD@host/...),
    which a log line in the journal must not."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    if not at or ":" not in user:
        return url
    return url.replace(parts.netloc, f"{user.split(':', 1)[0]}:{HIDDEN_PASSWORD}@{host}", 1)  # the rest as given


def live_source_name(target: int | str) -> str:
    """A camera's or stream's name in alerts, logs and the names of its output files: camera0; a camera's device
    file's name (/dev/v4l/by-id/usb-046d_C920_8D2F-video-index0 -> usb-046d_C920_8D2F-video-index0); a URL's host, port,
    path and query (rtsp://admin:pw@10.0.0.5:554/cam/realmonitor?channel=1 -> 10.0.0.5-554-cam-realmonitor-channel-1:
    channels of one recorder told apart, the password left out); a GStreamer pipeline's first element with its
    properties (nvarguscamerasrc-sensor-id-0). The whole URL named them: a score trace went into folders
    'rtsp:/admin:pw@10.0.0.5:554/...', and the password into every alert line."""
    if isinstance(target, int):
        return f"camera{target}"
    if is_device_path(target):
        words = PurePosixPath(target).name
    elif is_gstreamer_pipeline(target):
        words = target.split(GSTREAMER_LINK, 1)[0]
    else:
        parts = urlsplit(target)
        words = " ".join((parts.netloc.rpartition("@")[2], parts.path, parts.query))
    return re.sub(r"[^A-Za-z0-9._]+", "-", words).strip("-.")[:NAME_LIMIT].rstrip("-.") or "stream"


@functools.lru_cache(maxsize=None)
def opencv_has_gstreamer() -> bool:
    """Whether this OpenCV was built with GStreamer ("GStreamer: YES (1.20.3)" in its build information). pip's
    opencv-python wheels never are; JetPack's OpenCV is."""
    found = re.search(r"GStreamer:\s*(\S+)", cv2.getBuildInformation())
    return bool(found) and found.group(1).upper() != "NO"


def open_failure_words(target: int | str) -> str:
    """Why OpenCV could not open ``target``, and what to check, in one line."""
    if is_gstreamer_pipeline(target):
        if not opencv_has_gstreamer():
            return (f"this OpenCV ({cv2.__version__}) was built without GStreamer, so it cannot run the pipeline "
                    f"{target!r} (pip's opencv-python wheels never have it); use an OpenCV built with GStreamer (on "
                    "a Jetson, JetPack's own), or give a camera index or a stream URL")
        return (f"OpenCV cannot open the GStreamer pipeline {target!r}; check it runs in gst-launch-1.0 and ends in "
                "appsink (OpenCV takes its frames there, as BGR)")
    if isinstance(target, int) or is_device_path(target):
        camera = f"index {target}" if isinstance(target, int) else target
        return (f"OpenCV cannot open camera {camera}; check it is connected (ls /dev/video*) and that no other "
                "program holds it")
    shown = without_password(target)
    return (f"OpenCV cannot open stream {shown}; check the URL plays (ffplay '{shown}', with the password) from "
            "this machine: the server is up, the path and any credentials are right, and no firewall is in the way")


def serves_a_file(target: int | str, capture: cv2.VideoCapture) -> bool:
    """Whether ``target``, opened in ``capture``, is an HTTP(S) URL serving a video file rather than a live stream
    (an IP camera's MJPEG): a file's container counts its frames, a live stream's none (FFmpeg reports 0, or a large
    negative)."""
    return isinstance(target, str) and target.startswith(WEB_PREFIXES) and capture.get(cv2.CAP_PROP_FRAME_COUNT) > 0


def serves_a_file_words(target: str, reopened: bool) -> str:
    """Why a live source refuses ``target``, which serves a video file: ``reopened``, one taken for a camera when it
    could not be opened at the start of a run; else one given to ``LiveSource`` itself."""
    why = ("it could not be opened when the run started, so it was taken for a camera; start the run again to read "
           "it as the file it is" if reopened else "open it with open_source, which reads a served file as a file")
    return (f"{without_password(target)} serves a video file, not a live stream, and a live source would stamp its "
            f"frames by the clock, drop most of them and replay it forever: {why}")


class Cameras:
    """The cameras of one run that keep trying when lost (``open_sources``: a run of several cameras), rather than
    give up: each goes on trying while another of them still sends, since ending the run would cut that one off.
    Once every one is lost, they give up together and the run ends (exit 1), for a service manager to restart it
    cleanly: stepping nothing, it would be killed by systemd's watchdog (``WatchdogSec``), its outputs unfinished."""

    def __init__(self, sources: list["LiveSource"]):
        self._lock = threading.Lock()
        self._count, self._lost = len(sources), set()
        for source in sources:
            source.cameras = self

    def lost(self, source: "LiveSource") -> None:
        with self._lock:
            self._lost.add(source)

    def found(self, source: "LiveSource") -> None:
        with self._lock:
            self._lost.discard(source)

    def all_lost(self) -> bool:
        with self._lock:
            return len(self._lost) >= self._count


class LiveSource(FrameSource):
    """A camera (its index, or its device file: /dev/video0, /dev/v4l/by-id/...) or a stream URL: stamped by the wall
    clock, reopened with back-off when it drops."""

    live = True

    def __init__(self, target: int | str, fps: float, reconnect_delays: tuple[float, ...] = RECONNECT_DELAYS_S,
                 capture: cv2.VideoCapture | None = None, opened: bool = True,
                 stream_timeout_s: float = STREAM_TIMEOUT_S):
        """``capture``: the target already opened (``open_source`` looked at what a URL serves): opening it again
        is a second connection, which an IP camera that takes one client at a time refuses. ``opened=False``: not
        opened here; its reading begins by reconnecting (a camera of several that was not there at the start).
        ``stream_timeout_s``: how long a stream URL's open, or its wait for a frame, may take (``open_capture``)."""
        super().__init__(live_source_name(target), fps)
        self.target = target
        self.reconnect_delays = reconnect_delays
        self.stream_timeout_s = stream_timeout_s
        # The run's cameras, where this one is tried again every last delay when lost, rather than given up, while
        # another of them sends (Cameras). A run of several cameras (open_sources), which the others keep going:
        # given up, a camera back a minute later stayed lost until the run was restarted.
        self.cameras: Cameras | None = None
        self._interrupted = threading.Event()  # the reader was stopped: no more back-off waits or attempts
        if is_gstreamer_pipeline(target) and not opencv_has_gstreamer():  # refused without trying: OpenCV
            raise UserError(open_failure_words(target))                    # would only fail to open it
        capture = capture or (self._open(reopened=False) if opened else None)
        if capture is None and opened:
            raise SourceUnavailable(open_failure_words(target))
        self._capture = capture

    def _open(self, reopened: bool = True):
        """The target opened -> its capture, or None where it cannot be. An HTTP(S) URL that serves a video file
        (one that could not be opened when a run of cameras started, so taken for a camera) is refused: a live
        source never plays a file."""
        capture = open_capture(self.target, self.stream_timeout_s)
        if not capture.isOpened():
            capture.release()
            return None
        if serves_a_file(self.target, capture):
            capture.release()
            self.stats.reconnecting = False  # not lost: refused, and the error says why (not "being reconnected")
            # Taken for a camera, a restart mends it (exit 1); given to LiveSource itself, it is the caller's mistake.
            raise (SourceUnavailable if reopened else UserError)(serves_a_file_words(self.target, reopened))
        return capture

    def close(self) -> None:
        if self._capture is not None:
            self._capture.release()
            self._capture = None

    @property
    def duration_frames(self) -> None:
        return None

    @property
    def keep_trying(self) -> bool:
        return self.cameras is not None

    def lost_words(self) -> str | None:
        return self.stats.lost_words(self.name, kept_trying=self.keep_trying)

    def interrupt(self) -> None:
        self._interrupted.set()

    def _frames(self):
        capture, start = self._capture, time.monotonic()
        self._capture = None  # the reader's now, released where it ends
        try:
            while True:
                ok, image = capture.read() if capture is not None else (False, None)
                if ok:
                    yield (lambda image=image: image), time.monotonic() - start
                    continue
                if capture is not None:
                    capture.release()
                capture = self._reconnect()
                if capture is None:
                    return
        finally:
            if capture is not None:
                capture.release()

    def _reconnect(self) -> cv2.VideoCapture | None:
        """The target reopened after each back-off delay in turn; None once they are spent in vain (the source is
        lost: ``stats.gave_up_after``), or when the reader is stopped. Where ``keep_trying``, a lost source is
        tried again every last delay, and found again if it comes back, until every camera of the run is lost."""
        tries, every = len(self.reconnect_delays), self.reconnect_delays[-1]
        self.stats.reconnecting = True
        delays = itertools.chain(self.reconnect_delays, itertools.repeat(every) if self.keep_trying else ())
        for attempt, delay in enumerate(delays, 1):
            if attempt <= tries:
                self.log(f"{self.name}: no frame; reconnecting in {delay:g} s (attempt {attempt} of {tries})")
            elif self.cameras.all_lost():
                self.log(f"{self.name}: gave up: every camera of the run is lost")
                return None
            if self._interrupted.wait(delay):
                return None
            capture = self._open()
            if capture is not None:
                self.stats.reconnects += 1
                self.stats.gave_up_after, self.stats.reconnecting = 0, False
                if self.cameras:
                    self.cameras.found(self)
                self.log(f"{self.name}: reconnected")
                return capture
            if attempt == tries:
                self._lost(tries, every)
        return None

    def _lost(self, tries: int, every: float) -> None:
        self.stats.gave_up_after = tries
        attempts = f"{tries} attempt{'' if tries == 1 else 's'}"
        if not self.cameras:
            self.log(f"{self.name}: gave up after {attempts}")
            return
        self.cameras.lost(self)
        self.log(f"{self.name}: lost after {attempts}; tried again every {every:g} s while another camera sends")
