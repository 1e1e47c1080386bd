"""Side-by-side timing: candidates interleaved repetition by repetition, warm-up discarded, medians.

Interleaving puts every candidate under the same machine conditions (thermal
state, other processes), so their ratios mean something even on a noisy machine.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sdqes_edge.package_builds import load_onnxruntime
from sdqes_edge.runtime.soak import rss_bytes  # noqa: F401  (one reading of resident memory, shared)


@dataclass
class Timing:
    samples_ms: np.ndarray

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.samples_ms, q))

    @property
    def median(self) -> float:
        return self.percentile(50)

    def to_dict(self) -> dict:
        return {"p50_ms": self.percentile(50), "p90_ms": self.percentile(90), "p99_ms": self.percentile(99),
                "fps": 1000.0 / self.median if self.median > 0 else None, "repetitions": len(self.samples_ms)}


def interleaved(candidates: dict[str, Callable[[], object]], repetitions: int, warmup: int = 2,
                progress: Callable[[str], None] | None = None) -> dict[str, Timing]:
    """Time each candidate ``repetitions`` times, rotating the order each round."""
    names = list(candidates)
    for _ in range(warmup):
        for name in names:
            candidates[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repetitions):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            start = time.perf_counter()
            candidates[name]()
            samples[name].append((time.perf_counter() - start) * 1e3)
        if progress and (rep + 1) % max(1, repetitions // 5) == 0:
            progress(f"  repetition {rep + 1}/{repetitions}")
    return {name: Timing(np.asarray(v)) for name, v in samples.items()}


def peak_rss_bytes() -> int:
    """The most resident memory this process has held so far (Linux reports KiB)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def machine() -> dict:
    import cv2
    import torch

    onnxruntime = load_onnxruntime()
    cpu, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as fh:
            lines = fh.read().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
        flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "int8_instructions": _int8_instructions(flags),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "onnxruntime": onnxruntime.__version__,
            "opencv": cv2.__version__, "numpy": np.__version__, "platform": platform.platform()}


def _int8_instructions(flags: set[str]) -> str:
    """What ONNX Runtime's x86 int8 kernels multiply with, which sets int8's speed and whether 8-bit weights
    saturate (export/precision.py); "unknown" off x86 Linux."""
    if "avx512_vnni" in flags:
        return "AVX-512 VNNI"
    if "avx_vnni" in flags:
        return "AVX-VNNI"
    if "avx2" in flags:
        return "AVX2 (no VNNI)"
    return "unknown"
