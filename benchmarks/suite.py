"""``sdqes-edge bench``: the cost of each model form, measured side by side in one run.

Sections (each a function, each adding to one JSON):
- table: per adapter kind and for the sliding-window baseline, parameters, MACs/FLOPs (from the exported
  graph), state bytes, per-frame latency per backend (PyTorch eager, ONNX Runtime fp32 and int8;
  TensorRT fp16 where an NVIDIA GPU is), all timed interleaved;
- scaling: per-frame latency and memory at the start and the end of a long stream, streaming step against a
  window that grows with the stream;
- batches: frames per second for several streams per step;
- precisions and end to end (``end_to_end``): one bundle's graphs side by side, and the runtime loop on a
  video file against the bare step;
- alerting: the detector's own work per step at many streams and queries (scoring, alert states, sinks' rows);
- device (``device``): the same rows on a GPU, with what a user would wire by hand.
Each section is saved to bench.json as soon as it is measured. Random weights throughout (``models``): cost
does not depend on weight values.
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from sdqes_edge.benchmarks.alerting import bench_alerting
from sdqes_edge.benchmarks.config import BACKENDS, RESULTS_FILE, BenchConfig
from sdqes_edge.benchmarks.device import bench_device, bench_device_batches, bench_device_scaling, check_device
from sdqes_edge.benchmarks.end_to_end import bench_end_to_end, bench_precisions
from sdqes_edge.benchmarks.machine_load import other_processes_cores, read_cpu_clock
from sdqes_edge.benchmarks.models import bench_config, bench_frame, bench_model, ort_step
from sdqes_edge.benchmarks.report import markdown, plots
from sdqes_edge.benchmarks.retention_kernel import bench_retention_kernel
from sdqes_edge.benchmarks.timing import interleaved, machine, peak_rss_bytes, rss_bytes
from sdqes_edge.config import preset
from sdqes_edge.contract import FP16, FP32, WINDOW_INPUT
from sdqes_edge.errors import DoesNotFit, UserError
from sdqes_edge.eval_plots import PLOTS_NEED, plotting_available
from sdqes_edge.export import graphs
from sdqes_edge.export.complexity import count_graph
from sdqes_edge.export.precision import TowerShape, quantize_int8
from sdqes_edge.files import write_text_atomically
from sdqes_edge.model import SDQESModel
from sdqes_edge.runtime.fused_ops import load_fused_ops
from sdqes_edge.runtime.kernels import count_kernels
from sdqes_edge.runtime.ort_sessions import create_session
from sdqes_edge.runtime.tensorrt_backend import tensorrt_ready
from sdqes_edge.sample import MAX_SHARE_OF_FREE_MEMORY, ORT_WINDOW_ACTIVATIONS, available_memory, window_bytes


def _torch_step(model: SDQESModel, frame: np.ndarray) -> Callable[[], object]:
    state = [model.init_state(frame.shape[0])]
    x = torch.from_numpy(frame)

    def step():
        with torch.no_grad():
            _, state[0] = model.step(x, state[0])
    return step


def _trt_step(path: Path, model: SDQESModel, frame: np.ndarray, work: Path, log) -> Callable[[], object]:
    """A TensorRT fp16 engine of the step graph at ``path`` (fp32), planned as build-engine plans it: from that
    graph with weak typing (TensorRT 8.5-10), from an fp16 graph traced here with strong typing (TensorRT 11)."""
    from sdqes_edge.export.tensorrt_engine import build_serialized_engine, plan_engine, weak_typing_available
    from sdqes_edge.runtime.tensorrt_backend import TensorRTStep, current_device, require_tensorrt

    current_device()  # CUDA must start here (a container without the GPU still shows the driver): one line if not
    trt = require_tensorrt()
    plan = plan_engine(FP16, (FP32, FP16), weak_typing_available(trt), trt.__version__)
    if plan.graph_precision == FP16:
        path = path.with_suffix(".fp16.onnx")
        graphs.export_step_graph(model, path, precision=FP16)
    operators = graphs.default_operators(plan.graph_precision)  # as exported here
    serialized, _ = build_serialized_engine(path, plan, 4096, work / "timing.cache", operators, log)
    engine = path.with_suffix(".engine")
    engine.write_bytes(serialized)
    runner = TensorRTStep(engine, model.state_spec(frame.shape[0]), model.cfg.embed_dim, frame.shape[-1],
                          frame.shape[0])
    state = [runner.initial_state()]

    def step():
        state[0] = runner.step(frame, state[0]).state
    return step


# --- the main table --------------------------------------------------------------------

def bench_table(cfg: BenchConfig, work: Path, log: Callable[[str], None]) -> dict:
    base = preset(cfg.preset)
    frame = bench_frame(base)
    candidates: dict[str, Callable[[], object]] = {}
    rows: dict[str, dict] = {}
    for kind in cfg.adapters:
        rows[kind] = _streaming_row(cfg, bench_model(bench_config(base, kind)), kind, frame, work, log, candidates)
    window = f"window{cfg.window}"
    window_model = bench_model(bench_config(base, cfg.window_adapter))
    rows[window] = _window_row(cfg, window_model, window, frame, work, log, candidates)
    log(f"timing {len(candidates)} candidates x {cfg.repetitions} repetitions, interleaved ...")
    timings = interleaved(candidates, cfg.repetitions, cfg.warmup, progress=log)
    for key, timing in timings.items():
        row, backend = key.split("/")
        rows[row].setdefault("latency", {})[backend] = timing.to_dict()
    return {"rows": rows, "ratios": _ratios(cfg, rows, window)}


def _counted_row(model: SDQESModel, path: Path, form: str, state_bytes: int) -> dict:
    """Parameters (the model's), MACs and FLOPs counted on the exported graph, state bytes and kernels per step."""
    counted = count_graph(path)
    return {"form": form, "parameters": sum(p.numel() for p in model.visual.parameters()),
            "adapter_parameters": model.visual.adapter_parameters(),
            "macs": counted.macs, "flops": counted.flops, "state_bytes": state_bytes,
            "kernels": count_kernels(path).per_step}


def _streaming_row(cfg: BenchConfig, model: SDQESModel, kind: str, frame: np.ndarray, work: Path,
                   log: Callable[[str], None], candidates: dict) -> dict:
    """One adapter kind's step graph: its row, and its step on every backend added to ``candidates``."""
    log(f"exporting {model.cfg.name} ...")
    path = work / f"{kind}.onnx"
    graphs.export_step_graph(model, path)
    candidates[f"{kind}/torch"] = _torch_step(model, frame)
    candidates[f"{kind}/ort_fp32"] = ort_step(path, frame, cfg.threads)
    if tensorrt_ready():
        candidates[f"{kind}/trt_fp16"] = _trt_step(path, model, frame, work, log)
    if cfg.int8:
        log(f"quantizing {model.cfg.name} to int8 ...")
        quantize_int8(path, work / f"{kind}.int8.onnx", np.repeat(frame[None], cfg.calibration_frames, 0))
        candidates[f"{kind}/ort_int8"] = ort_step(work / f"{kind}.int8.onnx", frame, cfg.threads)
    return _counted_row(model, path, "streaming step", model.state_spec(1).nbytes)


def _window_row(cfg: BenchConfig, model: SDQESModel, name: str, frame: np.ndarray, work: Path,
                log: Callable[[str], None], candidates: dict) -> dict:
    """The sliding-window baseline: the window form over the last W frames, recomputed every frame."""
    log(f"exporting the {cfg.window}-frame sliding window ({model.cfg.name}) ...")
    path = work / f"{name}.onnx"
    graphs.export_window_graph(model, path, window=cfg.window)
    window_frames = np.repeat(frame[:, None], cfg.window, axis=1)  # [1, W, 3, R, R]
    x = torch.from_numpy(window_frames)

    def torch_window():
        with torch.no_grad():
            model.forward_clip(x)
    candidates[f"{name}/torch"] = torch_window
    window_session, _ = create_session(path, "cpu", cfg.threads)
    candidates[f"{name}/ort_fp32"] = lambda: window_session.run(None, {WINDOW_INPUT: window_frames})
    if cfg.int8:
        log("quantizing the sliding window to int8 ...")
        feeds = iter([{WINDOW_INPUT: window_frames}] * cfg.calibration_frames)
        vision = model.cfg.vision
        quantize_int8(path, work / f"{name}.int8.onnx", window_frames, feeds=feeds,
                      tower=TowerShape(vision.width, vision.layers))
        window_int8, _ = create_session(work / f"{name}.int8.onnx", "cpu", cfg.threads)
        candidates[f"{name}/ort_int8"] = lambda: window_int8.run(None, {WINDOW_INPUT: window_frames})
    # It keeps the last W frames instead of a state.
    return _counted_row(model, path, f"{cfg.window}-frame sliding window ({cfg.window_adapter})",
                        int(window_frames.nbytes))


def _ratios(cfg: BenchConfig, rows: dict, window: str) -> dict[str, float]:
    def p50(row: str, backend: str) -> float | None:
        return rows.get(row, {}).get("latency", {}).get(backend, {}).get("p50_ms")

    ratios = {}
    stream_row = cfg.window_adapter if cfg.window_adapter in rows else None
    for backend in BACKENDS:
        if stream_row and p50(window, backend) and p50(stream_row, backend):
            ratios[f"{window} / streaming {stream_row} ({backend})"] = p50(window, backend) / p50(stream_row, backend)
    for kind in cfg.adapters:
        if kind != "none" and "none" in rows:
            ratios[f"{kind} / backbone (ort_fp32)"] = p50(kind, "ort_fp32") / p50("none", "ort_fp32")
    for row in rows:
        ratios[f"{row}: torch / ort_fp32"] = p50(row, "torch") / p50(row, "ort_fp32")
        if p50(row, "ort_int8"):
            ratios[f"{row}: ort_fp32 / ort_int8"] = p50(row, "ort_fp32") / p50(row, "ort_int8")
    return ratios


# --- scaling with stream length ---------------------------------------------------------

def bench_scaling(cfg: BenchConfig, log: Callable[[str], None]) -> dict:
    """Streaming step over a long stream against recomputing a window that holds the whole stream so far."""
    mcfg = bench_config(preset(cfg.scaling_preset), cfg.window_adapter)
    model = bench_model(mcfg)
    n, probe = cfg.scaling_frames, cfg.scaling_probe
    frames = torch.from_numpy(bench_frame(mcfg))  # [1, 3, R, R]
    log(f"streaming {n} frames through {mcfg.name} ...")
    step_ms, step_rss = [], []
    with torch.no_grad():
        warm = model.init_state(1)
        for _ in range(cfg.warmup * 10):  # first calls pay for allocation and kernel selection, not the stream
            _, warm = model.step(frames, warm)
        state = model.init_state(1)
        for t in range(n):
            start = time.perf_counter()
            _, state = model.step(frames, state)
            step_ms.append((time.perf_counter() - start) * 1e3)
            step_rss.append(rss_bytes())
    early, late = np.median(step_ms[:probe]), np.median(step_ms[n - probe:])
    rss_early, rss_late = np.median(step_rss[:probe]), np.median(step_rss[n - probe:])

    log(f"recomputing a growing window at frames 1-{probe} and {n - probe + 1}-{n} (sampled) ...")
    window_points = []
    sample_ts = sorted(set(np.linspace(1, probe, cfg.growing_window_samples, dtype=int).tolist()
                           + np.linspace(n - probe + 1, n, cfg.growing_window_samples, dtype=int).tolist()))
    with torch.no_grad():
        for t in sample_ts:
            window = frames[:, None].expand(1, t, *frames.shape[1:]).contiguous()
            start = time.perf_counter()
            model.forward_clip(window)
            # Peak memory: the window's activations are freed as soon as it returns. This section runs
            # first in the benchmark, so the peak is not an earlier section's.
            window_points.append((t, (time.perf_counter() - start) * 1e3, peak_rss_bytes()))
            del window
    w_early = np.median([ms for t, ms, _ in window_points if t <= probe])
    w_late = np.median([ms for t, ms, _ in window_points if t > n - probe])
    return {"preset": mcfg.name, "frames": n, "probe": probe,
            "streaming": {"early_ms": float(early), "late_ms": float(late), "late_over_early": float(late / early),
                          "rss_early": int(rss_early), "rss_late": int(rss_late),
                          "per_frame_ms": [float(x) for x in step_ms]},
            "growing_window": {"early_ms": float(w_early), "late_ms": float(w_late),
                               "late_over_early": float(w_late / w_early),
                               "points": [{"frames": t, "ms": ms, "rss": r} for t, ms, r in window_points]}}


# --- several streams per step ---------------------------------------------------------------

def bench_batches(cfg: BenchConfig, work: Path, log: Callable[[str], None]) -> dict:
    mcfg = bench_config(preset(cfg.preset), cfg.window_adapter)
    model = bench_model(mcfg)
    candidates = {}
    for b in cfg.batches:
        log(f"exporting {mcfg.name} at batch {b} ...")
        path = work / f"batch{b}.onnx"
        graphs.export_step_graph(model, path, batch=b)
        candidates[str(b)] = ort_step(path, bench_frame(mcfg, b), cfg.threads)
    timings = interleaved(candidates, max(3, cfg.repetitions // 2), cfg.warmup)
    return {"preset": mcfg.name, "backend": "ort_fp32",
            "batches": {b: {"step_ms": t.median, "streams_fps": int(b) * 1000.0 / t.median}
                        for b, t in timings.items()}}


# --- reports -----------------------------------------------------------------------------------

# What a run measures, in order: (where in the results, how). Each is saved as soon as it is measured.
Section = tuple[tuple[str, ...], Callable[[Path], dict]]


def device_models(cfg: BenchConfig) -> dict:
    """What the device's rows compare: the backbone and the window adapter's model, same random weights."""
    base = preset(cfg.preset)
    return {"none": bench_model(base), cfg.window_adapter: bench_model(bench_config(base, cfg.window_adapter))}


def device_sections(cfg: BenchConfig, log: Callable[[str], None]) -> list[Section]:
    """The rows measured on ``cfg.device``, each section saved as soon as measured: batch 1, several streams per
    step, the long stream, the runtime loop. The two models are built once, for the first two."""
    base = preset(cfg.preset)
    models = functools.lru_cache(maxsize=None)(lambda: device_models(cfg))

    def frame_of(batch: int) -> np.ndarray:
        return bench_frame(base, batch)

    return [(("device",), lambda work: bench_device(cfg, models(), frame_of, work, log)),
            (("device", "batches"), lambda work: bench_device_batches(cfg, models(), frame_of, work, log)),
            (("device", "scaling"), lambda work: bench_device_scaling(cfg, work, log)),
            (("device", "end_to_end"), lambda work: bench_end_to_end(cfg, work, log, ort_device=cfg.device,
                                                                     precisions=(FP32, FP16),
                                                                     sampled=cfg.device_e2e_frames))] + (
        [(("device", "retention"), lambda work: bench_retention_kernel(cfg, frame_of, work, log))]
        if cfg.ort_ops else [])  # the RetNet step with the library's retention kernel and without, last


def _sections(cfg: BenchConfig, log: Callable[[str], None]) -> list[Section]:
    sections: list[Section] = []
    if not cfg.device_only:
        sections += [(("scaling",), lambda work: bench_scaling(cfg, log)),  # first: its peak-memory reading needs
                     (("table",), lambda work: bench_table(cfg, work, log)),  # a small process
                     (("batches",), lambda work: bench_batches(cfg, work, log)),
                     (("precisions",), lambda work: bench_precisions(cfg, work, log)),
                     (("end_to_end",), lambda work: bench_end_to_end(cfg, work, log)),
                     (("alerting",), lambda work: bench_alerting(cfg, work, log))]
    if cfg.device:
        sections += device_sections(cfg, log)
    return sections


def check_config(cfg: BenchConfig) -> None:
    """Refuse, before any work, settings that cannot be measured and a device this machine lacks."""
    if cfg.window < 2:
        raise UserError(f"--window must be at least 2 frames, not {cfg.window}")
    _check_window_fits(cfg)
    if cfg.repetitions < 3:
        raise UserError(f"--repetitions must be at least 3 for percentiles, not {cfg.repetitions}")
    if cfg.scaling_probe * 2 > cfg.scaling_frames:
        raise UserError("the scaling stream must hold two probes: --scaling-frames >= 2 x probe")
    if cfg.device_only and not cfg.device:
        raise UserError("--device-only measures only the rows of --device; add --device cuda")
    if cfg.ort_ops and not cfg.device:
        raise UserError("--ort-ops times the device's steps with those kernels; add --device cuda")
    if cfg.device:
        check_device(cfg.device)  # before minutes of CPU work
    if cfg.ort_ops:  # a library that will not load or cannot run on the device, refused now
        usable = load_fused_ops(cfg.ort_ops).usable_on(cfg.device)
        if usable is not None:
            raise UserError(usable)


def _check_window_fits(cfg: BenchConfig) -> None:
    """Refuse a sliding window whose frames, all held at once, would not fit in memory: the process would be
    killed (SIGKILL, no message) minutes into the run, once the kernel's overcommit comes due."""
    free = available_memory()
    needed = functools.partial(window_bytes, preset(cfg.preset).vision, activations_per_frame=ORT_WINDOW_ACTIVATIONS)
    if free is None or needed(cfg.window) <= MAX_SHARE_OF_FREE_MEMORY * free:
        return
    fits = int(MAX_SHARE_OF_FREE_MEMORY * free // needed(1))
    fix = f"give --window {fits} or less" if fits >= 2 else "free memory, or give a smaller --preset"
    raise DoesNotFit(f"--window {cfg.window}: the sliding window holds all its frames at once, and {cfg.window} "
                     f"frames of {cfg.preset} need at least {needed(cfg.window) / 2**30:.1f} GiB, where "
                     f"{free / 2**30:.1f} GiB is free; {fix} (default {BenchConfig.window})")


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """PyTorch's intra-op threads set to ``threads`` (None: as they are) while the benchmark runs: its rows are
    compared with ONNX Runtime's, which get the same count; restored after."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(cfg: BenchConfig, log: Callable[[str], None] = print) -> tuple[dict, list[Path]]:
    """Every section of ``cfg``, PyTorch and ONNX Runtime on ``cfg.threads`` threads alike."""
    with torch_threads(cfg.threads):
        return _run(cfg, log)


def _run(cfg: BenchConfig, log: Callable[[str], None]) -> tuple[dict, list[Path]]:
    check_config(cfg)
    can_plot = plotting_available()
    if not can_plot and not cfg.device_only:  # a device-only run draws none
        log(f"note: no plots: {PLOTS_NEED}; bench.json and bench.md are written as usual")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    started, clock = time.perf_counter(), read_cpu_clock()
    results: dict = {"config": asdict(cfg), "machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        for (*parents, name), measure in _sections(cfg, log):
            place = results
            for parent in parents:
                place = place[parent]
            place[name] = measure(Path(tmp))
            # A run cut short (a time limit on a lent GPU, Ctrl-C) keeps every section it finished.
            results["seconds"] = time.perf_counter() - started
            results["machine"]["other_processes_cores"] = other_processes_cores(clock, read_cpu_clock())
            write_text_atomically(out / RESULTS_FILE, json.dumps({**results, "complete": False}, indent=2))
    results["complete"] = True
    write_text_atomically(out / RESULTS_FILE, json.dumps(results, indent=2))
    (out / "bench.md").write_text(markdown(results))
    drawn = plots(results, out) if can_plot and not cfg.device_only else []  # the plots draw the CPU sections
    return results, [out / RESULTS_FILE, out / "bench.md", *drawn]
