"""Errors caused by what the user gave us (a file, a flag, a query, an install without an extra).

The command line prints a ``UserError`` as one line and exits non-zero, with no
traceback: its message must name the problem and the fix.
"""

from __future__ import annotations

import importlib.util
import numbers
import re
import sys

# The extra of this distribution that brings each optional module (pyproject.toml's
# [project.optional-dependencies]; tests/test_layers_and_cli.py holds the two together). A device installs
# `sdqes-edge[runtime]` alone, and what it lacks is named with the command that installs it.
EXTRA_FOR_MODULE = {"torch": "export", "onnx": "export", "tqdm": "export", "cv2": "runtime",
                    "onnxruntime": "runtime", "matplotlib": "eval", "ray": "ray", "tensorrt": "tensorrt",
                    "pycuda": "tensorrt", "safetensors": "export"}


class SetupWarning(RuntimeWarning):
    """Something the runtime changed, or could not set up, on this machine, and runs on without: threads above the
    cores brought down, a CUDA graph capture refused, TensorRT's provider missing, an engine never checked, no
    engine cache. The command line shows it as one line; a program can filter it or make it an error."""


# How a library's log (the exporter's, the engine builder's) starts a warning; the command line shows such lines as
# its own warnings, on stderr.
WARNING_PREFIX = "warning: "


def install_command(module: str) -> str:
    """"pip install 'sdqes-edge[eval]'" for matplotlib: what brings an optional module."""
    return f"pip install 'sdqes-edge[{EXTRA_FOR_MODULE[module]}]'"


def module_absent(module: str) -> bool:
    """True where importing ``module`` would fail because it is not installed (or was blocked)."""
    if module in sys.modules:
        return sys.modules[module] is None  # None: an import that was blocked, as in a torch-free test
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


class UserError(Exception):
    """A mistake in the user's input, reported as one line naming the problem and the fix."""

    exit_code = 2


class DoesNotFit(UserError):
    """What was asked would not fit in this machine's memory or on its disk, said with what would: exit status 1,
    as for the MemoryError of an array refused at its size (``sample.check_fits_in_memory``) and a full disk."""

    exit_code = 1


class SourceUnavailable(UserError):
    """A camera or stream URL that cannot be opened, or went away and did not come back: the machine's state, which
    may mend (a USB camera found late at boot, a camera server restarting), so not the status of a mistake (2) but
    1, which a service manager restarts (docs/service/sdqes-edge.service)."""

    exit_code = 1


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (libraries' messages run to several), else its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# The control characters (C0 but the tab, DEL, C1) of a line for a terminal, which a terminal obeys rather than shows:
# a bundle's alert message (someone else's data) of "\x1b[2K\rFAKE" erased the alert's line and wrote another.
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def terminal_safe(line: str) -> str:
    """``line`` with each control character written as its Python escape (``\\x1b``, ``\\r``), as sdqes-run writes
    it (``sdqes::terminal_safe``; tests/vectors/source_names.json). Every line the command line prints from what
    it was given goes through here: alerts, inspect's report, errors and warnings."""
    return _TERMINAL_CONTROLS.sub(lambda control: control.group().encode("unicode_escape").decode("ascii"), line)


# What a value given through the Python API is, checked before any arithmetic is done with it (and refused as a
# UserError otherwise): a string read from a config file ("2") failed in a comparison with a TypeError, a fraction
# (1.5) deep inside, and a bool passed as 0 or 1, since Python counts True and False as numbers. Numpy's numbers
# (read from an array) are numbers here.
def is_number(value: object) -> bool:
    """A real number (numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_whole_number(value: object, least: int | None = None) -> bool:
    """A whole number (numpy's too), not a bool, and at least ``least`` where given."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and (least is None or value >= least)
