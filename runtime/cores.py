"""The cores this process may use, and the thread counts asked of ONNX Runtime checked against them."""

from __future__ import annotations

import os
import warnings

from sdqes_edge.errors import SetupWarning, UserError, is_whole_number


def usable_cores() -> int:
    """Cores this process may run on (a container's or taskset's CPU set, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def checked_threads(threads: int | None) -> int | None:
    """``None`` (ONNX Runtime's default: every core) or a whole number of threads, at most the usable cores.

    ONNX Runtime's workers busy-wait between runs, so threads beyond the cores only take turns: each step gets
    slower, and 10,000 of them took minutes to start. More than the cores is brought down to them with a
    one-line warning, as a typo deserves; less than 1 is refused (ONNX Runtime reads 0 as "every core").
    """
    if threads is None:
        return None
    if not is_whole_number(threads, least=1):
        raise UserError(f"threads is a whole number of at least 1 (or None for every core), not {threads!r}")
    cores = usable_cores()
    if threads > cores:
        warnings.warn(f"{threads} threads asked of ONNX Runtime, but this process may use {cores} core(s); using "
                      f"{cores} (more would only take turns on them)", SetupWarning, stacklevel=2)
        return cores
    return int(threads)
