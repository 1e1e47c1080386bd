"""The stream as a video: each frame with a score bar per query and a banner while an alert is fresh, written
with OpenCV and read back when it closes (OpenCV's writer reports no error, and a cut-off mp4 has no index)."""

from __future__ import annotations

import calendar
import functools
import glob
import logging
import math
import re
import shutil
import time
import warnings
from numbers import Real
from pathlib import Path
from typing import Callable

import cv2
import numpy as np

from sdqes_edge.errors import SetupWarning, UserError
from sdqes_edge.files import UTC_STAMP_FORMAT, format_bytes, free_name, make_folders, set_aside, utc_stamp
from sdqes_edge.path_checks import ANNOTATED_VIDEO_EXAMPLE, check_output_file, output_path_refused

from .disk_space import LowDiskWatch
from .live_source import open_video_file
from .ordered_calls import OrderedCalls
from .output_locks import ANNOTATED_VIDEO, hold, release
from .sampling import checked_rate
from .score_bars import BANNER_PIXELS, draw_score_bars
from .sinks import Sink, checked_stream

# A segmented video's news (a segment the machine cut off or refused, then segments whole again): to this logger
# unless a program sets the sink's own ``log`` (the command line prints each as one line).
ANNOTATION_LOG = logging.getLogger("sdqes_edge.runtime.annotated_video")

# The containers OpenCV's FFmpeg writer opens, and the codec each is written with (checked up front:
# VideoWriter silently writes nothing for any other name).
ANNOTATION_CODECS = {".avi": "MJPG", ".mp4": "mp4v", ".m4v": "mp4v", ".mov": "mp4v", ".mkv": "mp4v"}


def check_annotation_path(path: str | Path, flag: str = "--annotate") -> Path:
    path = Path(path)
    with output_path_refused(flag, path):
        folder = path.is_dir()
    if path.suffix.lower() not in ANNOTATION_CODECS and not folder:  # a folder: named as one below
        kinds = ", ".join(ANNOTATION_CODECS)
        raise UserError(f"{flag} {path}: OpenCV writes videos as {kinds}; give a file name ending in one of "
                        f"them (e.g. {path.with_suffix('.mp4') if path.suffix else str(path).rstrip('.') + '.mp4'})")
    return check_output_file(path, flag, ANNOTATED_VIDEO_EXAMPLE)


# Frames an annotated video's writer thread may have waiting: past them a frame waits for room, so that the encoder,
# when it is the slower, sets the pace as it did when it ran on the stepping thread (every frame is written).
QUEUED_FRAMES = 3


class BackgroundWriter:
    """A ``cv2.VideoWriter`` fed by a thread of its own (``OrderedCalls``), in the order given, every frame written:
    the encoding no longer holds the step that made the frame (on this 2-core CPU, a 1280x720 frame took 4.2 ms in
    mp4v and 18 ms as MJPG, a 1920x1080 one 9.9 and 40; the step a GPU makes of it, a few ms). What the encoder
    raised is raised by the next ``write`` or by ``release``."""

    def __init__(self, writer):
        self._writer = writer
        # A daemon: the run closes its sinks (release) on every way out; a second Ctrl-C, which stops it at once,
        # leaves a video unfinished as it did before.
        self._encoder = OrderedCalls("annotated-video-writer", QUEUED_FRAMES, daemon=True)

    def write(self, image: np.ndarray) -> None:
        """Hand ``image`` over (not to be changed after): it is written after the frames before it."""
        self._encoder.call(functools.partial(self._writer.write, image))

    def release(self) -> None:
        """Write every frame handed over, then close the video."""
        self._encoder.close()
        try:
            self._encoder.join()
        finally:
            self._writer.release()


def frames_read_back(path: Path) -> int:
    """The frames a video just written holds (0: it cannot be opened): OpenCV's writer reports no error, so a disk
    that filled up is found here. Opened quietly (``open_video_file``): a cut-off file is what this looks for. The
    container's count is taken where its last frame can be read; OpenCV's own AVI writer puts the count of frames
    it was given in the header (a part of the file already on disk), frames the disk refused among them, so a file
    whose last frame cannot be read has its frames counted one by one (a cut-off file only)."""
    check = open_video_file(path)
    try:
        listed = int(check.get(cv2.CAP_PROP_FRAME_COUNT)) if check.isOpened() else 0
        if listed <= 0 or (check.set(cv2.CAP_PROP_POS_FRAMES, listed - 1) and check.grab()):
            return max(listed, 0)
    finally:
        check.release()
    check, readable = open_video_file(path), 0
    try:
        while readable < listed and check.grab():
            readable += 1
        return readable
    finally:
        check.release()


# The largest file FAT32 holds (an SD card's usual format up to 32 GB): a long video annotated onto one stops there.
FAT32_LARGEST_FILE = 2**32 - 1


def incomplete_video_words(path: Path, written: int, readable: int, then: str = ", and run again",
                           what: str = "the annotated video") -> str:
    """Why a video that reads back short was cut off, and what to do: a full disk, or a file at FAT32's largest.
    ``then``: what follows the advice (a live stream's segment is tried again as the next begins)."""
    size = path.stat().st_size if path.is_file() else 0
    words = f"{what} {path} is incomplete: {written} frames were written and {readable} can be read back"
    if size >= FAT32_LARGEST_FILE - (8 << 20):  # within a few frames of the limit (a 4K MJPG frame: 1-2 MB)
        return (f"{words} ({format_bytes(size)}, the most a file holds on FAT32); write it in parts "
                f"(--annotate-segment SECONDS) or to a disk formatted exFAT or ext4{then}")
    free = shutil.disk_usage(path.parent).free
    return f"{words} ({format_bytes(free)} free on its disk); free some space or write it to another disk{then}"


class IncompleteOutput(UserError):
    """An output the machine would not let us finish (a full disk): exit 1, as the command line's disk-full
    error, since the user's input was fine."""

    exit_code = 1


def segment_path(path: Path, started: float) -> Path:
    """annotated.mp4 -> annotated.20261128T031502Z.mp4: a segment named for the wall-clock time (UTC) it starts."""
    return path.with_name(f"{path.stem}.{utc_stamp(started)}{path.suffix}")


def segments_begun_before(path: Path, moment: float) -> list[Path]:
    """The segments of ``path`` (``segment_path``'s names, this run's or an earlier one's) begun before ``moment``,
    told by the time in their names, not by the file system's times (a copy or a restore changes those)."""
    pattern = re.compile(rf"^{re.escape(path.stem)}\.(\d{{8}}T\d{{6}}Z)(-\d+)?{re.escape(path.suffix)}$")
    old = []
    for candidate in path.parent.glob(f"{glob.escape(path.stem)}.*{glob.escape(path.suffix)}"):
        named = pattern.match(candidate.name)
        if named and calendar.timegm(time.strptime(named.group(1), UTC_STAMP_FORMAT)) < moment:
            old.append(candidate)
    return sorted(old)


class AnnotatedVideoSink(Sink):
    """The stream as a video with a score bar per query and a banner while an alert is fresh.

    With ``segment_seconds``, in files of that much stream time each (``segment_path``), each finished and checked
    as the next begins: a video is playable only once it is closed (an mp4's index is written last, and OpenCV
    buffers even an avi's frames), so a live stream's one video, growing for weeks, was lost whole to a power cut
    or a kill, and could not be watched while the stream ran."""

    BANNER_SECONDS = 2.0
    MIN_HEIGHT = 360  # smaller frames are enlarged (whole pixels) so that the bars and text stay readable
    # ... but never past 4K UHD's width, which players decode: a 2048x1 line-scan camera's frames became 737,280
    # pixels wide. Frames that wide are shown at their size (or enlarged as far as fits), between black bars.
    MAX_ENLARGED_WIDTH = 3840

    def __init__(self, path: str | Path, fps: float, thresholds: Callable[[], dict[str, float]], stream: int = 0,
                 segment_seconds: float | None = None, first_frame: int = 0, keep_seconds: float | None = None,
                 resumed: bool = False):
        """``stream``: which of the detector's streams this video shows (one sink per stream to annotate).
        ``first_frame``: the frame a resumed file goes on at; the video at ``path`` (the stopped run's) gives the
        frames before it, so that the resumed run leaves one whole video, as it leaves one whole score trace.
        ``resumed``: this run goes on from a state snapshot, so a video already at ``path`` is the stopped run's: never
        written over (set aside where it cannot be gone on from: a camera, another file).
        ``keep_seconds``: with segments, those begun longer ago than this (this run's and earlier runs') are removed
        as each new one begins, so that a camera watched for months does not fill its disk; None keeps them all."""
        self.path = check_annotation_path(path, "AnnotatedVideoSink")
        for name, seconds in (("segment_seconds", segment_seconds), ("keep_seconds", keep_seconds)):
            if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, Real)
                                        or not 0 < seconds < math.inf):
                raise UserError(f"AnnotatedVideoSink's {name} is a positive number of seconds (or None), not "
                                f"{seconds!r}")
        self.segment_seconds, self.keep_seconds = segment_seconds, keep_seconds
        self.first_frame, self.resumed = first_frame, resumed or first_frame > 0
        self.written: list[Path] = []  # the videos finished, in order
        self.incomplete: list[Path] = []  # of those, the segments the machine cut off (said as each run of them began)
        self.log: Callable[[str], None] = ANNOTATION_LOG.warning
        # Segments refused in a row (cut off, or not begun): said as the first is, and once whole again.
        self._refused_in_a_row = 0
        # This run's segments and when each began by the clock that never jumps (``_remove_expired``).
        self._begun: dict[Path, float] = {}
        self._segment_start = 0.0  # stream time of the open video's first frame
        self.fps = checked_rate(fps, "AnnotatedVideoSink writes")
        self.stream = checked_stream(stream, "AnnotatedVideoSink")
        if not callable(thresholds):  # it is asked every frame, for the thresholds of the queries then active
            raise UserError(f"AnnotatedVideoSink takes thresholds as a function (detector.thresholds), not a "
                            f"{type(thresholds).__name__}")
        self.thresholds = thresholds
        self._writer = None
        self._size: tuple[int, int] | None = None  # (width, height) of the video, set by its first frame
        self._first_shape: tuple[int, int] | None = None  # the first frame's (height, width), enlarged by _scale
        self._scale = 1
        self._written = 0
        self._read_back = 0  # the frames the last video finished reads back
        self._started = False  # a video was begun: later segments are the machine's to refuse (_next_segment)
        self._banner: tuple[str, float] | None = None
        self._disk = LowDiskWatch(self.path, "the annotated video", "OpenCV's writer says nothing of a full disk, so "
                                  "the video would be cut off without a word until it closes: free some space, or "
                                  "write it to another disk", lambda message: self.log(message))
        self._lock = hold(self.path, "AnnotatedVideoSink", ANNOTATED_VIDEO)  # another process's: refused

    def _canvas(self, frame_bgr: np.ndarray) -> np.ndarray:
        """The frame at the video's size, which the first frame sets (small frames enlarged by whole pixels, as far as
        MAX_ENLARGED_WIDTH allows).
        A frame of another size (an image folder of mixed sizes, a camera that renegotiates) is fitted inside it,
        centred between black bars: OpenCV's writer silently drops every frame whose size differs from its own."""
        fh, fw = frame_bgr.shape[:2]
        if self._size is None:
            self._first_shape = (fh, fw)
            self._scale = max(1, min(-(-self.MIN_HEIGHT // fh), self.MAX_ENLARGED_WIDTH // fw))  # ceil: 96 -> 384 px
            self._size = (fw * self._scale, max(fh * self._scale, self.MIN_HEIGHT))
        if (fh, fw) == self._first_shape and fh * self._scale == self._size[1]:  # not between bars
            return frame_bgr.copy() if self._scale == 1 else cv2.resize(
                frame_bgr, None, fx=self._scale, fy=self._scale, interpolation=cv2.INTER_NEAREST)
        w, h = self._size
        scale = min(w / fw, h / fh)
        inner_w, inner_h = min(w, max(1, round(fw * scale))), min(h, max(1, round(fh * scale)))
        smooth = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
        inner = cv2.resize(frame_bgr, (inner_w, inner_h), interpolation=smooth)
        image = np.zeros((h, w, 3), np.uint8)
        top, left = (h - inner_h) // 2, (w - inner_w) // 2
        image[top:top + inner_h, left:left + inner_w] = inner
        return image

    def on_frame(self, stream, frame_bgr, time_s, probs, events):
        if stream != self.stream:
            return
        image = self._canvas(frame_bgr)
        h, w = image.shape[:2]
        if self._started and self.segment_seconds and time_s - self._segment_start >= self.segment_seconds:
            self._next_segment(w, h, time_s)  # this segment finished and checked; the next begins with this frame
        if self._writer is None:
            if self._refused_in_a_row:
                return  # this segment could not be begun (said): tried again when its time is up
            self._open(w, h, time_s)
            self._started = True
        draw_score_bars(image, probs, self.thresholds())
        if events:
            self._banner = (events[-1].message, time_s)
        if self._banner and time_s - self._banner[1] <= self.BANNER_SECONDS:
            cv2.rectangle(image, (0, 0), (w, BANNER_PIXELS), (0, 0, 200), -1)
            cv2.putText(image, self._banner[0][:80], (8, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (255, 255, 255), 1)
        self._writer.write(image)
        self._written += 1
        self._disk.check()

    def _remove_expired(self) -> None:
        """Remove the segments begun over ``keep_seconds`` ago: an earlier run's told by the time in their names, this
        run's by the monotonic clock. A device without a clock battery boots on the time it last saved, and moves
        it on by days once it reaches a time server: by their names alone, the segments it began before were
        removed as days old minutes after they were written."""
        now, keep = time.monotonic(), self.keep_seconds
        for old in segments_begun_before(self.path, time.time() - keep):
            if old not in self._begun:
                old.unlink(missing_ok=True)
        for mine, begun in list(self._begun.items()):
            if now - begun >= keep:
                mine.unlink(missing_ok=True)
                del self._begun[mine]

    def _open(self, w: int, h: int, time_s: float) -> None:
        if self.segment_seconds and self.keep_seconds:
            self._remove_expired()
        # Two segments begun within one second (a short segment_seconds, a file streamed fast): NAME-2.EXT
        self._path = free_name(segment_path(self.path, time.time())) if self.segment_seconds else self.path
        if self.segment_seconds and self.keep_seconds:
            self._begun[self._path] = time.monotonic()
        make_folders(self._path.parent)  # as every other output: missing folders are made
        stopped_run = (set_aside(self._path, "stopped-run")
                       if self.resumed and not self.segment_seconds and self._path.is_file() else None)
        codec = ANNOTATION_CODECS.get(self.path.suffix.lower())
        writer = (cv2.VideoWriter(str(self._path), cv2.VideoWriter_fourcc(*codec), self.fps, (w, h))
                  if codec else None)
        if writer is None or not writer.isOpened():
            raise UserError(f"OpenCV could not open {self._path} for writing a {w}x{h} video; give a path ending "
                            f"in {', '.join(ANNOTATION_CODECS)} in a folder you can write to")
        self._writer, self._segment_start, self._written = BackgroundWriter(writer), time_s, 0
        if stopped_run is not None:
            self._carry_over(stopped_run, w, h)

    def _carry_over(self, stopped_run: Path, w: int, h: int) -> None:
        """The stopped run's frames before ``first_frame``, copied in first (decoded and written again: OpenCV copies
        no stream as it is); its video removed once whole in the new one. A resumed run overwrote it, and the
        stream's beginning was lost. One that holds fewer (a killed run's mp4 has no index) is kept, and said, as is
        one of a stream this run starts at its beginning (a camera, another file)."""
        if not self.first_frame:
            warnings.warn(f"{self._path} starts its stream at the beginning, and the stopped run's annotated video is "
                          f"kept as {stopped_run}", SetupWarning, stacklevel=4)
            return
        video, copied = open_video_file(stopped_run), 0
        while copied < self.first_frame:
            ok, image = video.read()
            if not ok:
                break
            self._writer.write(image if image.shape[:2] == (h, w) else cv2.resize(image, (w, h)))
            copied += 1
        video.release()
        self._written += copied
        if copied == self.first_frame:
            stopped_run.unlink()
            return
        warnings.warn(f"the annotated video of the stopped run holds {copied} of the {self.first_frame} frames "
                      f"before this run goes on: it is kept as {stopped_run}, and {self._path} goes on from those "
                      f"{copied}", SetupWarning, stacklevel=4)

    def _next_segment(self, w: int, h: int, time_s: float) -> None:
        """Finish this segment and begin the next. One the machine cuts off (a full disk) or will not let begin (a
        disk gone read-only) is said and the stream goes on alerting, its video tried again as each segment's time
        comes: the run had ended there, and the camera was unwatched while a service restarted into the same full
        disk. Said once however many are refused in a row, and said again once a segment is written whole."""
        whole = self._finish()
        if whole is False:
            self._refused(incomplete_video_words(self._path, self._written, self._read_back, then=""))
        elif whole and self._refused_in_a_row:
            self.log(f"note: the annotated video is written whole again from {self.written[-1]}, after "
                     f"{self._refused_in_a_row} segment{'s' if self._refused_in_a_row > 1 else ''} refused (said "
                     "above)")
            self._refused_in_a_row = 0
        try:
            self._open(w, h, time_s)
        except (UserError, OSError) as refusal:
            self._segment_start = time_s  # this segment's frames go unwritten; the next is tried when its time comes
            reason = refusal.strerror if isinstance(refusal, OSError) else "OpenCV could not open it for writing"
            if self.path.parent.is_dir():
                reason += f", {format_bytes(shutil.disk_usage(self.path.parent).free)} free on its disk"
            self._refused(f"cannot begin the annotated video segment {self._path} ({reason}); free some space or make "
                          "its folder writable")

    def _refused(self, words: str) -> None:
        if not self._refused_in_a_row:
            keep = "" if self.keep_seconds else " (--annotate-keep HOURS removes old segments as new ones begin)"
            self.log(f"warning: {words}{keep}; the stream goes on, and a new segment is tried every "
                     f"{self.segment_seconds:g} s")
        self._refused_in_a_row += 1

    def close(self) -> None:
        """Finish the video (or segment) and read its frame count back: OpenCV's writer reports no error, so a disk
        that filled up left an mp4 without its index (unplayable) while the run said it was written. Segments still
        refused when the stream ends are the run's error, as a cut-off video is."""
        try:
            self._close()
        finally:
            release(self._lock)
            self._lock = None  # a second close lets go of nothing

    def _close(self) -> None:
        if self._writer is None and self._refused_in_a_row:
            refused, self._refused_in_a_row = self._refused_in_a_row, 0
            raise IncompleteOutput(f"the annotated video's last {refused} segment{'s' if refused > 1 else ''} of "
                                   f"{self.path} could not be written (said above); free some space or write it to "
                                   "another disk, and run again")
        if self._finish() is False:
            raise IncompleteOutput(incomplete_video_words(self._path, self._written, self._read_back))

    def _finish(self) -> bool | None:
        """Close the open video and read it back -> whether it is whole (None: none was open). One cut off is added
        to ``incomplete``; the frames read back are ``_read_back``."""
        if self._writer is None:
            return None
        self._writer.release()
        self._writer = None
        self.written.append(self._path)
        self._read_back = frames_read_back(self._path)
        # Some containers estimate their count from the duration: one off. None read back is a video cut off (a
        # live run stopped just after a segment began: one frame written).
        if self._read_back < self._written - 1 or (self._written and not self._read_back):
            self.incomplete.append(self._path)
            return False
        return True
