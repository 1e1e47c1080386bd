"""doctor: what this machine can run (sdqes_edge/doctor.py), each missing or broken piece with its fix."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sdqes_edge.cli.common import PROG, add_subcommand, path_text


def cmd_doctor(args: argparse.Namespace) -> int:
    from sdqes_edge.doctor import diagnose, report_lines

    report = diagnose(Path(args.ort_ops))
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(report_lines(report)))
    if report.broken:
        where = "its \"fix\" in each finding with \"ok\": false" if args.json else "each FIX line above"
        print(f"{PROG}: error: {len(report.broken)} thing(s) here will fail or run elsewhere than asked: "
              f"{', '.join(f.topic for f in report.broken)}; {where} says what to do", file=sys.stderr)
        return 1
    if not args.json:
        print(f"\nnext: {PROG} demo   (the shipped model on a synthetic stream)" if report.can["run bundles on the CPU"]
              else f"\nnext: pip install 'sdqes-edge[runtime]'   (then {PROG} demo)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from sdqes_edge.runtime.fused_ops import DEFAULT_LIBRARY

    doctor = add_subcommand(
        sub, "doctor", "what this machine can run: packages, GPU, TensorRT, video back-ends, with fixes",
        "Report each package and device sdqes-edge uses: numpy, OpenCV (and its video back-ends: GStreamer for a "
        "Jetson's CSI camera), ONNX Runtime (which build, which execution providers), the NVIDIA GPU, whether a "
        "session on ONNX Runtime's CUDA provider really runs (made from the shipped demo bundle's graph, as `run` "
        "makes it), TensorRT and pycuda, this project's kernel library, and torch and onnx for exporting. Each "
        "missing piece is named with what installs it; a broken one (two ONNX Runtime builds where the CPU one "
        "won, a CUDA provider whose libraries do not load, a kernel library built for another GPU) is marked FIX "
        "and makes the exit status 1. Imports no torch: quick, and it runs on a device with the runtime alone.",
        examples=("", "--json", "--ort-ops /opt/sdqes/ort_ops/libsdqes_ort_ops.so"))
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--ort-ops", type=path_text, default=str(DEFAULT_LIBRARY), metavar="LIBRARY",
                        help="the kernel library to check (default %(default)s, where build-ort-ops writes it)")
    doctor.set_defaults(func=cmd_doctor, checks_its_own_packages=True)
