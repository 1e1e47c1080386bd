"""Progress on long work, on stderr, where tqdm is installed (the export and eval extras bring it; a device with the
runtime alone may not have it, and then work goes on without a word of progress).

On a terminal it is tqdm's bar, redrawn in place. Anywhere else (a log file, journald under systemd, ``docker logs``,
a CI log) a bar redrawn in place is one line of thousands of carriage returns, ten a second; there the same figures
are written as whole lines, the first after LOG_LINE_SECONDS and then at most one every LOG_LINE_SECONDS, so short
work leaves a log untouched and long work leaves a line a log reader can read."""

from __future__ import annotations

import functools
import sys
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
    return _log_lines_bar(tqdm)(iterable, total=total, unit=unit, desc=desc, leave=False, file=sys.stderr,
                                mininterval=LOG_LINE_SECONDS, delay=LOG_LINE_SECONDS, bar_format=LOG_LINE_FORMAT)


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


@functools.lru_cache(maxsize=None)
def _log_lines_bar(tqdm: type) -> type:
    """tqdm's class, drawing each refresh as a whole line: never before ``delay`` has passed, never more often than
    ``mininterval`` (a refresh asked outright, as ``set_postfix`` asks one, included), and nothing when tqdm clears
    a bar it drew in place (a log keeps its lines)."""

    class LogLinesBar(tqdm):
        def display(self, msg=None, pos=None):
            now = self._time()
            due = max(self.start_t + self.delay, getattr(self, "_line_written_at", float("-inf")) + self.mininterval)
            if msg == "" or now < due:
                return False
            self._line_written_at = now
            self.fp.write((self.__str__() if msg is None else msg) + "\n")
            self.fp.flush()
            return True

    return LogLinesBar
