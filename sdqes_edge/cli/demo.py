"""``sdqes-edge demo``: the shipped model alerting on a fresh synthetic stream (the application is
``sdqes_edge.demo``; this is its command line)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sdqes_edge.cli.common import PROG, add_subcommand, at_least, path_text, seed_number, warn
from sdqes_edge.contract import PRECISIONS, REFERENCE_PRECISION
from sdqes_edge.errors import UserError
from sdqes_edge.train_options import DEMO_SEED, SPLIT_SEED_BASE, is_training_seed


def cmd_demo(args: argparse.Namespace) -> int:
    from sdqes_edge.demo import DEMO_BUNDLE, run_demo
    from sdqes_edge.runtime.output_locks import hold_folder

    if is_training_seed(args.seed):
        warn(f"seed {args.seed} is in a training, validation or test split's range; pick a seed "
             f"below {min(SPLIT_SEED_BASE.values())} to see a stream no model was trained or calibrated on")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the demo's video, plot and logs")
    # Held to the command's end: a second demo into the folder rewrote the video the first was reading.
    hold_folder(out, "--out", "a demo")
    run_demo(args.seed, out, PROG, Path(args.bundle) if args.bundle else DEMO_BUNDLE, args.threads, args.precision)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    demo = add_subcommand(
        sub, "demo", "see the shipped model alert on a fresh synthetic stream (seconds, no arguments needed)",
        "Draw a 60-s synthetic scene from a seed no training run used, run the model shipped with the package "
        "(trained on synthetic streams by `sdqes-edge train`) through the torch-free runtime with the stream's "
        "five queries, print each alert beside the true start of its event, and write the video, an annotated "
        "video, the alert log and a score-curve plot.", examples=("", "--seed 11 --out /tmp/demo11"))
    demo.add_argument("--seed", type=seed_number, default=DEMO_SEED,
                      help="stream seed (default %(default)s; training uses seeds from 100000 on)")
    demo.add_argument("--out", type=path_text, default="sdqes-demo", help="output folder (default %(default)s)")
    demo.add_argument("--bundle", type=path_text, help="another bundle to run instead of the shipped one")
    demo.add_argument("--threads", type=at_least(1), help="ONNX Runtime intra-op threads (default: all cores)")
    demo.add_argument("--precision", choices=PRECISIONS, default=REFERENCE_PRECISION,
                      help="step graph to run (default %(default)s; the shipped bundle also has int8, about twice "
                           "as fast on a CPU)")
    demo.set_defaults(func=cmd_demo, output_dirs=("out",))
