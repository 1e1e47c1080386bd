"""``sdqes-edge bench``: parameters, MACs, state and per-frame latency of every model form, side by side."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from sdqes_edge.benchmarks.config import QUICK, RESULTS_FILE, BenchConfig
from sdqes_edge.cli.common import (
    PROG,
    UniqueValues,
    add_subcommand,
    at_least,
    folder_for_new_results,
    onnxruntime_gpu_here,
    path_text,
    show,
    warn,
)
from sdqes_edge.config import ADAPTER_KINDS, preset
from sdqes_edge.errors import UserError


def cmd_bench(args: argparse.Namespace) -> int:
    """Parameters, MACs, state, latency per backend, streaming vs sliding window, scaling, batches, end to end."""
    from sdqes_edge.benchmarks.suite import check_config
    from sdqes_edge.benchmarks.suite import run as run_bench
    from sdqes_edge.runtime.cores import checked_threads

    cfg = BenchConfig(**QUICK) if args.quick else BenchConfig()
    args.threads = checked_threads(args.threads)  # above the cores: brought down once, with one warning
    changes = {k: v for k, v in (("preset", args.preset), ("window", args.window), ("repetitions", args.repetitions),
                                 ("threads", args.threads), ("out", args.out), ("device", args.device),
                                 ("ort_ops", args.ort_ops), ("adapters", args.adapters and tuple(args.adapters)))
               if v is not None}
    cfg = dataclasses.replace(cfg, **changes)
    if args.no_int8:
        cfg = dataclasses.replace(cfg, int8=False)
    if args.device_only:
        cfg = dataclasses.replace(cfg, device_only=True)  # checked with the other settings by the suite
        if args.adapters and args.device:
            warn("--adapters picks the rows of the CPU table, which --device-only leaves out; ignored")
    if preset(cfg.preset).adapter.kind != "none":  # refuse before minutes of work
        raise UserError(f"--preset {cfg.preset} already has an adapter; give a base preset (tiny, clip-vit-b16)")
    check_config(cfg)  # the device too: nothing is printed as started that cannot run
    cfg = dataclasses.replace(cfg, out=folder_for_new_results(cfg.out, RESULTS_FILE))
    if (note := gpu_left_out_note(cfg)) is not None:
        show(f"{PROG}: note: {note}")
    print(f"benchmarking {cfg.preset} ({'quick' if args.quick else 'full'}: {cfg.repetitions} repetitions); "
          f"results go to {cfg.out}/")
    results, files = run_bench(cfg, log=print)
    print()
    print((Path(cfg.out) / "bench.md").read_text())
    print(f"wrote {', '.join(str(f) for f in files)} in {results['seconds']:.0f} s")
    print(f"\nnext: {PROG} export --preset {cfg.preset} --adapter qrnn --out bundles/{cfg.preset}")
    return 0


def gpu_left_out_note(cfg: BenchConfig) -> str | None:
    """What to add where a bench measures only the CPU of a machine whose GPU ONNX Runtime could step on."""
    if cfg.device is not None or not onnxruntime_gpu_here():
        return None
    return ("this machine has an NVIDIA GPU and ONNX Runtime's CUDA provider, and these tables are the CPU's; "
            "--device cuda measures the GPU beside them (--device-only: the GPU alone)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = add_subcommand(
        sub, "bench", "measure parameters, MACs, state and per-frame latency of every model form",
        "One table for a preset (default clip-vit-b16, random weights): backbone, each adapter and the "
        "sliding-window baseline, with parameters, MACs/FLOPs from the exported graph, state bytes, and per-frame "
        "latency p50/p90/p99 for PyTorch eager, ONNX Runtime fp32 and int8 (TensorRT fp16 where an NVIDIA GPU is), "
        "timed interleaved; ratios; scaling with stream length; several streams per step; the runtime loop against "
        "the bare step. Writes bench.json (with the machine), bench.md and PNG plots.",
        examples=("--quick", "--preset clip-vit-b16 --repetitions 30 --out bench-b16", "--device cuda",
                  "--device cuda --device-only --no-int8"))
    bench.add_argument("--quick", action="store_true", help="tiny preset, few repetitions (what CI runs)")
    bench.add_argument("--preset", help=f"base preset without adapter (default {BenchConfig.preset}; --quick: "
                                          f"{QUICK['preset']})")
    bench.add_argument("--adapters", nargs="+", action=UniqueValues, choices=ADAPTER_KINDS, metavar="KIND",
                       help=f"the table's rows: these adapter kinds (none: the backbone alone) beside the sliding "
                            f"window, which is always measured (default: all of {', '.join(ADAPTER_KINDS)})")
    bench.add_argument("--window", type=int,
                       help=f"frames of the sliding-window baseline (default {BenchConfig.window}); it holds them all "
                            "at once, so one that would not fit in memory is refused up front")
    bench.add_argument("--repetitions", type=int, help=f"timed repetitions per candidate (default "
                                                       f"{BenchConfig.repetitions}; --quick: {QUICK['repetitions']})")
    bench.add_argument("--threads", type=at_least(1),
                       help="intra-op threads of ONNX Runtime and of PyTorch alike (default: all cores)")
    bench.add_argument("--no-int8", action="store_true", help="skip the int8 column (saves the quantization)")
    bench.add_argument("--out", type=path_text, help=f"results folder (default {BenchConfig.out}); one that holds an "
                       "earlier run's results is kept, and the run writes to NAME-2 (NAME-3, ...) instead")
    bench.add_argument("--device", choices=("cuda",),
                       help="also measure on this device, side by side: PyTorch eager fp32/fp16, the ONNX Runtime "
                            "step fp32/fp16 (state bound on the device, CUDA graphs), the sliding window with the "
                            "same treatment, 1/8/32 streams per step, a 3000-frame stream and the runtime loop")
    bench.add_argument("--device-only", action="store_true",
                       help="with --device: measure only the device's rows, not the CPU sections (which take "
                            "minutes at clip-vit-b16)")
    bench.add_argument("--ort-ops", type=path_text, metavar="LIBRARY",
                       help="with --device: also time the fp16 steps with this project's ONNX Runtime kernels "
                            "(sdqes-edge build-ort-ops), each QRNN pooling step (and RetNet retention step) one kernel")
    bench.set_defaults(func=cmd_bench, output_dirs=("out",))
