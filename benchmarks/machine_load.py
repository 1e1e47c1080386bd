"""How busy other processes kept this process's cores while a benchmark ran.

Interleaving puts every candidate under the same conditions, but only on average: another job that runs in bursts
lands on some candidates' repetitions and not others. A `bench --quick` run beside a test suite on two cores printed
the tiny backbone's PyTorch step at 99 ms (2.4 ms on the idle machine) and "torch / ort_fp32" at 98x (2.7x), with
nothing in its output to say so. The bench now measures the CPU time the machine spent outside this process (Linux
``/proc/stat``, the cores this process may run on) and says so in its report when it is more than a little.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Cores other processes may keep busy on average before a run's times are flagged: more than an idle desktop or a
# CI runner's agent takes, well under what a second job takes.
BUSY_MACHINE_CORES = 0.25
# /proc/stat's per-CPU columns that count as busy: user, nice, system, irq, softirq, steal (a hypervisor's other
# guests); idle and iowait are not.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuClock:
    """One reading: wall seconds, seconds the cores were busy in all, seconds this process used (children
    included)."""

    wall_s: float
    busy_s: float
    own_s: float


def read_cpu_clock() -> CpuClock | None:
    """Now, over the cores this process may run on; None where the system does not say (not Linux)."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        with open("/proc/stat") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *columns = line.split() or [""]
        if not (name.startswith("cpu") and name[3:].isdigit()) or (cores is not None and int(name[3:]) not in cores):
            continue
        ticks += sum(int(columns[i]) for i in _BUSY_COLUMNS if i < len(columns))
    own = os.times()
    return CpuClock(time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"),
                    own.user + own.system + own.children_user + own.children_system)


def other_processes_cores(before: CpuClock | None, after: CpuClock | None) -> float | None:
    """Cores kept busy by everything but this process, on average between two readings (None: not measured)."""
    if before is None or after is None or after.wall_s <= before.wall_s:
        return None
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / (after.wall_s - before.wall_s))


def busy_machine_words(cores: float | None) -> str | None:
    """The report's warning where other processes took enough of the machine to move its times, else None."""
    if cores is None or cores < BUSY_MACHINE_CORES:
        return None
    return (f"**Warning: other processes kept {cores:.2f} cores busy on average during this run, so its times and "
            "ratios are not an idle machine's. Run it again with nothing else running.**")
