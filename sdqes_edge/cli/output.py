"""The command line's stdout and stderr: each line out as it is written, and readers that may leave.

``sdqes-edge run ... | head -3`` (``2>&1 |`` too), or a notifier reading the alerts that exits: Python ignores
SIGPIPE, so the next line written raised BrokenPipeError, a traceback from any command, and in ``run`` before the
alert reached the alert log. Once a reader has gone, what is written to its stream goes nowhere; the command
finishes its work (its files are written whole), and ``run``, whose stream may never end, stops after the frame
in hand when the reader of its alerts (stdout) has gone.
"""

from __future__ import annotations

import io
import os
import sys


class ReaderMayLeave:
    """``sys.stdout`` or ``sys.stderr`` that, once its reader has closed the pipe, sends what is written to
    /dev/null (the file descriptor too, so that Python's own flush at exit does not fail) and says so in
    ``reader_left``."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.reader_left = False

    def write(self, text: str) -> int:
        if not self.reader_left:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._discard_from_now_on()
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard_from_now_on()

    def _discard_from_now_on(self) -> None:
        self.reader_left = True
        nowhere = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(nowhere, self._stream.fileno())  # the line still in the buffer goes there too
        finally:
            os.close(nowhere)

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


def stdout_reader_left() -> bool:
    """Whether the program reading this process's stdout has closed it (only under ``prepare_output``)."""
    return bool(getattr(sys.stdout, "reader_left", False))


def prepare_output() -> None:
    """Every line out as soon as it is written, wherever stdout and stderr go. Python writes a stream that is not a
    terminal in 8 KiB blocks (stderr too, before Python 3.9): the alerts of a live stream piped to another program
    (`sdqes-edge run ... | notify`) or kept by docker or systemd reached them when the block filled, or when the
    command ended, not when the event started. And their readers may leave (above)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError, io.UnsupportedOperation):  # replaced by an object without it, or closed
            pass
    if sys.stdout is not None and not isinstance(sys.stdout, ReaderMayLeave):
        sys.stdout = ReaderMayLeave(sys.stdout)
    if sys.stderr is not None and not isinstance(sys.stderr, ReaderMayLeave):
        sys.stderr = ReaderMayLeave(sys.stderr)
