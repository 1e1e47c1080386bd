"""The alert log: one JSON object per line (``JsonlSink``), appended, written and fsynced per alert.

A stream that runs for weeks meets what a long-lived log meets: a disk that fills, a log rotated under it, a power
cut mid-line. Each is met so that the log holds whole lines only and no alert is lost without a word."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Callable

from sdqes_edge.errors import SetupWarning
from sdqes_edge.files import make_folders
from sdqes_edge.path_checks import ALERT_LOG_EXAMPLE, check_output_file

from .output_locks import ALERT_LOG, hold, release
from .sinks import AlertEvent, Sink, tried_going_on

# The alert log's news (alerts the disk refused, then written again): to this logger unless a program sets the
# sink's own ``log`` (the command line prints each as one line).
ALERT_LOG_NEWS = logging.getLogger("sdqes_edge.runtime.alert_log")


class JsonlSink(Sink):
    """One JSON object per line, appended, written and fsynced before the step that raised it returns (a step's
    alerts of a stream in one write and one sync): a crash loses nothing already alerted.

    A line the disk refuses part of (full, a quota) is taken back, so the log holds whole lines only (JSONL
    readers stop at a half one). While the stream goes on, the refused alerts are said once, held in memory (the
    latest ``HELD_ALERTS``) and written, in order, with the next alert the disk takes, or every ``RETRY_SECONDS``
    of frames; that is said too. Still refused at ``close``, the error names the file. The run had ended at the
    first refused line, every other output with it, and a service restarted into the same full disk. A pipe
    (``--events -``) is not held for: its reader gone, the run stops.

    A log rotated while the stream runs (logrotate moves it away, or empties it with copytruncate) is followed, as
    Python's WatchedFileHandler follows one: the next alert goes to a new file at the path, not into the moved one."""

    # Alerts held at most while the disk refuses them (about 4 MiB of lines): past it the oldest are let go, and
    # counted, so that a disk full for days does not grow the service until the kernel kills it.
    HELD_ALERTS = 10_000
    RETRY_SECONDS = 30.0  # between tries of held alerts while frames go on without a new alert

    def __init__(self, path: str | Path):
        # A folder or /proc: a one-line error, not an OSError.
        self.path = check_output_file(path, "JsonlSink", ALERT_LOG_EXAMPLE)
        # Another process's log, or a file this program writes as something else (runtime/output_locks.py): refused.
        self._lock = hold(self.path, "JsonlSink", ALERT_LOG)
        try:
            make_folders(self.path.parent)
            self._use(self._open())
        except BaseException:
            release(self._lock)
            raise
        self._reopen_refused = False
        self.log: Callable[[str], None] = ALERT_LOG_NEWS.warning
        self._held: deque[str] = deque()  # lines the disk refused, oldest first (taken from the front as written)
        self._refused = False  # the last try was refused: said once, until a try succeeds
        self._let_go = 0  # held lines let go past HELD_ALERTS since the disk last took the log
        self._last_try = time.monotonic()
        if not self._ends_a_line():  # said once; the next alert starts a line of its own
            warnings.warn(f"the alert log {self.path} ends in a cut line (a power cut or a kill while it was "
                          "written?); it is kept, and the next alert starts a line of its own", SetupWarning,
                          stacklevel=2)

    def _open(self):
        """Unbuffered (nothing left to flush once a write failed), appending; a regular file opened to read too, to
        look at its last byte (``_ends_a_line``)."""
        if self.path.exists() and not self.path.is_file():  # a pipe or terminal (--events /dev/stdout)
            return self.path.open("ab", buffering=0)
        try:
            return self.path.open("a+b", buffering=0)
        except PermissionError:  # a log we may append to but not read: its last line is taken as whole
            return self.path.open("ab", buffering=0)

    def _use(self, fh) -> None:
        self._fh = fh
        # Bytes up to the end of the last whole line; None for anything but a regular file (a pipe, /dev/stdout,
        # /dev/null), which cannot be cut or rotated: /dev/full is seekable, and refused the cut with EINVAL.
        regular = stat.S_ISREG(os.fstat(fh.fileno()).st_mode)
        self._whole = fh.seek(0, os.SEEK_END) if regular else None

    def _follow_rotation(self) -> None:
        if self._whole is None:  # a pipe or a terminal is not rotated
            return
        opened = os.fstat(self._fh.fileno())
        try:
            moved = not os.path.samestat(opened, os.stat(self.path))
        except FileNotFoundError:  # moved away, the new one not made yet
            moved = True
        if not moved:  # emptied in place (copytruncate), or not: a line to take back ends where the file now does
            self._whole = min(self._whole, opened.st_size)
            return
        try:
            replacement = self._open()
        except OSError as exc:  # tried again at the next alert; the alerts are not lost meanwhile
            if not self._reopen_refused:
                self._reopen_refused = True
                warnings.warn(f"the alert log {self.path} was moved away and cannot be made again "
                              f"({exc.strerror or exc}); alerts go on into the moved file", SetupWarning, stacklevel=5)
            return
        self._fh.close()
        self._use(replacement)
        self._reopen_refused = False  # a later rotation that fails is said again

    def _ends_a_line(self) -> bool:
        """Whether the log's last byte ends a line (an empty log, a pipe: True). A line cut by a power cut or a kill
        is kept as it is, and the next alert starts a line of its own: appended to the cut one, it was unreadable
        too (a JSONL reader stops there)."""
        if not self._whole or not self._fh.readable():
            return True
        self._fh.seek(self._whole - 1)  # a read position only: an append goes to the end all the same
        return self._fh.read(1) == b"\n"

    def on_event(self, event: AlertEvent) -> None:
        self._write_events([event])

    def on_events(self, events: list[AlertEvent]) -> None:
        """A step's alerts of a stream in one write and one sync: a hundred queries alerting at a stream's first
        frame had cost a hundred syncs (0.3 ms each on an SSD, tens of ms on a Jetson's SD card), a camera's frames
        dropped meanwhile. A crash loses none the step returned. A subclass's own ``on_event`` (one that leaves
        some alerts out) is still given each alert."""
        if type(self).on_event is not JsonlSink.on_event:
            super().on_events(events)
        else:
            self._write_events(events)

    def _write_events(self, events: list[AlertEvent]) -> None:
        if not events:
            return
        lines = [json.dumps(event.to_dict()) + "\n" for event in events]
        if self._whole is None:  # a pipe (its reader gone, the run stops) or a device (/dev/full): nothing to wait for
            self._append("".join(lines))
            return
        # Held lines exist only while the disk refuses: the oldest go first, never those of this step untried.
        self._let_go_oldest(keep=max(self.HELD_ALERTS - len(lines), 0))
        self._held.extend(lines)
        self._write_going_on()
        self._let_go_oldest(keep=self.HELD_ALERTS)  # a step's alerts more than are held, refused

    def _let_go_oldest(self, keep: int) -> None:
        while len(self._held) > keep:
            self._held.popleft()
            self._let_go += 1

    def on_frame(self, stream, frame_bgr, time_s, probs, events) -> None:
        if self._held and time.monotonic() - self._last_try >= self.RETRY_SECONDS:
            self._write_going_on()

    def _write_going_on(self) -> None:
        """``_write_held`` while the stream goes on: a refusal is said once, not raised."""
        self._refused = tried_going_on(
            self._write_held, self._refused, self.log,
            lambda refusal: (f"warning: cannot append alerts to the alert log {self.path} "
                             f"({refusal.strerror or refusal}); the stream goes on alerting, its latest "
                             f"{self.HELD_ALERTS} alerts held in memory and written with the next alert the disk "
                             f"takes, or tried again every {self.RETRY_SECONDS:g} s"),
            f"note: the alert log {self.path} is written again, the alerts held meanwhile with it"
            + (f" ({self._let_go} older ones were let go)" if self._let_go else ""))

    def _write_held(self) -> None:
        """The held lines appended, oldest first, and synced, in one write; what the disk refuses part of is taken
        back, and they all stay held."""
        self._last_try = time.monotonic()
        self._follow_rotation()
        if self._held:
            self._append("".join(self._held))
            self._held.clear()
        self._let_go = 0

    def _append(self, text: str) -> None:
        line = memoryview((text if self._ends_a_line() else "\n" + text).encode("utf-8"))
        try:
            while line:
                written = self._fh.write(line)
                if not written:  # a regular file takes some bytes or raises; never loop on nothing
                    raise OSError(errno.EIO, "the file took no bytes")
                line = line[written:]
            if self._whole is not None:  # a pipe or terminal has nothing to sync
                os.fsync(self._fh.fileno())
        except OSError as exc:
            if self._whole is not None:
                with contextlib.suppress(OSError):  # what to say is the refusal; a cut line is found on opening
                    os.ftruncate(self._fh.fileno(), self._whole)
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        if self._whole is not None:
            self._whole = self._fh.tell()

    def close(self) -> None:
        """Write the alerts still held; a refusal names the log (the run's error, exit 1), the alerts it lost
        counted."""
        try:
            if self._held:
                held = len(self._held) + self._let_go
                try:
                    self._write_held()
                except OSError as refusal:
                    raise OSError(refusal.errno, f"{refusal.strerror}; {len(self._held) + self._let_go} of the {held} "
                                  "alerts it refused meanwhile are not in it", str(self.path)) from None
        finally:
            try:
                self._fh.close()
            finally:
                release(self._lock)
                self._lock = None  # a second close lets go of nothing
