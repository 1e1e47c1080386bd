"""build-ort-ops: build this project's ONNX Runtime kernels (runtime/ort_ops) on the machine that will use them.

The sources and their build script travel in the package, so an installed sdqes-edge (a Jetson's, say) builds
the library as a checkout does; the command runs the script and prints what to run next."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from sdqes_edge.cli.common import PROG, add_subcommand, path_text
from sdqes_edge.errors import UserError
from sdqes_edge.runtime.fused_ops import DEFAULT_LIBRARY, SOURCES, load_fused_ops


def cmd_build_ort_ops(args: argparse.Namespace) -> int:
    script = SOURCES / "build.sh"
    if not script.is_file():
        raise UserError(f"this install of sdqes-edge lacks the kernels' sources ({script}); reinstall it, or build "
                        "from a checkout of the repository")
    if shutil.which("bash") is None:
        raise UserError("building the kernel library needs bash, which is not on PATH; install it and run again")
    command = ["bash", str(script), "--out", args.out]
    command += ["--cpu"] * args.cpu + ["--print-archs"] * args.print_archs
    if subprocess.run(command).returncode != 0:  # its own lines (or the compiler's) have said why
        print(f"{PROG}: error: the kernel library did not build; the lines above say why", file=sys.stderr)
        return 1
    if not args.print_archs:
        library = Path(args.out) / DEFAULT_LIBRARY.name
        device = "cuda" if load_fused_ops(library).with_cuda else "cpu"  # as built: with CUDA kernels, or not
        print(f"next: {PROG} run BUNDLE --precision fp16 --ort-device {device} --ort-ops {library} --source VIDEO "
              f"--query TEXT   (or {PROG} inspect BUNDLE --precision fp16 --ort-ops {library})")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    build = add_subcommand(
        sub, "build-ort-ops", "build this project's ONNX Runtime kernels for --ort-ops (C++, CUDA where nvcc is)",
        "Build libsdqes_ort_ops.so on this machine: the kernels that run each QRNN adapter's pooling step (and a "
        "sliding window's pooling over its frames) and each RetNet adapter's retention step as one kernel in the "
        "graphs with ONNX Runtime's operators, on the CPU and, where nvcc is (on PATH, in $CUDA_HOME/bin or "
        "/usr/local/cuda/bin), on ONNX Runtime's CUDA provider. Needs g++ and curl (ONNX Runtime's C API headers "
        "are fetched once, checked by sha256); works with ONNX Runtime 1.17 and newer. CUDA_ARCHS=\"87\" names the "
        "GPU architectures to compile for; by default V100, Jetson Xavier and Orin, and Turing to Hopper, as far "
        "as the nvcc can. Used only where named: --ort-ops LIBRARY on run, inspect and bench.",
        examples=("--out build/ort_ops", "--cpu --out /opt/sdqes/ort_ops", "--print-archs"))
    build.add_argument("--out", type=path_text, default=DEFAULT_LIBRARY.parent, metavar="DIR",
                       help="folder to build into (default %(default)s, in the current folder)")
    build.add_argument("--cpu", action="store_true", help="the CPU kernels only, even where nvcc is")
    build.add_argument("--print-archs", action="store_true",
                       help="say which nvcc and GPU architectures a build would use, and stop")
    build.set_defaults(func=cmd_build_ort_ops, output_dirs=("out",))
