"""``sdqes-edge bench --device ... --ort-ops LIBRARY``: the RetNet adapter's step with this project's retention
kernel beside the same graph without it.

The RetNet adapter carries a ``[d', d']`` matrix per token (ViT-B/16: 0.55 GiB a stream in fp16), and its traced
step is twelve kernels of which the elementwise ones each pass over that state; the kernel library runs the
step as one kernel that reads the state once and writes it once (export/fused_retention.py). Both rows step the
same fp16 graph, the state bound on the device (CUDA graphs on a GPU), timed interleaved, at one stream and at
a few: the state's size, not launches, decides at several streams. A section of its own, measured last, so a
run cut short keeps every other row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from sdqes_edge.config import preset
from sdqes_edge.contract import FP16

from .device import ort_step, timing_graph
from .kernels_on_device import device_kernels, on_device_lines
from .models import bench_config, bench_model
from .timing import interleaved

KIND = "retnet"
# Streams per step beside one: few, as the state is large. ViT-B/16 fp16: 4 streams hold 2.2 GiB of state, each of
# the two rows binds two sets of it, and the inlined body's intermediates are as large: some 15 GiB at the peak,
# which a 32-GiB Jetson Orin still holds (8 streams would not).
MOST_STREAMS = 4
WITH_KERNELS = "with sdqes_edge kernels"


def bench_retention_kernel(cfg, frame_of: Callable[[int], np.ndarray], work: Path,
                           log: Callable[[str], None]) -> dict:
    """Rows ``retnet/fp16/B`` and ``retnet/fp16 with sdqes_edge kernels/B`` for B in 1 and a few streams, their
    ratios, and what each runs on the device at one stream."""
    model = bench_model(bench_config(preset(cfg.preset), KIND))
    batches = sorted({1, min(MOST_STREAMS, max(cfg.device_batches))})
    candidates, streams, paths = {}, {}, {}
    for batch in batches:
        log(f"[{cfg.device}] exporting {KIND} fp16 at batch {batch} ...")
        paths[batch] = timing_graph(model, work / f"{cfg.device}-{KIND}-b{batch}.{FP16}.onnx", batch, FP16, cfg.device)
        for fused_ops, label in ((None, FP16), (cfg.ort_ops, f"{FP16} {WITH_KERNELS}")):
            key = f"{KIND}/{label}/{batch}"
            candidates[key], _ = ort_step(paths[batch], frame_of(batch), cfg.device, cfg.threads, fused_ops=fused_ops)
            streams[key] = batch
    log(f"[{cfg.device}] timing the retention kernel: {len(candidates)} candidates, interleaved ...")
    timings = interleaved(candidates, cfg.repetitions, cfg.warmup)
    rows = {key: {"step_ms": t.median, "frames_per_s": streams[key] * 1000.0 / t.median} for key, t in timings.items()}
    ratios = {f"{KIND} fp16 at {b} stream{'s' if b > 1 else ''}: without / {WITH_KERNELS}":
              rows[f"{KIND}/fp16/{b}"]["step_ms"] / rows[f"{KIND}/fp16 {WITH_KERNELS}/{b}"]["step_ms"]
              for b in batches}
    on_device = {f"{KIND}/fp16": device_kernels(paths[1], cfg.device, frame_of(1)),
                 f"{KIND}/fp16 {WITH_KERNELS}": device_kernels(paths[1], cfg.device, frame_of(1),
                                                               fused_ops=cfg.ort_ops)}
    return {"rows": rows, "ratios": ratios, "kernels_on_device": on_device}


def markdown(section: dict, device: str) -> list[str]:
    lines = ["", "| RetNet step / streams | step ms | frames/s |", "|---|---|---|"]
    lines += [f"| {k} | {v['step_ms']:.2f} | {v['frames_per_s']:.0f} |" for k, v in section["rows"].items()]
    lines += [""] + [f"- {k}: **{v:.2f}x**" for k, v in section["ratios"].items()]
    return lines + on_device_lines(section["kernels_on_device"], device)
