"""Progress on long work, on stderr, where tqdm is installed (the export and eval extras bring it; a device with the
runtime alone may not have it, and then work goes on without a word of progress).

On a terminal it is tqdm's bar, redrawn in place. Anywhere else (a log file, journald under systemd, ``docker logs``,
a CI log) a bar redrawn in place is one line of thousands of carriage returns, ten a second; there the same figures
are written as whole lines, the first after LOG_LINE_SECONDS and then at most one every LOG_LINE_SECONDS, so short
work leaves a log untouched and long work leaves a line a log reader can read."""

from __future__ import annotations

import functools
import sys
import time
from typing import Iterable, TypeVar

LOG_LINE_SECONDS = 30.0  # off a terminal: the first progress line after this, then one at most this often
# tqdm's own figures without the bar itself, which a log line has no use for.
LOG_LINE_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"

Item = TypeVar("Item")


def progress_bar(total: int | None, unit: str, desc: str, enabled: bool = True, iterable: Iterable | None = None):
    """A tqdm bar on stderr (over ``iterable`` when given), or None where disabled, the total is unknown or tqdm
    is not installed. Its lines are whole log lines where stderr is not a terminal (see the module's docstring)."""
    if not enabled or total is None:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    if stderr_is_a_terminal():
        return tqdm(iterable, total=total, unit=unit, desc=desc, leave=False, file=sys.stderr)
    return _log_lines_bar(tqdm)(iterable, total=total, unit=unit, desc=desc, leave=False, file=_Nowhere(),
                                mininterval=LOG_LINE_SECONDS, bar_format=LOG_LINE_FORMAT, log=sys.stderr)


def with_progress(iterable: Iterable[Item], desc: str, unit: str, total: int | None = None,
                  enabled: bool = True) -> Iterable[Item]:
    """``iterable`` itself, counted by a progress bar where there is one to show (``total`` defaults to its length)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    bar = progress_bar(total, unit, desc, enabled, iterable)
    return iterable if bar is None else bar


def stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


class _Nowhere:
    """Where a log's bar sends what tqdm writes itself, outside ``display`` (the carriage return that clears a bar,
    which tqdm 4.30 writes whatever ``display`` returns): nowhere. Its lines go to the log by ``display``."""

    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


@functools.lru_cache(maxsize=None)
def _log_lines_bar(tqdm: type) -> type:
    """tqdm's class, drawing each refresh as a whole line on ``log``: none in the first LOG_LINE_SECONDS, then none
    sooner than LOG_LINE_SECONDS after the last (a refresh asked outright, as ``set_postfix`` asks one, included).
    Held here rather than by tqdm's ``delay``, which tqdm before 4.60 refuses: a device's distribution may ship an
    older tqdm than the export extra asks for (the same lines come from tqdm 4.30, checked by hand)."""

    class LogLinesBar(tqdm):
        def __init__(self, *args, log, **kwargs):
            self._log = log
            super().__init__(*args, **kwargs)

        def display(self, msg=None, pos=None):
            started = getattr(self, "start_t", None)  # None: tqdm still making the bar
            if msg == "" or started is None:  # "": tqdm clearing the bar it drew in place, which a log keeps
                return False
            now = getattr(self, "_time", time.time)()
            if now < max(started, getattr(self, "_line_written_at", float("-inf"))) + LOG_LINE_SECONDS:
                return False
            self._line_written_at = now
            self._log.write((self.__str__() if msg is None else msg) + "\n")
            self._log.flush()
            return True

    return LogLinesBar
