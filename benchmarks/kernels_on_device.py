"""What one step runs where it is deployed, for ``sdqes-edge bench --device``: ONNX Runtime's nodes on the
device (its profiler) and, on a GPU, the kernels and copies the GPU itself executed (CUPTI, through PyTorch's
profiler), ranked by the time they took. The reason to count them: at batch 1 a GPU is bound by the kernels a
step launches, not by its arithmetic (``../shared/DESIGN.md``, "The step on a GPU")."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from sdqes_edge.runtime.backend import warm_up
from sdqes_edge.runtime.fused_ops import load_fused_ops
from sdqes_edge.runtime.kernels import count_kernels
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.ort_sessions import DEVICE_PROVIDERS

TOP_KERNELS = 12  # kernel names kept per graph in bench.json, costliest first
KERNEL_NAME_CHARS = 120  # a templated kernel's name runs to thousands of characters; its head says what it is


def device_kernels(path: Path, device: str, frame: np.ndarray, steps: int = 10, fused_ops: str | None = None
                   ) -> dict:
    """What one fp16 step runs where it is deployed: ONNX Runtime's nodes on ``device`` (its profiler) and, on
    a GPU, the kernels and copies the GPU itself executed (CUPTI, through PyTorch's profiler, CUDA graph
    replayed) and the share of the step's wall time the GPU was busy. On an H200 (November 2026, fp16 biases
    still in Gemms) the ViT-B/16 + QRNN step ran 458 nodes as 606 GPU kernels, each Gemm with a bias two
    (ONNX Runtime writes the bias into the output, then multiplies onto it), the GPU busy 1.86 ms of a 2.3 ms
    step: with CUDA graphs the kernels themselves cost, most of them a couple of microseconds, not launches."""
    counted = count_kernels(path, providers=DEVICE_PROVIDERS[device],
                            fused_ops=load_fused_ops(fused_ops) if fused_ops else None)
    row: dict = {"ort_nodes": counted.per_step, "ort_views": counted.views, "provider": counted.provider}
    if device != "cuda":
        row["gpu_kernels"] = None  # no GPU: ONNX Runtime's nodes are the kernels
        return row
    from torch.profiler import ProfilerActivity, profile

    runner = OnnxRuntimeStep(path, device=device, io_binding=True, fused_ops=fused_ops)
    state = warm_up(runner, frame, runner.initial_state())
    start = time.perf_counter()  # the step's wall time without the profiler, which slows the host side
    for _ in range(steps):
        state = runner.step(frame, state).state
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(steps):
            state = runner.step(frame, state).state
    executed = [e for e in trace.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(e.device_time for e in executed) / 1e3 / steps  # device_time: microseconds
    row.update(gpu_kernels=len(executed) / steps, gpu_busy_ms=busy_ms, gpu_busy_share=busy_ms / wall_ms,
               cuda_graph=runner.cuda_graph, costliest_kernels=costliest_kernels(executed, steps))
    return row


def costliest_kernels(executed: list, steps: int, top: int = TOP_KERNELS) -> list[dict]:
    """The GPU kernels that took the most time, by name: {name, per_step, us_per_step}, costliest first. How the
    unaligned fp16 GEMM (a ``cutlass ... align2`` kernel, 24 a step) showed itself on an H200."""
    by_name: dict[str, list] = {}
    for event in executed:
        entry = by_name.setdefault(event.name, [0, 0.0])
        entry[0] += 1
        entry[1] += event.device_time
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    return [{"name": name[:KERNEL_NAME_CHARS], "per_step": count / steps, "us_per_step": total / steps}
            for name, (count, total) in ranked]


def on_device_lines(on_device: dict, device: str) -> list[str]:
    """What each fp16 step ran on the device (``device_kernels``): a line of counts, then its costliest kernels."""
    if not on_device:
        return []
    return [f"- fp16 step on {device}: " + ", ".join(
        f"{k} {v['ort_nodes']} ONNX Runtime nodes"
        + (f", {v['gpu_kernels']:.0f} GPU kernels, GPU busy {v['gpu_busy_ms']:.2f} ms "
           f"({100 * v['gpu_busy_share']:.0f}% of the step)" if v["gpu_kernels"] is not None else "")
        for k, v in on_device.items())] + costliest_lines(on_device)


def costliest_lines(on_device: dict, shown: int = 3) -> list[str]:
    """One Markdown line per fp16 step measured on a GPU: its costliest kernels, by name (on a CPU, none)."""
    return [f"- costliest GPU kernels, {graph}: " + "; ".join(
        f"`{kernel['name'][:60]}` {kernel['per_step']:.0f}/step, {kernel['us_per_step']:.0f} us"
        for kernel in row["costliest_kernels"][:shown])
        for graph, row in on_device.items() if row.get("costliest_kernels")]
