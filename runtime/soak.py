"""Soak a bundle: stream many frames through the whole runtime loop and watch the state and the memory.

What a camera that runs for months does, compressed: frames from a reader thread, preprocessing, the step
with the state carried, scoring, alerts, a JSONL log and a score trace. Every ``sample_every`` frames the
largest state magnitude is read; at the end of every block of frames, the process's resident memory. The
first block is the warm-up (ONNX Runtime's arenas, OpenCV's buffers); after it the memory must stay flat,
and the state must stay finite and stop growing (the later half of the blocks against the earlier half).
Torch-free.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from sdqes_edge.tolerances import SOAK_BLOCK_FRAMES, SOAK_RSS_GROWTH_BYTES, SOAK_STATE_GROWTH

from .alert_log import JsonlSink
from .detector import RunStats, StreamingDetector
from .sinks import ScoreTraceRecorder
from .sources import FrameSource

SOAK_QUERIES = ("when I start cooking", "when the door opens", "when I pick up the phone")
# State magnitudes below this are rounding noise: a tensor that stays under it is not said to grow.
STATE_NOISE_FLOOR = 1e-6


def rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


class NoiseSource(FrameSource):
    """An endless file-like source: a small pool of random BGR frames, cycled, with file timestamps."""

    def __init__(self, fps: float, frames: int, size: int = 96, pool: int = 16, seed: int = 0):
        super().__init__("soak", fps)
        rng = np.random.default_rng(seed)
        self.pool = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(pool)]
        self.frames = frames

    def _frames(self):
        for index, image in zip(range(self.frames), itertools.cycle(self.pool)):
            yield (lambda image=image: image), index / self.fps


@dataclass
class SoakBlock:
    end_frame: int
    state_abs: dict[str, float]  # per state tensor, the largest |value| sampled in the block (inf where not finite)
    rss_bytes: int  # at the block's end

    @property
    def largest_state(self) -> str:
        return max(self.state_abs, key=self.state_abs.__getitem__, default="-")

    @property
    def max_state_abs(self) -> float:
        return max(self.state_abs.values(), default=0.0)


@dataclass
class SoakReport:
    frames: int
    finite: bool
    blocks: list[SoakBlock] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rss_growth_bytes(self) -> int:
        """The most the memory rose above its level at the end of the warm-up block."""
        if len(self.blocks) < 2:
            return 0
        return max(b.rss_bytes for b in self.blocks[1:]) - self.blocks[0].rss_bytes

    @property
    def flat(self) -> bool:
        return self.rss_growth_bytes <= SOAK_RSS_GROWTH_BYTES

    @property
    def max_state_abs(self) -> float:
        return max((b.max_state_abs for b in self.blocks), default=0.0)

    def _growth_by_state(self) -> dict[str, float]:
        """Per state tensor, its largest magnitude in the later half of the blocks over that in the earlier half
        (the warm-up block among them): near 1 for a state that stays in its range, 2 for one that grows
        linearly. Each tensor on its own, so a large one cannot hide a small one's growth; a tensor that stays
        below STATE_NOISE_FLOOR is not growing in any sense that matters."""
        if len(self.blocks) < 2:
            return {}
        half = len(self.blocks) // 2
        growth = {}
        for name in self.blocks[0].state_abs:
            earlier = max(b.state_abs.get(name, 0.0) for b in self.blocks[:half])
            later = max(b.state_abs.get(name, 0.0) for b in self.blocks[half:])
            growth[name] = 1.0 if later <= STATE_NOISE_FLOOR else later / max(earlier, STATE_NOISE_FLOOR)
        return growth

    @property
    def state_growth(self) -> float:
        """The fastest-growing state tensor's growth (``_growth_by_state``); 1.0 without state."""
        return max(self._growth_by_state().values(), default=1.0)

    @property
    def growing_state(self) -> str:
        growth = self._growth_by_state()
        return max(growth, key=growth.__getitem__, default="-")

    @property
    def bounded(self) -> bool:
        return self.state_growth <= SOAK_STATE_GROWTH

    @property
    def ok(self) -> bool:
        return self.finite and self.bounded and self.flat


def soak_bundle(bundle: str | Path, frames: int, block: int = SOAK_BLOCK_FRAMES, sample_every: int = 100,
                threads: int | None = 1, seed: int = 0, log: Callable[[str], None] = lambda message: None
                ) -> SoakReport:
    """Stream ``frames`` frames through ``bundle`` with every sink a deployment uses; report per block."""
    report = SoakReport(frames, finite=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sdqes-soak-") as work:
        detector = StreamingDetector(bundle, threads=threads)
        for text in SOAK_QUERIES:
            detector.add_query(text)
        detector.add_sink(JsonlSink(Path(work) / "events.jsonl"))
        detector.add_sink(ScoreTraceRecorder(Path(work) / "scores.npz", "soak", detector.fps))
        stats = RunStats()
        state_abs: dict[str, float] = {}
        for _ in detector.run(NoiseSource(detector.fps, frames, seed=seed), stats):
            if stats.frames % sample_every == 0 or stats.frames == frames:
                for name, value in detector.backend.state_to_numpy(detector.state).items():
                    magnitude = float(np.abs(value).max()) if value.size else 0.0
                    if not np.isfinite(magnitude):
                        report.finite, magnitude = False, float("inf")
                    state_abs[name] = max(state_abs.get(name, 0.0), magnitude)
            if stats.frames % block == 0 or stats.frames == frames:
                done = SoakBlock(stats.frames, state_abs, rss_bytes())
                report.blocks.append(done)
                log(f"  {stats.frames:>8d} frames: max |state| {done.max_state_abs:.4g} ({done.largest_state}), "
                    f"RSS {done.rss_bytes / 2**20:.1f} MiB, {stats.fps:.0f} frames/s")
                state_abs = {}
    report.seconds = time.perf_counter() - started
    return report
