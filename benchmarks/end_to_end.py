"""The deployment side of ``sdqes-edge bench``: one exported bundle's fp32/fp16/int8 step graphs side by side,
and the whole runtime loop on an mp4 (decode, preprocess, step, score, alert) against the bare step."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from sdqes_edge.benchmarks.config import BenchConfig
from sdqes_edge.benchmarks.models import bench_config, bench_model, ort_step
from sdqes_edge.benchmarks.timing import interleaved
from sdqes_edge.config import preset
from sdqes_edge.contract import FP16, FP32, PRECISIONS, step_graph_name
from sdqes_edge.runtime.backend import warm_up
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep, SlowPrecisionWarning
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.sample import sample_frames_in_parallel


def _end_to_end_bundle(cfg: BenchConfig, work: Path, log: Callable[[str], None], sampled: int | None = None
                       ) -> tuple[Path, Path, np.ndarray]:
    """(bundle with fp32/fp16/int8 step graphs, a 640x360 mp4 at 10 fps, its ``sampled`` 1-fps frames
    preprocessed; default ``cfg.e2e_frames``)."""
    import cv2

    from sdqes_edge.export import ExportOptions, export_bundle

    mcfg = bench_config(preset(cfg.preset), cfg.window_adapter)
    bundle = work / "bundle"
    sampled = sampled or cfg.e2e_frames
    video = work / f"stream-{sampled}.mp4"
    frames = sample_frames_in_parallel(sampled * 10, 360, 640)  # 10 fps video, sampled at the bundle's 1 fps
    if not bundle.exists():  # the CPU and the device loops share one bundle
        precisions = PRECISIONS if cfg.int8 else (FP32, FP16)
        log(f"exporting a {mcfg.name} bundle ({', '.join(precisions)}) for the precision and end-to-end rows ...")
        # Random weights and a speed measurement: calibration and drift frames change no timing, so few.
        options = ExportOptions(precisions=precisions, verify_frames=16, drift_frames=16,
                                calibration_frames=cfg.calibration_frames, show_progress=False)
        export_bundle(bench_model(mcfg), bundle, options, log=lambda m: None)
    if not video.exists():
        writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (640, 360))
        for f in frames:
            writer.write(f)
        writer.release()
    return bundle, video, Preprocessor.from_config(mcfg).batch(frames[::10])[:, None]


def bench_precisions(cfg: BenchConfig, work: Path, log: Callable[[str], None]) -> dict:
    """fp32, fp16 and int8 step graphs of one bundle on the CPU: interleaved, then each alone."""
    bundle, _, inputs = _end_to_end_bundle(cfg, work, log)
    precisions = [p for p in PRECISIONS if (bundle / step_graph_name(p)).is_file()]
    candidates = {p: ort_step(bundle / step_graph_name(p), inputs[0], cfg.threads) for p in precisions}
    log(f"timing the {'/'.join(precisions)} steps interleaved, then each alone ...")
    together = interleaved(candidates, cfg.repetitions, cfg.warmup)
    alone = {p: interleaved({p: step}, cfg.repetitions, cfg.warmup)[p] for p, step in candidates.items()}
    rows = {p: {"interleaved": together[p].to_dict(), "alone": alone[p].to_dict()} for p in precisions}
    for p in precisions:
        rows[p]["speedup_interleaved"] = together[FP32].median / together[p].median
        rows[p]["speedup_alone"] = alone[FP32].median / alone[p].median
    return {"preset": bench_config(preset(cfg.preset), cfg.window_adapter).name, "threads": cfg.threads,
            "rows": rows}


def _bare_step_ms(graph: Path, inputs: list, threads: int | None, ort_device: str) -> float:
    """The bare step of ``graph`` over the loop's frames, preprocessed beforehand: ms per frame."""
    with warnings.catch_warnings():  # every precision on purpose, as the loop's
        warnings.simplefilter("ignore", SlowPrecisionWarning)
        runner = OnnxRuntimeStep(graph, threads=threads, device=ort_device)
    warm_up(runner, inputs[0], runner.initial_state())  # as the loop's warm-up
    state = runner.initial_state()
    start = time.perf_counter()
    for x in inputs:
        state = runner.step(x, state).state
    return (time.perf_counter() - start) * 1e3 / len(inputs)


def bench_end_to_end(cfg: BenchConfig, work: Path, log: Callable[[str], None], ort_device: str = "cpu",
                     precisions: tuple[str, ...] = PRECISIONS, sampled: int | None = None) -> dict:
    """The whole runtime loop on an mp4 of ``sampled`` frames (decode, preprocess, step, score, alert) at each
    precision, against the bare step of the same precision on the same frames preprocessed beforehand (the
    top-level figures are fp32's; ``by_precision`` has each one's, fp16 being the GPU's format)."""
    from sdqes_edge.runtime.detector import StreamingDetector
    from sdqes_edge.runtime.sources import open_source

    bundle, video, inputs = _end_to_end_bundle(cfg, work, log, sampled)
    precisions = tuple(p for p in precisions if (bundle / step_graph_name(p)).is_file())

    def loop(precision: str) -> _Timed:
        with warnings.catch_warnings():  # every precision on purpose: the table reports what each one costs
            warnings.simplefilter("ignore", SlowPrecisionWarning)
            detector = StreamingDetector(bundle, precision=precision, threads=cfg.threads, ort_device=ort_device)
        detector.add_query("When I start to clean or wipe the table, remind me to sanitize my hands.")
        detector.warm_up()  # as `sdqes-edge run` does: one-off work (CUDA graph capture) is not a frame's cost
        return _Timed.of(lambda: detector.run(open_source(str(video), detector.fps)))

    source_side = StreamingDetector(bundle, threads=cfg.threads)  # its fps and preprocessing, as the loop's

    def reader() -> _Timed:
        """The loop's source side alone (decode, sample, preprocess, in its thread): a floor under the loop on a
        device whose step is faster."""
        return _Timed.of(lambda: open_source(str(video), source_side.fps).threaded(prepare=source_side.preprocess))

    log(f"timing the runtime loop ({', '.join(precisions)}) against the bare step (alternating) ...")
    loop_runs: dict[str, list[_Timed]] = {p: [] for p in precisions}
    bare_ms: dict[str, list[float]] = {p: [] for p in precisions}
    reader_runs = []
    for _ in range(3):
        for precision in precisions:
            loop_runs[precision].append(loop(precision))
            bare_ms[precision].append(_bare_step_ms(bundle / step_graph_name(precision), inputs, cfg.threads,
                                                    ort_device))
        reader_runs.append(reader())
    loops = {p: _Timed.median(runs) for p, runs in loop_runs.items()}
    bares = {p: float(np.median(v)) for p, v in bare_ms.items()}
    source = _Timed.median(reader_runs)
    lm, bm, rm = loops[FP32].per_frame_ms, bares[FP32], source.per_frame_ms
    return {"preset": bench_config(preset(cfg.preset), cfg.window_adapter).name,
            "video": "640x360 mp4 at 10 fps, sampled at 1 fps", "frames": len(inputs), "ort_device": ort_device,
            "loop_ms_per_frame": lm, "bare_step_ms_per_frame": bm, "overhead": lm / bm - 1.0,
            "loop_start_ms": loops[FP32].start_ms, "loop_with_start_ms_per_frame": loops[FP32].with_start_ms,
            "reader_ms_per_frame": rm, "reader_start_ms": source.start_ms,
            # The reader thread and the step overlap: the loop can be no faster than the slower of the two. Over
            # that floor is what the runtime's own mechanics cost (1.0: none); decoding 10 frames per sample may
            # make the source, not the step, the floor.
            "loop_over_slower_half": lm / max(bm, rm),
            "loop_fps": {p: 1e3 / timed.per_frame_ms for p, timed in loops.items()},
            "by_precision": {p: {"loop_ms_per_frame": loops[p].per_frame_ms, "bare_step_ms_per_frame": bares[p],
                                 "loop_over_step": loops[p].per_frame_ms / bares[p],
                                 "loop_start_ms": loops[p].start_ms,
                                 "loop_with_start_ms_per_frame": loops[p].with_start_ms,
                                 "loop_over_slower_half": loops[p].per_frame_ms / max(bares[p], rm)}
                             for p in precisions}}


@dataclass(frozen=True)
class _Timed:
    """One pass over the video: ``per_frame_ms`` from its first frame to its last (what each further frame costs),
    ``start_ms`` before its first (opening the video, decoding and preparing the first frame: once a run), and
    ``with_start_ms`` the whole pass per frame. The bare step it is set against has no start in its time. On this
    2-core CPU, with the step a 4-ms sleep, the start took 17-45 ms before the first of 200 frames: 0.1-0.2 ms a
    frame, beside the 0.4 ms a frame the whole pass had cost over the bare step on an H200."""

    per_frame_ms: float
    start_ms: float
    with_start_ms: float

    @classmethod
    def of(cls, frames: Callable[[], Iterable]) -> "_Timed":
        """``frames()`` made and iterated to its end, the time of each item taken."""
        start = time.perf_counter()
        marks = [time.perf_counter() for _ in frames()]
        whole = (marks[-1] - start) * 1e3 / len(marks)
        steady = (marks[-1] - marks[0]) * 1e3 / (len(marks) - 1) if len(marks) > 1 else whole
        return cls(steady, (marks[0] - start) * 1e3, whole)

    @classmethod
    def median(cls, runs: list["_Timed"]) -> "_Timed":
        return cls(*(float(np.median([getattr(run, f.name) for run in runs])) for f in fields(cls)))
