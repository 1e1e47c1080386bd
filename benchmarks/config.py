"""What ``sdqes-edge bench`` measures and how long: one dataclass, torch-free (the command line reads its
defaults for its help without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

RESULTS_FILE = "bench.json"  # in the results folder, with bench.md and the plots
BACKENDS = ("torch", "ort_fp32", "ort_int8")
BACKEND_TITLES = {"torch": "PyTorch eager", "ort_fp32": "ORT fp32", "ort_int8": "ORT int8", "trt_fp16": "TensorRT fp16"}


@dataclass
class BenchConfig:
    preset: str = "clip-vit-b16"
    adapters: tuple[str, ...] = ("none", "mlp", "st", "qrnn", "retnet")
    window: int = 4
    window_adapter: str = "qrnn"
    repetitions: int = 20
    warmup: int = 2
    int8: bool = True
    calibration_frames: int = 4  # cost does not depend on calibration quality
    scaling_preset: str = "tiny"
    scaling_frames: int = 2000
    scaling_probe: int = 100  # frames timed at the start and at the end of the long stream
    growing_window_samples: int = 10  # window recomputations timed in each probe (a window of 2000 frames is slow)
    batches: tuple[int, ...] = (1, 2, 4, 8)
    e2e_frames: int = 30
    threads: int | None = None
    out: str = "bench-results"
    device: str | None = None  # "cuda": add the rows measured on the GPU (benchmarks/device.py)
    device_only: bool = False  # measure only the device's rows (the CPU sections take minutes at clip-vit-b16)
    device_batches: tuple[int, ...] = (1, 8, 32)
    # This project's ONNX Runtime kernels (runtime/fused_ops.py): with a path, the device's fp16 QRNN steps are
    # timed with them too, beside the same graphs without.
    ort_ops: str | None = None
    device_scaling_frames: int = 3000
    # Sampled frames of the runtime loop on the device: a GPU step takes milliseconds, so over 30 frames the
    # loop's start (opening the video, the first frame's decoding) weighs as much as its steady state.
    device_e2e_frames: int = 200
    # The detector's own work per step (benchmarks/alerting.py): at this many streams (a GPU's 32), each count of
    # queries (160: 32 users asking 5 each).
    alerting_streams: int = 32
    alerting_queries: tuple[int, ...] = (1, 10, 160)
    alerting_seconds: float = 12.0  # how long as many stand-in cameras run (benchmarks/alerting.py)


QUICK = dict(preset="tiny", repetitions=5, scaling_frames=300, scaling_probe=50, growing_window_samples=5,
             batches=(1, 2), e2e_frames=10, alerting_streams=4, alerting_queries=(1, 20),
             alerting_seconds=2.0)
