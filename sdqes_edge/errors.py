"""Errors caused by what the user gave us (a file, a flag, a query).

The command line prints a ``UserError`` as one line and exits non-zero, with no
traceback: its message must name the problem and the fix.
"""


class UserError(Exception):
    """A mistake in the user's input, reported as one line naming the problem and the fix."""

    exit_code = 2


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (libraries' messages run to several), else its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
