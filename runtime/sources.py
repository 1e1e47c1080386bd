"""Frame sources with OpenCV: a video file, an image folder, a camera index or a URL (RTSP/HTTP/GStreamer), and
``open_source``, which picks one for what the user gave.

Sampling by timestamp and the reader thread that every source shares are in ``frame_source``; a live source (a
camera, a URL), reopened with back-off when it disconnects, in ``live_source``.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Iterator
from urllib.parse import urlsplit

import cv2
import numpy as np

from sdqes_edge.contract import MAX_FPS
from sdqes_edge.errors import SourceUnavailable, UserError, is_number
from sdqes_edge.path_checks import unreadable_problem

from .frame_source import NAMED_UNREADABLE_IMAGES, STREAM_TIMEOUT_S, Frame, FrameSource, SourceStats  # noqa: F401  (where callers import them from)
from .live_source import (
    URL_PREFIXES,
    WEB_PREFIXES,
    LiveSource,
    is_gstreamer_pipeline,
    open_capture,
    open_failure_words,
    serves_a_file,
    without_password,
)
from .sampling import STAMP_TOLERANCE_S, frame_order, samples_served, stated_end_time

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".m4v", ".webm")  # what a folder of videos holds (`score`)
OPENCV_LOG_LEVEL_SILENT = 0  # cv::utils::logging::LOG_LEVEL_SILENT, for OpenCV releases without cv2.utils.logging
TRUNCATION_SLACK_FRAMES = 2  # a file may decode this many frames (or 1%) fewer than its container lists


def quiet_opencv_logs() -> None:
    """Silence OpenCV's and FFmpeg's own logs, for an application that reports a source's problems itself.

    Process-wide, so the library never does it on import: the command line calls it; a program embedding the
    runtime decides for itself. OpenCV warns about a camera or file it cannot open, and FFmpeg inside it about a
    damaged file ("moov atom not found"); the runtime says what went wrong in one line. FFmpeg reads its level
    when OpenCV first opens a file, so call this before opening any source.
    """
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    logging_api = getattr(cv2.utils, "logging", None)  # OpenCV 5.0 has only this, 4.8 only cv2.setLogLevel
    if logging_api is not None:
        logging_api.setLogLevel(logging_api.LOG_LEVEL_SILENT)
    else:
        cv2.setLogLevel(OPENCV_LOG_LEVEL_SILENT)


class VideoFileSource(FrameSource):
    """A video file, on disk or served over HTTP(S) (``https://.../clip.mp4``): every sampled frame, at the times
    its container stamps them, to its end."""

    def __init__(self, path: str | Path, fps: float, stream_timeout_s: float = STREAM_TIMEOUT_S):
        """``stream_timeout_s``: how long a served file's open, or its wait for a frame, may take (``open_capture``)."""
        self.url = str(path) if str(path).startswith(WEB_PREFIXES) else None
        self.stream_timeout_s = stream_timeout_s
        served = urlsplit(self.url) if self.url else None
        self.path = Path(served.path) if served else Path(path)
        self.location = self.url or str(self.path)  # what OpenCV opens
        self.shown = without_password(self.location)  # what messages name
        super().__init__(video_file_name(self.location), fps)
        if not self.url and not self.path.is_file():
            raise UserError(f"video {self.path} does not exist")
        capture = open_capture(self.location, stream_timeout_s)
        ok = capture.isOpened() and capture.read()[0]
        self.frame_count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) if ok else 0
        self.native_fps = capture.get(cv2.CAP_PROP_FPS) if ok else 0.0
        self.end_time = stated_end_time(self.frame_count, self.native_fps)
        capture.release()
        if not ok:
            raise UserError(f"OpenCV cannot decode a frame of {self.shown} (unreadable or empty video); check "
                            "it plays, or re-encode it to H.264 mp4 or MJPG avi")

    @property
    def identity(self) -> str:
        if self.url:  # no size to read without fetching it again; its length stands in
            return f"{self.url} ({self.frame_count} frames)"
        return f"{self.path.resolve()} ({self.path.stat().st_size} bytes)"

    @property
    def duration_frames(self) -> int | None:
        """Sampled frames the file will give (for a progress bar), if the container says: the sample times up to
        its last frame's (a bar counting to the file's whole length ended a sample or more short of its total)."""
        if self.frame_count > 0 and self.native_fps > 0:
            last_frame_time = (self.frame_count - 1) / self.native_fps
            return max(0, samples_served(last_frame_time, 0, 1.0 / self.fps) - self.start_index)
        return None

    def _frames(self):
        capture = open_capture(self.location, self.stream_timeout_s)
        native = self.native_fps if self.native_fps > 0 else 30.0
        self.stats.expected = self.frame_count if self.frame_count > 0 else None
        if 0 < self.native_fps < self.fps - STAMP_TOLERANCE_S:
            self.log(f"note: {self.shown} has {self.native_fps:g} frames per second, fewer than the {self.fps:g} "
                     "the bundle samples: each frame is repeated for the sample times it covers, so stream times stay "
                     "true")
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
            self.log(f"warning: {self.stats.shortfall_words(self.shown)}")


class ImageFolderSource(FrameSource):
    """Images in frame order (``frame_order``): one per sampled frame (the folder taken to be sampled at ``fps``
    already), or, given ``images_fps``, image i at time i / images_fps, sampled at ``fps`` by time as a video is (a
    folder the authors' code extracted at 2 fps, into a 1-fps model: every other image)."""

    def __init__(self, folder: str | Path, fps: float, images_fps: float | None = None):
        super().__init__(Path(folder).name, fps)
        if images_fps is not None and (not is_number(images_fps) or not 0 < images_fps <= MAX_FPS):  # NaN too
            raise UserError(f"images_fps is the rate {folder}'s images were taken at, a positive number of frames per "
                            f"second up to {MAX_FPS:g}, not {images_fps!r}")
        self.images_fps = None if images_fps is None else float(images_fps)
        self.folder = Path(folder)
        entries = list(Path(folder).iterdir())
        self.files = sorted((p for p in entries if p.suffix.lower() in IMAGE_SUFFIXES), key=frame_order)
        videos = sorted(p.name for p in entries if p.suffix.lower() in VIDEO_SUFFIXES)
        # A folder of videos given as one source: its one stray image (a plot, a thumbnail) was streamed as the whole
        # stream, a run of one frame that alerted on nothing, without a word.
        if videos and len(self.files) <= len(videos):
            shown = ", ".join(videos[:3]) + (", ..." if len(videos) > 3 else "")
            images = f"{len(self.files)} image{'' if len(self.files) == 1 else 's'}"
            raise UserError(f"{folder} holds {len(videos)} video{'' if len(videos) == 1 else 's'} ({shown}) and "
                            f"{images}: a folder streams its images as frames, so give a video as the source (--source "
                            "once for each), or score a folder of annotated videos with `sdqes-edge score`")
        if not self.files:
            raise UserError(f"{folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")

    @property
    def identity(self) -> str:
        # With its rate where given: a snapshot's sample position is a time, which another rate puts at other images.
        rate = f" at {self.images_fps:g} fps" if self.images_fps is not None else ""
        return f"{self.folder.resolve()} ({len(self.files)} images{rate})"

    @property
    def duration_frames(self) -> int:
        if self.images_fps is None:
            return max(0, len(self.files) - self.start_index)
        return max(0, samples_served((len(self.files) - 1) / self.images_fps, 0, 1.0 / self.fps) - self.start_index)

    def _frames(self):
        numbering = [frame_order(path.with_suffix(""))[0] for path in self.files]  # each name's parts, suffix aside
        self._say_repeated_numbers(numbering)
        self._say_skipped_numbers(numbering)
        period = 1.0 / (self.images_fps or self.fps)
        resumed_at = self.start_index / self.fps - STAMP_TOLERANCE_S
        read = 0  # images read: those from where a resumed run goes on
        for i, path in enumerate(self.files):
            if i * period < resumed_at:  # before where a resumed run goes on: never stepped, so never read
                yield (lambda path=path: self._read(path)), i * period
                continue
            read += 1
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is None:  # the last image of a recorder that was killed, a file of another kind
                self._skip(path)
                continue
            yield (lambda image=image: image), i * period
        if len(self.stats.unreadable) == read > 0:
            raise UserError(f"OpenCV cannot read any image of {self.folder} (the first: {self.stats.unreadable[0]}); "
                            "check they open in an image viewer, or re-save them as JPEG or PNG")

    def _say_repeated_numbers(self, numbering: list[list]) -> None:
        """Images of one number (frame_3.jpg beside frame_3.png, 7.jpg beside 007.jpg: a conversion's leftovers) are
        each a frame: every frame after comes late, each alert's time with it."""
        by_number: dict[tuple, list[str]] = {}
        for parts, path in zip(numbering, self.files):
            by_number.setdefault(tuple(parts), []).append(path.name)
        repeated = [names for names in by_number.values() if len(names) > 1]
        if repeated:
            more = f"; {len(repeated) - 1} more number{'s' if len(repeated) > 2 else ''} repeated" \
                if len(repeated) > 1 else ""
            self.log(f"warning: {self.folder} holds {len(repeated[0])} images of one number ({', '.join(repeated[0])}"
                     f"{more}): each is streamed as a frame of its own, so every frame after comes late; "
                     "keep one image of each number")

    def _say_skipped_numbers(self, numbering: list[list]) -> None:
        """A gap in the images' numbering where the rest go up by one step (frame_2 then frame_5): the images missing
        are no frames, so every frame after comes early, each alert's time with it."""
        numbers = [[value for kind, value, _ in parts if kind == 0] for parts in numbering]  # frame_order's numbers
        if len(numbers) < 3 or not all(numbers):
            return
        last = [found[-1] for found in numbers]
        steps = [later - earlier for earlier, later in zip(last, last[1:]) if later != earlier]
        if not steps or min(steps) < 0:  # numbered in parts (cam1_0001 .. cam2_0001): not one count
            return
        step = Counter(steps).most_common(1)[0][0]
        gaps = [(self.files[i].name, self.files[i + 1].name) for i in range(len(last) - 1)
                if last[i + 1] - last[i] > step]
        if gaps:
            more = f"; {len(gaps) - 1} more gap{'s' if len(gaps) > 2 else ''}" if len(gaps) > 1 else ""
            self.log(f"warning: {self.folder}'s images skip numbers ({gaps[0][0]} then {gaps[0][1]}{more}) where the "
                     f"others go up by {step}: an image missing is no frame, so every frame after comes early; put the "
                     "missing images back, or a copy of the one before")

    def _skip(self, path: Path) -> None:
        """One unreadable image is skipped, the next image stepping in its place, as a video's lost frame is; the
        run used to stop there with an error, after however many thousand images it had stepped."""
        self.stats.unreadable.append(path.name)
        if len(self.stats.unreadable) <= NAMED_UNREADABLE_IMAGES:  # a folder of many: the rest counted at its end
            self.log(f"warning: OpenCV cannot read the image {path}: skipped, the next image steps in its place; "
                     "remove or re-save it")

    @staticmethod
    def _read(path: Path) -> np.ndarray:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise UserError(f"OpenCV cannot read the image {path}; remove or re-save it")
        return image


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


def video_file_name(location: str) -> str:
    """A video file's name in alerts and output files: its stem (kitchen.mp4 -> kitchen), a served file's too
    (https://host/videos/kitchen.mp4?token=... -> kitchen), else the site's host; the native runtime names its
    files alike (tests/vectors/source_names.json)."""
    served = urlsplit(location) if location.startswith(WEB_PREFIXES) else None
    return PurePosixPath(served.path if served else location).stem or (served.hostname if served else "") or "video"


def is_device_file(path: Path) -> bool:
    """A character device (/dev/video0, and the links udev makes to it): a camera, read live. It was opened as a
    video file: frames stamped as a file's, none dropped while the model was busy, no reconnection."""
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name longer than a file's may be (a long GStreamer pipeline) names no file
        return False


def source_kind(spec: str) -> str:
    """What a --source names, before anything is opened: "camera" (an index), "web" (an HTTP(S) URL: a live stream
    or a video file, told apart once opened), "stream" (an RTSP/UDP/TCP URL, a GStreamer pipeline that names no
    file: clip!.mp4 is a file), "missing camera" (a path under /dev that is not there: a camera not yet plugged in),
    "missing", "folder", "device" (a camera by its device file: a service names it by /dev/v4l/by-id/..., which,
    unlike its index, stays its own when cameras are plugged in another order) or "file". The native sdqes-run
    decides alike (tests/vectors/source_kinds.json)."""
    if spec.isascii() and spec.isdigit():  # "²" is a digit to str.isdigit, and no camera index to int()
        return "camera"
    if spec.startswith(WEB_PREFIXES):
        return "web"
    path = Path(spec)
    exists = _exists(path)
    if spec.startswith(URL_PREFIXES) or (is_gstreamer_pipeline(spec) and not exists):
        return "stream"
    if not exists:
        return "missing camera" if path.parts[:2] == ("/", "dev") else "missing"
    if path.is_dir():
        return "folder"
    return "device" if is_device_file(path) else "file"


def open_source(spec: str | Path | int, fps: float, stream_timeout_s: float = STREAM_TIMEOUT_S,
                images_fps: float | None = None) -> FrameSource:
    """A camera index ("0" or 0), a URL or GStreamer pipeline, an image folder, or a video file. ``stream_timeout_s``:
    how long a stream URL's open, or its wait for a frame, may take (``open_capture``). ``images_fps``: the rate an
    image folder's images were taken at (default: one image per sample); refused for any other source."""
    if isinstance(spec, bool) or not isinstance(spec, (str, Path, int)):
        raise UserError(f"a source is a path, a camera index or a URL, not a {type(spec).__name__}")
    spec = str(spec)
    if not spec.strip():  # an unset shell variable ("$VIDEO"): Path("") is ".", whose images were streamed
        raise UserError("the source is empty; give a video file, an image folder, a camera index or a URL")
    kind, path = source_kind(spec), Path(spec)
    if images_fps is not None and kind != "folder":  # a video's own timestamps say when its frames were taken
        raise UserError(f"images_fps is the rate of an image folder's images; source {spec} is no folder: leave it out")
    unreadable = unreadable_problem(path) if kind in ("missing", "file") else None
    if unreadable:  # a service's user given a video root keeps: it was "neither a file, ..." or "cannot decode"
        raise UserError(f"source {spec} {unreadable}; give a video this user may read")
    if kind == "camera":
        return LiveSource(int(spec), fps)
    if kind == "web":
        return _open_web_source(spec, fps, stream_timeout_s)
    if kind in ("stream", "device"):
        return LiveSource(spec if kind == "stream" else str(path), fps, stream_timeout_s=stream_timeout_s)
    if kind == "missing camera":  # the machine's state, which a service manager's restart may mend (exit 1, not 2)
        raise SourceUnavailable(open_failure_words(spec))
    if kind == "missing":
        raise UserError(f"source {spec} is neither a file, a folder, a camera index nor a URL")
    if kind == "folder":
        return ImageFolderSource(path, fps, images_fps)
    if path.suffix.lower() in IMAGE_SUFFIXES:  # OpenCV opens it as a one-frame video: one score, no event start
        raise UserError(f"source {spec} is a still image; the model watches frames over time for the moment an "
                        f"event starts: give a video, a camera or a URL, or the folder of frames ({path.parent}) "
                        "to stream its images in order")
    return VideoFileSource(path, fps)


def unopened_live_source(spec: str | int, fps: float, stream_timeout_s: float = STREAM_TIMEOUT_S) -> LiveSource:
    """The camera or stream ``spec`` names (one ``open_source`` found absent), not opened: its reading begins by
    reconnecting (a camera of several, the others streaming meanwhile)."""
    spec = str(spec)
    return LiveSource(int(spec) if source_kind(spec) == "camera" else spec, fps, opened=False,
                      stream_timeout_s=stream_timeout_s)


def _open_web_source(url: str, fps: float, stream_timeout_s: float) -> FrameSource:
    """An HTTP(S) URL serves a live stream (an IP camera's MJPEG) or a video file (``https://.../clip.mp4``), told
    apart by what its container says: a file lists its frames, a live stream none. Read as a live stream, a file was
    stamped by the wall clock as it decoded (the whole video in moments, most frames dropped) and, at its end,
    "reconnected" to play again from its start, forever."""
    capture = open_capture(url, stream_timeout_s)
    if not capture.isOpened():
        capture.release()
        raise SourceUnavailable(open_failure_words(url))
    if serves_a_file(url, capture):
        capture.release()
        return VideoFileSource(url, fps, stream_timeout_s)
    return LiveSource(url, fps, capture=capture, stream_timeout_s=stream_timeout_s)
