"""Make a bundle's int8 step graph again from its own fp32 graph, with this version's quantizer (7-bit weights,
which ONNX Runtime's x86 kernels without VNNI cannot saturate) and the export's drift check; every other file
is kept. For bundles whose int8 graph an earlier version made, when the checkpoint is not at hand: the shipped
demo bundle was re-quantized this way, on the calibration video its recipe writes (make_demo_bundle.sh).

    .venv/bin/python scripts/requantize_int8.py BUNDLE --calibration-video VIDEO [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sdqes_edge.errors import UserError
from sdqes_edge.export import ExportOptions, requantize_int8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path, help="bundle directory with an fp32 step graph")
    parser.add_argument("--calibration-video", type=Path, required=True,
                        help="footage with many of the deployment's scenes: calibration and the drift check")
    parser.add_argument("--out", type=Path, help="where to write the bundle (default: replace BUNDLE, only once "
                                                 "the new graph has passed)")
    args = parser.parse_args(argv)
    if not args.calibration_video.is_file():
        parser.error(f"--calibration-video {args.calibration_video} is not a file")
    try:
        report = requantize_int8(args.bundle, args.out or args.bundle,
                                 ExportOptions(calibration_video=args.calibration_video))
    except UserError as exc:
        print(f"requantize_int8: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out or args.bundle}: {report.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
