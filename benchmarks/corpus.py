"""Videos per minute over one corpus: one process with every thread, the local worker pool, and Ray.

Measured side by side in one run on the same streams (``sdqes-edge score --bench``). Every mode must give
the same traces (checked here, array for array); the Ray row counts starting its local instance, shown apart.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from sdqes_edge.contract import REFERENCE_PRECISION
from sdqes_edge.corpus import StepChoice, StreamOutcome, StreamTask, score_here, score_in_pool
from sdqes_edge.errors import install_command, module_absent


def _run(mode: Callable[[Callable[[StreamOutcome], None]], None]) -> tuple[list[StreamOutcome], float]:
    outcomes: list[StreamOutcome] = []
    started = time.perf_counter()
    mode(outcomes.append)
    return outcomes, time.perf_counter() - started


def bench_corpus(tasks: list[StreamTask], bundle: Path, cores: int, log: Callable[[str], None] = print,
                 precision: str = REFERENCE_PRECISION) -> dict:
    """Each mode scores every task (the bundle's ``precision`` step graph); videos per minute, speed-up over one
    process, and whether traces agree. Every mode scores on the CPU: they are ways of sharing its cores."""
    step = StepChoice(precision)
    modes: dict[str, Callable] = {
        f"1 process, {cores} ORT threads": lambda report: score_here(tasks, bundle, cores, report, step),
        f"local pool, {cores} workers x 1 thread": lambda report: score_in_pool(tasks, bundle, cores, 1, report,
                                                                                 quiet_opencv=True, step=step),
    }
    rows: dict[str, dict] = {}
    ray_mode, ray_start = f"Ray local instance, {cores} actors x 1 thread", []  # seconds to start the instance

    def on_ray(report):
        from sdqes_edge.corpus_ray import connect, score_on_ray

        started = time.perf_counter()
        connect(None, {"num_cpus": cores})
        ray_start.append(time.perf_counter() - started)
        score_on_ray(tasks, bundle, 1, report, actors=cores, quiet_opencv=True, step=step)

    if not module_absent("ray"):
        modes[ray_mode] = on_ray
    else:
        log(f"note: Ray is not installed; its row is left out ({install_command('ray')})")
    results: dict[str, list[StreamOutcome]] = {}
    for name, mode in modes.items():
        log(f"scoring {len(tasks)} streams: {name} ...")
        outcomes, seconds = _run(mode)
        results[name] = outcomes
        rows[name] = {"seconds": seconds, "videos_per_minute": 60.0 * len(tasks) / seconds,
                      "failed": sum(o.error is not None for o in outcomes),
                      "frames": sum(o.frames for o in outcomes)}
    if ray_start:
        rows[ray_mode]["videos_per_minute_after_start"] = 60.0 * len(tasks) / (rows[ray_mode]["seconds"] - ray_start[0])
    base = next(iter(rows.values()))["seconds"]
    for name, row in rows.items():
        row["speedup"] = base / row["seconds"]
        row["same_traces_as_1_process"] = _same(results[next(iter(results))], results[name])
    return {"streams": len(tasks), "cores": cores, "precision": precision, "rows": rows,
            "ray_start_seconds": ray_start[0] if ray_start else None}


def _same(reference: list[StreamOutcome], other: list[StreamOutcome]) -> bool:
    want = {o.stream: o.trace for o in reference}
    for outcome in other:
        trace, expected = outcome.trace, want.get(outcome.stream)
        if (trace is None) != (expected is None):
            return False
        if trace is not None and not np.array_equal(trace.probs, expected.probs, equal_nan=True):
            return False
    return len(other) == len(reference)


def markdown(results: dict) -> str:
    lines = [f"# Scoring a corpus: {results['streams']} streams on {results['cores']} cores, the "
             f"{results.get('precision', REFERENCE_PRECISION)} step graph", "",
             "| mode | seconds | videos / min | over 1 process | failed | same traces |", "|---|---|---|---|---|---|"]
    for name, row in results["rows"].items():
        lines.append(f"| {name} | {row['seconds']:.1f} | {row['videos_per_minute']:.1f} | **{row['speedup']:.2f}x** | "
                     f"{row['failed']} | {'yes' if row['same_traces_as_1_process'] else 'NO'} |")
    if results.get("ray_start_seconds") is not None:
        after = next(r["videos_per_minute_after_start"] for n, r in results["rows"].items() if n.startswith("Ray"))
        lines += ["", f"The Ray row includes starting its local instance ({results['ray_start_seconds']:.1f} s) "
                      f"and shipping the bundle through the object store; after the start, {after:.1f} videos / min."]
    return "\n".join(lines) + "\n"
