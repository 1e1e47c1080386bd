"""``sdqes-edge bench --device cuda``: the step on a GPU, side by side with what a user would wire by hand.

Rows, all timed interleaved in one run (batch 1 unless said):
- PyTorch eager on the device, fp32 and fp16 (the peer a user wires by hand);
- the project's ONNX Runtime step, fp32 and fp16, state bound on the device (two buffer sets), CUDA graphs;
- the W-frame sliding window on the same backend with the same treatment (frames and output bound once,
  CUDA graph replay), fp32 and fp16, each in the step graph's form of its precision (the same operators and
  rewrites): a fair baseline;
- several streams per step (frames per second), backbone and adapters, fp32 and fp16, and at the most
  streams one of them idle (its state kept on the device, as the detector keeps it);
- a long stream (first and last frames' latency);
- the runtime loop on an mp4 against the bare step on the same device, fp32 and fp16 (each against its own).

The section is written for any ONNX Runtime device: ``--device cpu`` runs the same code (without CUDA
graphs), which is how it is tested on machines without a GPU.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from sdqes_edge.contract import FP16, FP32, PLAIN_ONNX_OPERATORS, WINDOW_INPUT
from sdqes_edge.errors import UserError
from sdqes_edge.export import graphs
from sdqes_edge.export.graphs import compute_model
from sdqes_edge.package_builds import CUDA_PROVIDER, load_onnxruntime, missing_provider_words
from sdqes_edge.runtime.backend import frame_batch_buffer, warm_up
from sdqes_edge.runtime.bound_step import runs_to_steady
from sdqes_edge.runtime.fused_ops import load_fused_ops
from sdqes_edge.runtime.kernels import count_kernels
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.ort_sessions import create_session

from .kernels_on_device import device_kernels, on_device_lines
from .timing import interleaved

PRECISIONS = (FP32, FP16)  # int8 QDQ graphs are a CPU (and TensorRT) format
UPLOAD = "frame upload alone"  # a candidate timed among the steps at the most streams, not a row of its own


def check_device(device: str) -> None:
    """Refuse up front, before any work, what this machine cannot run."""
    ort = load_onnxruntime()
    if device == "cpu":
        return
    if device != "cuda":
        raise UserError(f"--device {device!r} is not one of cpu, cuda")
    if CUDA_PROVIDER not in ort.get_available_providers():
        words = missing_provider_words(CUDA_PROVIDER, ort, on_cpu="leave out --device to measure on the CPU alone")
        raise UserError(f"--device cuda: {words}")
    if not torch.cuda.is_available():
        raise UserError("--device cuda needs a CUDA build of torch for the PyTorch rows; install one, or "
                        "compare on --device cpu")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def torch_step(model, frame: np.ndarray, device: str, precision: str) -> Callable[[], object]:
    """PyTorch eager step on ``device``, the state kept there, timed to completion.

    Steps a copy off the CPU: the caller's model is traced again after (the window graph) with inputs on the CPU."""
    twin = compute_model(model, precision, device)
    dtype = torch.float16 if precision == FP16 else torch.float32
    x = torch.from_numpy(frame).to(device, dtype)
    state = [[s.to(dtype) for s in twin.init_state(frame.shape[0])]]

    def step():
        with torch.no_grad():
            _, state[0] = twin.step(x, state[0])
        _sync(device)
    return step


def ort_step(path: Path, frame: np.ndarray, device: str, threads: int | None, idle: tuple[int, ...] = (),
             fused_ops: str | None = None) -> tuple[Callable[[], object], OnnxRuntimeStep]:
    """The project's ONNX Runtime step as the runtime uses it (bound state; CUDA graphs on a GPU)
    -> (step, the runner: ``cuda_graph`` says whether it replays a CUDA graph). ``idle``: streams that see no
    frame, and keep their state, as the detector keeps them. ``fused_ops``: this project's kernel library."""
    runner = OnnxRuntimeStep(path, device=device, threads=threads, io_binding=True, fused_ops=fused_ops)
    if frame.shape[0] > 1:  # several streams: assembled where the step uploads from, as the detector does
        frame = _assembled(frame_batch_buffer(runner, frame.shape), frame)
    state = [runner.initial_state()]
    state[0] = warm_up(runner, frame, state[0])  # as the runtime does: both bindings captured before timing

    def step():
        new = runner.step(frame, state[0]).state  # the embedding comes back to the host: a full sync
        state[0] = runner.keep_streams(new, state[0], list(idle)) if idle else new
    return step, runner


def _assembled(buffer: np.ndarray, frames: np.ndarray) -> np.ndarray:
    np.copyto(buffer, frames)
    return buffer


def bound_window(path: Path, frames: np.ndarray, device: str, threads: int | None, fused_ops: str | None = None
                 ) -> tuple[Callable[[], object], bool]:
    """The sliding-window graph with the step's treatment: input and output bound once, CUDA graph replay,
    this project's kernel library where the step has it -> (window step, whether it replays a CUDA graph)."""
    ort = load_onnxruntime()
    session, captured = create_session(path, device, threads, cuda_graph=device == "cuda",
                                       fused_ops=load_fused_ops(fused_ops) if fused_ops else None)
    ort_device = "cuda" if device == "cuda" else "cpu"
    host = np.ascontiguousarray(frames, dtype=np.float32)
    frames_value = ort.OrtValue.ortvalue_from_numpy(host, ort_device, 0)
    shape = session.get_outputs()[0].shape
    embedding = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, ort_device, 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input(WINDOW_INPUT, frames_value)
    binding.bind_ortvalue_output(session.get_outputs()[0].name, embedding)
    run_options = ort.RunOptions()
    if captured:
        run_options.add_run_config_entry("gpu_graph_id", "1")

    def window():
        frames_value.update_inplace(host)  # a new frame enters the window: all W frames go up again
        session.run_with_iobinding(binding, run_options)
        embedding.numpy()
    for _ in range(runs_to_steady(captured)):  # captured before timing, as the step is
        window()
    return window, captured


def timing_graph(model, path: Path, batch: int, precision: str, device: str, operators: str | None = None) -> Path:
    """A step graph for timing, traced on ``device`` (minutes less at fp16 and 32 streams than on a CPU);
    ``operators``: ``export_step_graph``'s (default: the precision's own)."""
    if not path.exists():
        graphs.export_step_graph(model, path, batch=batch, precision=precision, trace_device=device,
                                 operators=operators)
    return path


def _window(model, work: Path, window: int, precision: str, device: str) -> Path:
    """The sliding-window graph of ``precision`` in the step graph's form of that precision, traced on
    ``device`` as the step graphs are."""
    path = work / f"{device}-window{window}.{precision}.onnx"
    if not path.exists():
        graphs.export_window_graph(model, path, window=window, precision=precision, trace_device=device)
    return path


def _plain_fp16(model, work: Path, batch: int, device: str) -> Path:
    """The fp16 step graph in plain ONNX, beside the one with ONNX Runtime's fused operators (the default)."""
    return timing_graph(model, work / f"{device}-plain-b{batch}.fp16.onnx", batch, FP16, device, PLAIN_ONNX_OPERATORS)


def bench_device(cfg, models: dict, frame_of: Callable[[int], np.ndarray], work: Path,
                 log: Callable[[str], None]) -> dict:
    """``models``: {"none": backbone, kind: adapted model} of one preset; ``frame_of(batch)`` a frame batch."""
    device, kind = cfg.device, cfg.window_adapter
    frame = frame_of(1)
    candidates: dict[str, Callable[[], object]] = {}
    replayed: dict[str, bool] = {}  # ONNX Runtime candidates: a CUDA graph replayed, or refused (a warning says why)
    for name, model in models.items():
        for precision in PRECISIONS:
            log(f"[{device}] exporting {name} {precision} ...")
            path = timing_graph(model, work / f"{device}-{name}-b1.{precision}.onnx", 1, precision, device)
            candidates[f"{name}/torch_{precision}"] = torch_step(model, frame, device, precision)
            candidates[f"{name}/ort_{precision}"], runner = ort_step(path, frame, device, cfg.threads)
            replayed[f"{name}/ort_{precision}"] = runner.cuda_graph
    plain = f"{kind}/ort_fp16_plain_onnx"  # the same fp16 graph without ONNX Runtime's fused operators
    candidates[plain], runner = ort_step(_plain_fp16(models[kind], work, 1, device), frame, device, cfg.threads)
    replayed[plain] = runner.cuda_graph
    ops = f"{kind}/ort_fp16_sdqes_kernels"  # the same fp16 graph, its QRNN pooling steps one kernel each
    if cfg.ort_ops:
        candidates[ops], runner = ort_step(work / f"{device}-{kind}-b1.{FP16}.onnx", frame, device, cfg.threads,
                                           fused_ops=cfg.ort_ops)
        replayed[ops] = runner.cuda_graph
    window_frames = np.repeat(frame[:, None], cfg.window, axis=1)
    for precision in PRECISIONS:
        log(f"[{device}] exporting the {cfg.window}-frame window {precision} ...")
        window_key = f"window{cfg.window}/ort_{precision}"
        candidates[window_key], replayed[window_key] = bound_window(
            _window(models[kind], work, cfg.window, precision, device), window_frames, device, cfg.threads)
    if cfg.ort_ops:  # its scan over the frames one kernel, as the step's pooling is
        window_key = f"window{cfg.window}/ort_fp16_sdqes_kernels"
        candidates[window_key], replayed[window_key] = bound_window(
            _window(models[kind], work, cfg.window, FP16, device), window_frames, device, cfg.threads, cfg.ort_ops)
    log(f"[{device}] timing {len(candidates)} candidates x {cfg.repetitions} repetitions, interleaved ...")
    timings = {k: t.to_dict() for k, t in interleaved(candidates, cfg.repetitions, cfg.warmup, log).items()}

    ratios = _batch_one_ratios(timings, kind, cfg.window, plain, ops if cfg.ort_ops else None)
    kernels = {}
    from sdqes_edge.export.complexity import graph_casts

    for name in models:
        counted = count_kernels(work / f"{device}-{name}-b1.fp32.onnx")
        # The CPU profile of an fp16 graph has ONNX Runtime's own Casts; a GPU runs the graph's.
        kernels[name] = {"per_step": counted.per_step, "views": counted.views,
                         "fp16_graph_casts": graph_casts(work / f"{device}-{name}-b1.{FP16}.onnx")}
    on_device = {name: device_kernels(work / f"{device}-{name}-b1.{FP16}.onnx", device, frame) for name in models}
    on_device[plain] = device_kernels(_plain_fp16(models[kind], work, 1, device), device, frame)
    if cfg.ort_ops:
        on_device[ops] = device_kernels(work / f"{device}-{kind}-b1.{FP16}.onnx", device, frame, fused_ops=cfg.ort_ops)
    return {"device": device, "latency": timings, "ratios": ratios, "kernels_cpu_profile": kernels,
            "kernels_on_device": on_device, "cuda_graph_replayed": replayed}


def _batch_one_ratios(timings: dict, kind: str, window: int, plain: str, ops: str | None) -> dict[str, float]:
    """The batch-1 ratios from the interleaved ``timings``; ``plain``: the fp16 step in plain ONNX; ``ops``: the
    fp16 step with this project's kernels, if timed."""
    def p50(key: str) -> float:
        return timings[key]["p50_ms"]

    ratios = {
        f"window{window} / streaming {kind} (ort_{precision}, same treatment)":
        p50(f"window{window}/ort_{precision}") / p50(f"{kind}/ort_{precision}") for precision in PRECISIONS}
    ratios |= {
        f"{kind} / backbone (ort_fp16)": p50(f"{kind}/ort_fp16") / p50("none/ort_fp16"),
        f"{kind}: torch_fp16 / ort_fp16": p50(f"{kind}/torch_fp16") / p50(f"{kind}/ort_fp16"),
        f"{kind}: ort_fp32 / ort_fp16": p50(f"{kind}/ort_fp32") / p50(f"{kind}/ort_fp16"),
        f"{kind}: ort_fp16 plain ONNX / with ONNX Runtime's fused operators": p50(plain) / p50(f"{kind}/ort_fp16"),
    }
    if ops:  # both with the kernel library: the step's pooling and the window's scan one kernel each
        ratios |= {
            f"window{window} / streaming {kind} (ort_fp16 with sdqes_edge kernels, same treatment)":
                p50(f"window{window}/ort_fp16_sdqes_kernels") / p50(ops),
            f"{kind} with sdqes_edge kernels / backbone (ort_fp16)": p50(ops) / p50("none/ort_fp16"),
            f"{kind}: ort_fp16 / with sdqes_edge kernels": p50(f"{kind}/ort_fp16") / p50(ops)}
    return ratios


def bench_device_batches(cfg, models: dict, frame_of, work: Path, log) -> dict:
    """Several streams per step; at the most streams, also the adapted fp16 step with one stream idle (its
    state kept, rows copied on the device), against the same step with every stream busy. A section of its
    own, saved as soon as measured: a run cut short (a lent GPU's time limit) keeps the batch-1 rows."""
    kind, top = cfg.window_adapter, max(cfg.device_batches)
    candidates, frames, runners = {}, {}, {}
    for batch in cfg.device_batches:
        for name, model in models.items():
            for precision in PRECISIONS:
                log(f"[{cfg.device}] exporting {name} {precision} at batch {batch} ...")
                path = timing_graph(model, work / f"{cfg.device}-{name}-b{batch}.{precision}.onnx", batch, precision,
                               cfg.device)
                key = f"{name}/{precision}/{batch}"
                candidates[key], runners[key] = ort_step(path, frame_of(batch), cfg.device, cfg.threads)
                frames[key] = batch
    plain = f"{kind}/fp16 plain ONNX/{top}"
    candidates[plain], _ = ort_step(_plain_fp16(models[kind], work, top, cfg.device), frame_of(top), cfg.device,
                                    cfg.threads)
    frames[plain] = top
    ops = f"{kind}/fp16 with sdqes_edge kernels/{top}"
    if cfg.ort_ops:
        candidates[ops], _ = ort_step(work / f"{cfg.device}-{kind}-b{top}.fp16.onnx", frame_of(top), cfg.device,
                                      cfg.threads, fused_ops=cfg.ort_ops)
        frames[ops] = top
    idle_key = f"{kind}/fp16/{top}, 1 idle"
    if top > 1:
        candidates[idle_key], _ = ort_step(work / f"{cfg.device}-{kind}-b{top}.fp16.onnx", frame_of(top),
                                           cfg.device, cfg.threads, idle=(top // 2,))
        frames[idle_key] = top - 1  # the idle stream's frame is not one
    busiest = runners[f"{kind}/fp16/{top}"].buffers  # its frame upload alone, timed among the steps
    candidates[UPLOAD] = lambda: busiest.frame.update_inplace(busiest.host_frame)
    timings = interleaved(candidates, max(3, cfg.repetitions // 2), cfg.warmup)
    upload = timings.pop(UPLOAD).median
    rows = {key: {"step_ms": t.median, "frames_per_s": frames[key] * 1000.0 / t.median}
            for key, t in timings.items()}
    ratios = {f"{kind} / backbone at {top} streams (fp16)": rows[f"{kind}/fp16/{top}"]["step_ms"]
              / rows[f"none/fp16/{top}"]["step_ms"],
              f"{kind} fp32 / fp16 at {top} streams": rows[f"{kind}/fp32/{top}"]["step_ms"]
              / rows[f"{kind}/fp16/{top}"]["step_ms"],
              f"{kind} fp16 at {top} streams: plain ONNX / ONNX Runtime's fused operators":
                  rows[plain]["step_ms"] / rows[f"{kind}/fp16/{top}"]["step_ms"]}
    if ops in rows:
        ratios[f"{kind} with sdqes_edge kernels / backbone at {top} streams (fp16)"] = (
            rows[ops]["step_ms"] / rows[f"none/fp16/{top}"]["step_ms"])
    if idle_key in rows:
        ratios[f"{kind} fp16 at {top} streams: one idle (state kept) / all busy"] = (
            rows[idle_key]["step_ms"] / rows[f"{kind}/fp16/{top}"]["step_ms"])
    # What the fp16 steps run at the most streams, where the GPU is bound by memory more than by launches.
    on_device = {f"{name} at {top} streams": device_kernels(work / f"{cfg.device}-{name}-b{top}.fp16.onnx",
                                                            cfg.device, frame_of(top)) for name in models}
    return {"rows": rows, "ratios": ratios, "kernels_on_device": on_device,
            "frame_upload": {"streams": top, "bytes": busiest.host_frame.nbytes, "page_locked": busiest.pinned,
                             "ms": upload, "share_of_step": upload / rows[f"{kind}/fp16/{top}"]["step_ms"]}}


def bench_device_scaling(cfg, work: Path, log) -> dict:
    """Per-frame latency at the start and at the end of a long stream (fp16, bound, CUDA graphs on a GPU), on
    the step graph that ``bench_device`` exported into ``work``."""
    path = work / f"{cfg.device}-{cfg.window_adapter}-b1.fp16.onnx"
    runner = OnnxRuntimeStep(path, device=cfg.device, threads=cfg.threads, io_binding=True)
    frame = np.zeros(runner.buffers.host_frame.shape, np.float32)
    state, times = runner.initial_state(), []
    log(f"[{cfg.device}] streaming {cfg.device_scaling_frames} frames ...")
    for _ in range(cfg.device_scaling_frames):
        start = time.perf_counter()
        state = runner.step(frame, state).state
        times.append((time.perf_counter() - start) * 1e3)
    probe = max(1, min(cfg.scaling_probe, len(times) // 2))
    early, late = float(np.median(times[:probe])), float(np.median(times[-probe:]))
    return {"frames": len(times), "early_ms": early, "late_ms": late, "late_over_early": late / early}


def markdown(section: dict) -> list[str]:
    refused = [k for k, v in section.get("cuda_graph_replayed", {}).items() if not v]
    graphs_words = ""
    if section["device"] == "cuda":
        graphs_words = ", CUDA graphs" + (f" (refused for {', '.join(refused)})" if refused else "")
    lines = ["", f"## On the device: {section['device']} (ONNX Runtime state bound on the device{graphs_words})", "",
             "| candidate | p50 ms | p90 ms | fps |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['p50_ms']:.2f} | {v['p90_ms']:.2f} | {v['fps']:.0f} |"
              for k, v in section["latency"].items()]
    lines += [""] + [f"- {k}: **{v:.2f}x**" for k, v in section["ratios"].items()]
    lines += ["- kernels per step (ONNX Runtime CPU profile, fp32): "
              + ", ".join(f"{k} {v['per_step']} ({v['views']} views)"
                          for k, v in section["kernels_cpu_profile"].items())]
    lines += ["- Casts the fp16 step graph runs: "
              + ", ".join(f"{k} {v['fp16_graph_casts']}" for k, v in section["kernels_cpu_profile"].items())]
    lines += on_device_lines(section["kernels_on_device"], section["device"])
    lines += ["", "| model / precision / streams | step ms | frames/s |", "|---|---|---|"]
    lines += [f"| {k} | {v['step_ms']:.2f} | {v['frames_per_s']:.0f} |" for k, v in section["batches"]["rows"].items()]
    lines += [""] + [f"- {k}: **{v:.2f}x**" for k, v in section["batches"]["ratios"].items()]
    lines += on_device_lines(section["batches"].get("kernels_on_device", {}), section["device"])  # older runs lack it
    up = section["batches"]["frame_upload"]
    lines += [f"- the frame upload alone at {up['streams']} streams ({up['bytes'] / 2**20:.1f} MiB from "
              f"{'page-locked' if up['page_locked'] else 'pageable'} host memory): {up['ms']:.2f} ms, "
              f"{100 * up['share_of_step']:.0f}% of the fp16 step"]
    sc = section["scaling"]
    lines += [f"- {sc['frames']}-frame stream: first frames {sc['early_ms']:.2f} ms, last {sc['late_ms']:.2f} ms "
              f"(**{sc['late_over_early']:.3f}x**)"]
    return lines
