"""What ``sdqes-edge run`` says about where it steps: the backend, precision and provider in its header line, and a
tip where this machine has a faster way to step the bundle (a GPU left idle, the int8 graph on a CPU, fp16 on a
GPU)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sdqes_edge.cli.common import onnxruntime_gpu_here
from sdqes_edge.contract import FP16, INT8, REFERENCE_PRECISION
from sdqes_edge.runtime.backend import BACKENDS

if TYPE_CHECKING:  # the detector loads OpenCV
    from sdqes_edge.runtime.detector import StreamingDetector

# What the fp16 step graph gains on a GPU, as the tips say it: ViT-B/16 + QRNN, ONNX Runtime's CUDA provider with
# the state bound and CUDA graphs (benchmarks/results/device-h200-2026-11-27.md: 4.06 against 1.98 ms).
FP16_ON_A_GPU = "2x fp32 on an H200"
# The step graph a run at fp32 is pointed at, by where it steps, and what it gains there (int8 on a CPU: ViT-B/16 +
# QRNN on two cores, AVX2 alone and with AVX-512 VNNI).
FASTER_GRAPH = {"cpu": (INT8, "1.4x (AVX2) to 2x (AVX-512 VNNI) as fast on a CPU"), "gpu": (FP16, FP16_ON_A_GPU)}


def backend_words(backend, args: argparse.Namespace) -> str:
    """What actually steps: the backend, precision and, for ONNX Runtime, the provider it assigned."""
    words = f"{args.backend}, {args.precision}"
    providers = getattr(backend, "providers", None)
    if providers:
        words += f", {providers[0]}"
        if getattr(backend, "buffers", None) is not None:
            words += ", state bound on the device" + (" with CUDA graphs" if backend.cuda_graph else "")
        if getattr(backend, "fused_ops", None) is not None:
            words += f", sdqes_edge kernels from {backend.fused_ops.path.name}"
    return words


def gpu_left_idle(args: argparse.Namespace) -> bool:
    """Whether this run steps on the CPU only because ``--ort-device`` was left at its default, on a machine with an
    NVIDIA GPU and ONNX Runtime's CUDA provider, where the step would run many times faster."""
    return args.backend == BACKENDS[0] and not args.ort_device_given and onnxruntime_gpu_here()


def device_tip(detector: StreamingDetector, args: argparse.Namespace) -> str | None:
    """One line pointing at a faster way to step this bundle on this machine, if there is one: the GPU a run left
    idle (it was not asked for), else the int8 graph on a CPU, or the fp16 graph on a GPU."""
    if gpu_left_idle(args):
        fp16 = ("" if args.precision == FP16
                else f"; add --precision fp16, which this bundle has ({FP16_ON_A_GPU})"
                if FP16 in detector.bundle.precisions
                else f"; an fp16 graph runs {FP16_ON_A_GPU}: re-export with --precision fp16")
        return (f"this machine has an NVIDIA GPU and ONNX Runtime's CUDA provider, but this run steps on the CPU "
                f"(--ort-device cpu, the default): --ort-device cuda steps on the GPU{fp16}")
    if args.backend != BACKENDS[0] or args.precision != REFERENCE_PRECISION:
        return None
    faster, gain = FASTER_GRAPH["cpu" if args.ort_device == "cpu" else "gpu"]
    if faster not in detector.bundle.precisions:
        return None
    return (f"this bundle has an {faster} step graph, checked against fp32 when it was exported; --precision {faster} "
            f"runs {gain}")
