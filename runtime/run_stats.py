"""What a run measures as it goes: frames, events and per-step latencies, in constant memory."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


class LatencyHistogram:
    """Per-step latencies in constant memory, for a stream that runs for months.

    Log-spaced bins, ``BINS_PER_DECADE`` per factor of ten from ``LOWEST_MS`` to ``HIGHEST_MS``: a
    percentile is read to within one bin (under 1% relative) however many steps were added; the count,
    mean, minimum and maximum are exact.
    """

    LOWEST_MS, HIGHEST_MS, BINS_PER_DECADE = 1e-3, 1e6, 250

    def __init__(self) -> None:
        decades = np.log10(self.HIGHEST_MS / self.LOWEST_MS)
        self.edges = self.LOWEST_MS * 10.0 ** (np.arange(int(decades * self.BINS_PER_DECADE) + 1)
                                                / self.BINS_PER_DECADE)
        self.counts = np.zeros(len(self.edges) + 1, np.int64)  # [under, bins..., over]
        self.count, self.total_ms = 0, 0.0
        self.min_ms, self.max_ms = float("inf"), 0.0

    def add(self, ms: float) -> None:
        self.counts[np.searchsorted(self.edges, ms, side="right")] += 1
        self.count += 1
        self.total_ms += ms
        self.min_ms, self.max_ms = min(self.min_ms, ms), max(self.max_ms, ms)

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.count if self.count else 0.0

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100), the geometric middle of its bin, clamped to the exact min and max."""
        if not self.count:
            return 0.0
        if q >= 100.0:
            return self.max_ms
        rank = max(1, int(np.ceil(q / 100.0 * self.count)))
        slot = int(np.searchsorted(np.cumsum(self.counts), rank))
        if slot == 0 or slot == len(self.counts) - 1:  # outside the binned range
            return self.min_ms if slot == 0 else self.max_ms
        value = float(np.sqrt(self.edges[slot - 1] * self.edges[slot]))
        return min(max(value, self.min_ms), self.max_ms)


@dataclass
class RunStats:
    frames: int = 0
    latencies: LatencyHistogram = field(default_factory=LatencyHistogram)
    started: float = field(default_factory=time.perf_counter)
    events: int = 0
    # Every frame to step was stepped (the sources ended, or max_frames): a failure after it is an output's, as the
    # sinks closed, and the stream itself ended as it should.
    streamed: bool = False

    @property
    def fps(self) -> float:
        return self.frames / max(time.perf_counter() - self.started, 1e-9)

    def latency(self, q: float) -> float:
        return self.latencies.percentile(q)
