"""The streaming step's targets on an H100-class GPU, each read from a ``bench --device cuda`` run and set beside
its bound, so that a run on a lent GPU says at once which it meets.

The bounds are those the GPU step was built to (ViT-B/16 with two QRNN adapters per block, ONNX Runtime's CUDA
provider, state bound on the device, CUDA graphs): absolute times mean something only on such a GPU, the ratios
on any. Where the run also timed this project's kernel library (``--ort-ops``), each figure is the better of the
step with it and without, as a user would deploy the better.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sdqes_edge.contract import FP16, FP32

TARGET_DEVICE = "an H100-class GPU"
TARGET_PRESET = "clip-vit-b16"


@dataclass(frozen=True)
class Target:
    what: str
    bound: float
    at_most: bool  # the figure must not exceed the bound (a time, a cost ratio); else not fall below it
    unit: str  # "ms", "x" or "frames/s"
    read: Callable[["_Run"], float | None]  # None: the run lacks what it is read from

    def met(self, value: float) -> bool:
        return value <= self.bound if self.at_most else value >= self.bound

    def shown(self, value: float) -> str:
        """``value`` in its unit; a ratio to three digits, so that one just past its bound (1.103x against 1.1x)
        does not read as equal to it."""
        if self.unit == "x":
            return f"{value:.3f}x"
        return f"{value:.0f} {self.unit}" if self.unit == "frames/s" else f"{value:.2f} {self.unit}"

    def bound_words(self) -> str:
        return f"{'<=' if self.at_most else '>='} {self.bound:g}{'x' if self.unit == 'x' else ' ' + self.unit}"


class _Run:
    """The figures of one run's device section that the targets read."""

    def __init__(self, results: dict):
        config, self.section = results["config"], results["device"]
        self.kind, self.window, self.streams = config["window_adapter"], config["window"], max(config["device_batches"])

    def step_ms(self, name: str) -> float | None:
        """Batch 1: ``name``'s fp16 step (the adapted one: the better of with and without the kernel library)."""
        keys = [f"{name}/ort_fp16"] + ([f"{name}/ort_fp16_sdqes_kernels"] if name == self.kind else [])
        found = [self.section["latency"][k]["p50_ms"] for k in keys if k in self.section["latency"]]
        return min(found, default=None)

    def window_over_streaming(self) -> float | None:
        """Batch 1, fp16, the same backend and treatment: the window over the step, each pair with the kernel
        library or each without it; the better pair."""
        latency = self.section["latency"]
        pairs = [(f"window{self.window}/ort_fp16", f"{self.kind}/ort_fp16"),
                 (f"window{self.window}/ort_fp16_sdqes_kernels", f"{self.kind}/ort_fp16_sdqes_kernels")]
        found = [latency[w]["p50_ms"] / latency[s]["p50_ms"] for w, s in pairs if w in latency and s in latency]
        return max(found, default=None)

    def streams_ms(self, name: str, precision: str = FP16) -> float | None:
        """At the most streams a step takes: ``name``'s step (the adapted fp16 one: the better, as above)."""
        rows = self.section.get("batches", {}).get("rows", {})
        keys = [f"{name}/{precision}/{self.streams}"]
        if name == self.kind and precision == FP16:
            keys.append(f"{name}/fp16 with sdqes_edge kernels/{self.streams}")
        return min((rows[k]["step_ms"] for k in keys if k in rows), default=None)

    def loop_over_step(self) -> float | None:
        """The runtime loop on an mp4 over the bare step: the worse of its precisions (each against its own). From
        its first frame to its last: its start (opening the video, the first frame) is reported apart, as the bare
        step's is not timed at all; runs before 29 November 2026 timed it within."""
        e2e = self.section.get("end_to_end")
        if e2e is None:
            return None
        found = [row["loop_over_step"] for row in e2e.get("by_precision", {}).values()]
        return max(found, default=1 + e2e["overhead"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def targets(kind: str, window: int, streams: int) -> list[Target]:
    return [
        Target(f"batch 1: {kind} step, fp16", 1.8, True, "ms", lambda r: r.step_ms(r.kind)),
        Target("batch 1: backbone step, fp16", 1.3, True, "ms", lambda r: r.step_ms("none")),
        Target(f"batch 1: {window}-frame window over streaming, fp16, same treatment", 2.5, False, "x",
               lambda r: r.window_over_streaming()),
        Target(f"{streams} streams: {kind} over backbone, fp16", 1.25, True, "x",
               lambda r: _ratio(r.streams_ms(r.kind), r.streams_ms("none"))),
        Target(f"{streams} streams: {kind} step, fp16", 4000, False, "frames/s",
               lambda r: _ratio(1000.0 * r.streams, r.streams_ms(r.kind))),
        Target(f"{streams} streams: {kind} fp32 over fp16", 1.5, False, "x",
               lambda r: _ratio(r.streams_ms(r.kind, FP32), r.streams_ms(r.kind))),
        Target("runtime loop on an mp4 over the bare step (the worse precision)", 1.1, True, "x",
               lambda r: r.loop_over_step()),
    ]


def measured_targets(results: dict) -> list[dict]:
    """Each target with the run's figure (None where the run lacks it) and whether it is met."""
    run = _Run(results)
    rows = []
    for target in targets(run.kind, run.window, run.streams):
        value = target.read(run)
        rows.append({"what": target.what, "bound": target.bound_words(),
                     "value": value, "shown": "-" if value is None else target.shown(value),
                     "met": None if value is None else target.met(value)})
    return rows


def markdown(results: dict) -> list[str]:
    config, device = results["config"], results["device"]["device"]
    lines = ["", f"## Targets of the streaming step on {TARGET_DEVICE} ({TARGET_PRESET} + two "
                 f"{config['window_adapter']} adapters per block)", ""]
    if device != "cuda" or config["preset"] != TARGET_PRESET:
        lines += [f"This run is {config['preset']} on {device}: the times are not the targets' machine's, and only "
                  "the ratios compare.", ""]
    lines += ["| target | bound | this run | met |", "|---|---|---|---|"]
    met_words = {True: "yes", False: "**no**", None: "not measured"}
    lines += [f"| {row['what']} | {row['bound']} | {row['shown']} | {met_words[row['met']]} |"
              for row in measured_targets(results)]
    return lines
