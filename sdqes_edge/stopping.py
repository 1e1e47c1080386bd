"""Stopping on a signal the way a user expects, whoever sends it.

Ctrl-C sends SIGINT; ``docker stop``, systemd and ``timeout`` send SIGTERM; a closed terminal sends SIGHUP.
Python turns only the first into an exception: by default the other two end the process at once, with no
``finally`` run, so a half-written bundle staging folder stays behind and an mp4 being written has no index.

- ``raise_on_termination()`` (the command line calls it first) turns SIGTERM and SIGHUP into ``Stopped``, a
  ``KeyboardInterrupt``, so every cleanup that already handles Ctrl-C handles them too.
- ``FinishFrameThenStop`` (a stream's loop) goes further: a signal only asks the loop to stop after the frame
  in hand, so sinks are never interrupted mid-write; a second signal stops at once.

The exit status is 128 + the signal's number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), as shells report it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import weakref
from typing import NoReturn

TERMINATION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
STOP_SIGNALS = (signal.SIGINT, *TERMINATION_SIGNALS)


# Threads that may be inside a C++ call Python cannot cut short: OpenCV opening or reading a stream that stalls
# (FFmpeg's 30-s timeout). Python 3.11's teardown ends such a thread when its call returns, by unwinding its C++
# frames, and OpenCV's bindings catch that unwinding: the process aborts ("terminate called without an active
# exception", exit -6) with every output already complete. ``exit_process`` leaves without that teardown instead.
_IN_NATIVE_CALLS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def may_outlive_a_stop(thread: threading.Thread) -> threading.Thread:
    """Mark a daemon thread that may still be inside a native call when the process ends (``exit_process``)."""
    _IN_NATIVE_CALLS.add(thread)
    return thread


def exit_process(code: int) -> NoReturn:
    """``sys.exit(code)``; but while a thread marked by ``may_outlive_a_stop`` lives on (inside a stalled open or
    read, after a stop), stdout and stderr are flushed and the process ends without Python's teardown, which would
    abort it when that call returns. Each output was closed by the work itself, so nothing is lost."""
    if any(thread.is_alive() for thread in list(_IN_NATIVE_CALLS)):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # stdout's reader may be gone (exit 141)
                stream.flush()
        os._exit(code)
    sys.exit(code)


def exit_status(signum: int) -> int:
    """The status of a process a signal ended, as shells report it (SIGPIPE: 141)."""
    return 128 + int(signum)


class Stopped(KeyboardInterrupt):
    """A stop asked for by a signal; ``exit_code`` is what the process should exit with."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return exit_status(self.signum)


# The termination signal ``raise_on_termination``'s handler last turned into ``Stopped``: a library that catches
# the exception and raises a plain KeyboardInterrupt in its place (Ray's ``wait`` and ``get`` do) loses which
# signal it was, and the exit status must still say SIGTERM to systemd or docker.
_last_termination: int | None = None


def signal_of(interrupt: KeyboardInterrupt) -> int:
    """The signal behind an interrupt: its own for ``Stopped``; else a termination signal received since
    ``raise_on_termination`` (re-raised as a plain KeyboardInterrupt by a library); else SIGINT (Ctrl-C)."""
    if isinstance(interrupt, Stopped):
        return int(interrupt.signum)
    return _last_termination if _last_termination is not None else int(signal.SIGINT)


def exit_code_of(interrupt: KeyboardInterrupt) -> int:
    return exit_status(signal_of(interrupt))


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def raise_on_termination() -> None:
    """SIGTERM and SIGHUP raise ``Stopped`` like Ctrl-C raises KeyboardInterrupt (main thread only)."""
    if not _in_main_thread():
        return

    def handler(signum, _frame):
        global _last_termination
        _last_termination = signum
        raise Stopped(signum)

    for signum in TERMINATION_SIGNALS:
        signal.signal(signum, handler)


def ignore_termination() -> None:
    """SIGTERM and SIGHUP are ignored from here on (main thread only): for when the work is done and every output
    closed, so that a signal landing in Python's own teardown (unloading ONNX Runtime, joining threads) cannot
    turn a finished run into a process killed by a signal."""
    if _in_main_thread():
        for signum in TERMINATION_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def handlers_kept(signals: tuple[int, ...] = TERMINATION_SIGNALS):
    """Within the block, code may install its own handlers of ``signals`` (SIGTERM/SIGHUP); the ones before are put
    back after it (main thread only). For libraries that take the signals over as they start: Ray's ``init`` installs
    a crash logger on SIGTERM that prints a stack dump and exits 1, so a stopped run neither cleaned up nor said so.
    """
    previous = {signum: signal.getsignal(signum) for signum in signals} if _in_main_thread() else {}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: a handler installed outside Python, which cannot be put back
                signal.signal(signum, handler)


@contextlib.contextmanager
def stops_held():
    """Within the block, a stop signal (SIGINT, SIGTERM, SIGHUP) is held, then given to the handler that was there
    as the block ends (main thread only; elsewhere Python delivers no signal). For a file written whole: zipfile cut
    by an exception inside a handle's close raises ValueError in the archive's own cleanup instead, so a SIGTERM
    that landed there became a trace "that could not be written", and `score` went on scoring the next video."""
    if not _in_main_thread():
        yield
        return
    received: list[int] = []
    try:
        with handlers_kept(STOP_SIGNALS):
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) is not None:  # None: not Python's, so not put back, so not taken
                    signal.signal(signum, lambda signum, _frame: received.append(signum))
            yield
    finally:  # the handlers before are back: each held signal reaches its own, as it came (a second Ctrl-C too)
        for signum in received:
            signal.raise_signal(signum)


class FinishFrameThenStop:
    """Within the block, SIGINT/SIGTERM/SIGHUP set ``requested``; the loop checks it between frames.

    A second signal while the first is pending raises ``Stopped`` at once (a loop stuck on a dead camera
    must still be stoppable). Previous handlers are restored on exit. Outside the main thread (a library
    caller's worker) signals cannot be caught, and the block does nothing.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 0 if self.signum is None else exit_status(self.signum)

    def _handle(self, signum, _frame) -> None:
        if self.signum is not None:
            raise Stopped(signum)
        self.signum = signum

    def __enter__(self) -> "FinishFrameThenStop":
        if _in_main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
