"""The detector's own work per step at many streams and queries: scoring, each stream's alert states, its sinks'
rows; and a run's gathering of as many live cameras. The model's step is stood in by its result (the detector's
backend replays one real step), so what is timed is what a GPU's step, a few ms at 32 streams, leaves to Python on
the host; the bare step of the same bundle on this CPU is timed beside it for scale."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from sdqes_edge.benchmarks.config import BenchConfig
from sdqes_edge.benchmarks.models import bench_config, bench_model
from sdqes_edge.benchmarks.timing import interleaved
from sdqes_edge.config import preset
from sdqes_edge.runtime.frame_source import FrameSource
from sdqes_edge.runtime.queries import ThresholdOutOfReachWarning
from sdqes_edge.runtime.sources import Frame

# Thresholds that keep every query off (p never above) and every query on (p always above): the cheapest and the
# costliest case for the alert states, an event in view putting a stream between the two.
NONE_ON, ALL_ON = 0.999, 0.001
CAMERA_FPS = 5.0  # the bundle's samples a second, so that a run of live cameras steps a few times a second
STAND_IN_STEP_S = 0.007  # a GPU's step at 32 streams (H200, ViT-B/16 + QRNN fp16: 6.9 ms)


def _detector(cfg: BenchConfig, work: Path, log: Callable[[str], None]):
    from sdqes_edge.export import ExportOptions, export_bundle
    from sdqes_edge.runtime.detector import StreamingDetector

    mcfg = bench_config(preset(cfg.scaling_preset), cfg.window_adapter)
    bundle = work / f"alerting-b{cfg.alerting_streams}"
    log(f"exporting {mcfg.name} at batch {cfg.alerting_streams} for the detector's own work per step ...")
    export_bundle(bench_model(mcfg), bundle, ExportOptions(batch=cfg.alerting_streams, fps=CAMERA_FPS, verify_frames=16,
                                                           drift_frames=16, show_progress=False), log=lambda m: None)
    return StreamingDetector(bundle, threads=cfg.threads)


def bench_alerting(cfg: BenchConfig, work: Path, log: Callable[[str], None]) -> dict:
    """Per query count: the detector's own work per step with every query off and with every query on, and the
    bare step of the same bundle."""
    detector = _detector(cfg, work, log)
    image = np.zeros((64, 64, 3), np.uint8)
    tensor = detector.preprocess(image)
    frames = [Frame(image, 0.0, 0, tensor) for _ in range(detector.batch)]
    backend, batch = detector.backend, np.repeat(tensor[None], detector.batch, axis=0)
    bare_state = [backend.initial_state()]

    def bare_step() -> None:
        bare_state[0] = backend.step(batch, bare_state[0], None).state

    replayed = backend.step(batch, detector.state, None)
    detector.backend = _Replay(replayed)
    clock = [0]

    def detector_step() -> None:
        clock[0] += 1
        for frame in frames:
            frame.time, frame.index = clock[0] / detector.fps, clock[0]
        detector.step(frames)

    rows = {}
    for count in cfg.alerting_queries:
        log(f"timing the detector's own work at {detector.batch} streams and {count} "
            f"quer{'y' if count == 1 else 'ies'} ...")
        timings = {}
        for case, threshold in (("none_on", NONE_ON), ("all_on", ALL_ON)):
            _ask(detector, count, threshold)
            timings[case] = interleaved({case: detector_step}, cfg.repetitions, cfg.warmup)[case]
        step = interleaved({"bare": bare_step}, cfg.repetitions, cfg.warmup)["bare"]
        rows[str(count)] = {"none_on_ms": timings["none_on"].median, "all_on_ms": timings["all_on"].median,
                            "bare_step_ms": step.median,
                            "none_on_over_step": timings["none_on"].median / step.median}
    return {"preset": bench_config(preset(cfg.scaling_preset), cfg.window_adapter).name,
            "streams": detector.batch, "rows": rows, "gathering": _gathering(cfg, detector, replayed, log)}


class _Camera(FrameSource):
    """A live source sending a frame three times a sample period for ``seconds``."""

    live = True

    def __init__(self, name: str, fps: float, seconds: float):
        super().__init__(name, fps=fps)
        self.image, self.seconds = np.zeros((48, 64, 3), np.uint8), seconds

    def _frames(self):
        start = time.monotonic()
        while (now := time.monotonic() - start) < self.seconds:
            yield (lambda: self.image), now
            time.sleep(1.0 / (3 * self.fps))


def _gathering(cfg: BenchConfig, detector, replayed, log: Callable[[str], None]) -> dict:
    """A run of as many live cameras as the bundle's streams, one query, the model's step a sleep of STAND_IN_STEP_S:
    the stepping thread's CPU per step over the run's second half (gathering the frames, the detector's own work)."""
    detector.backend = _Replay(replayed, seconds=STAND_IN_STEP_S)
    _ask(detector, 1, NONE_ON)  # one query, off: the gathering's cost, not the alert states'
    cameras = [_Camera(f"camera{k}", detector.fps, cfg.alerting_seconds) for k in range(detector.batch)]
    log(f"running {len(cameras)} stand-in cameras for {cfg.alerting_seconds:g} s ...")
    # carry_state: the replayed step has no memory to carry (the frames stepped before were the timing's own)
    marks = [(time.thread_time(), time.monotonic()) for _ in detector.run(cameras, carry_state=True)]
    first, last = len(marks) // 2, len(marks) - 1
    steps = max(1, last - first)
    return {"cameras": len(cameras), "steps": len(marks), "stand_in_step_ms": STAND_IN_STEP_S * 1e3,
            "stepping_thread_cpu_ms": (marks[last][0] - marks[first][0]) * 1e3 / steps,
            "step_interval_ms": (marks[last][1] - marks[first][1]) * 1e3 / steps}


def _ask(detector, count: int, threshold: float) -> None:
    """The detector's queries replaced by ``count`` of its own, each at ``threshold``. Those thresholds are out of
    a score's reach on purpose (NONE_ON, ALL_ON), so the warning a user's query gets for one is not shown: it told
    the user of the bench that something was wrong with a query they never gave."""
    for qid in list(detector.queries.ids):
        detector.remove_query(qid)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThresholdOutOfReachWarning)
        for k in range(count):
            detector.add_query(f"query {k} of the bench", threshold=threshold)


class _Replay:
    """A step backend's stand-in that gives back one real step's result, after ``seconds`` (a GPU's step, whose
    thread waits without the GIL), the detector asking nothing else of it in a step of busy streams."""

    def __init__(self, result, seconds: float = 0.0):
        self.result, self.seconds = result, seconds

    def step(self, *args, **kwargs):
        if self.seconds:
            time.sleep(self.seconds)
        return self.result


def markdown(section: dict) -> list[str]:
    lines = ["", f"## The detector's own work per step ({section['streams']} streams, {section['preset']} on this "
                 "CPU; the model's step stood in by its result)", "",
             "| queries | every query off, ms | every query on, ms | bare step, ms | off / step |",
             "|---|---|---|---|---|"]
    lines += [f"| {count} | {row['none_on_ms']:.3f} | {row['all_on_ms']:.3f} | {row['bare_step_ms']:.2f} | "
              f"{row['none_on_over_step']:.3f} |" for count, row in section["rows"].items()]
    gathering = section.get("gathering")  # absent from results before December 2026
    if gathering:
        lines += ["", f"- {gathering['cameras']} live cameras, the step a {gathering['stand_in_step_ms']:g}-ms sleep: "
                      f"the stepping thread's CPU {gathering['stepping_thread_cpu_ms']:.2f} ms a step (gathering the "
                      f"frames and the detector's own work; a step every {gathering['step_interval_ms']:.0f} ms)"]
    return lines
