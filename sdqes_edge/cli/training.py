"""Data and training commands: ``synth`` (a synthetic dataset), ``train`` (a small model on it) and ``accuracy``
(adapter kinds x seeds, and one model per deployment format)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from sdqes_edge.cli.common import (
    PROG,
    UniqueValues,
    add_subcommand,
    at_least,
    finite_number,
    frames_per_second,
    path_text,
    say,
    seed_number,
    show,
    warn,
)
from sdqes_edge.config import ADAPTER_KINDS
from sdqes_edge.errors import UserError
from sdqes_edge.files import parse_json, staged_directory
from sdqes_edge.progress import with_progress
from sdqes_edge.synthetic import MIN_STREAM_SECONDS
from sdqes_edge.train_options import TrainOptions


def cmd_synth(args: argparse.Namespace) -> int:
    """Write a synthetic EgoSDQES-shaped dataset: videos plus annotations.csv, split by stream."""
    from sdqes_edge.runtime.output_locks import hold_folder
    from sdqes_edge.synthetic import stream_length_problem, write_dataset

    counts = {"train": args.train, "val": args.val, "test": args.test}
    if sum(counts.values()) == 0:
        raise UserError("--train, --val and --test are all 0: give at least one stream to write")
    problem = stream_length_problem(args.seconds, args.fps)
    if problem:
        raise UserError(f"{problem}; raise --seconds or --fps")
    out = Path(args.out)
    # Held to the command's end: of two at once into one new folder, each found it empty, and the one that ended
    # last replaced the other's dataset.
    hold_folder(out, "--out", "a dataset")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} is not empty; give a new folder")
    seeds, next_seed = {}, args.seed
    for split, n in counts.items():
        seeds[split] = range(next_seed, next_seed + n)
        next_seed += n
    started = time.perf_counter()
    with staged_directory(out) as staging:  # an error or Ctrl-C half-way leaves no folder to clear away
        csv_path = out / write_dataset(staging, seeds, seconds=args.seconds, fps=args.fps,
                                       progress=True).relative_to(staging)
    total = sum(counts.values())
    streams = f"{total} stream{'s' if total != 1 else ''}"
    show(f"wrote {streams} of {args.seconds:g} s at {args.fps:g} fps ({args.train} train, {args.val} val, "
         f"{args.test} test) and {csv_path} in {time.perf_counter() - started:.1f} s")
    split = next(name for name in ("test", "val", "train") if counts[name])  # the split eval should score
    show(f"\nnext: {PROG} eval --annotations {csv_path} --split {split} --fps {args.fps:g} --baseline oracle random")
    return 0


TRAIN_HELP = {
    "adapter": "adapter kind, authors' settings (default %(default)s)",
    "seed": "seed of initialisation and batch order (default %(default)s); the data is the same for every seed",
    "preset": "base model (default %(default)s: 64 px ViT, 4 layers, width 64; text width 32)",
    "train_streams": "60-s training streams (default %(default)s)",
    "val_streams": "validation streams, used only to calibrate the threshold (default %(default)s)",
    "test_streams": "held-out test streams, scored once at the end (default %(default)s)",
    "stream_seconds": f"length of each stream, at least {MIN_STREAM_SECONDS:g} s (default %(default)s)",
    "fps": "frames per second sampled (default %(default)s, as the benchmark)",
    "window": "frames per training window (default %(default)s)",
    "batch": "windows per step (default %(default)s)",
    "steps": "optimizer steps (default %(default)s)",
    "lr": "peak AdamW learning rate (default %(default)s)",
    "weight_decay": "AdamW weight decay (default %(default)s)",
    "warmup_steps": "linear warm-up steps before the cosine decay (default %(default)s)",
    "pos_weight": "BCE weight of a true (frame, query) pair (default: negatives per positive in the training "
                  "labels, about 41, so that a constant score is no minimum)",
    "grad_clip": "gradient norm clip (default %(default)s)",
    "threads": "torch CPU threads (default: torch's choice)",
}


class TrainingProgress:
    """How `train` and `accuracy` count the streams they draw and the steps they train, remembering how far the
    latest count went: a bar is erased as a stop unwinds it, and the stop then says where the work stood."""

    def __init__(self) -> None:
        self.stage: str | None = None
        self.done = self.total = 0

    def __call__(self, items, desc: str):
        self.stage, self.done, self.total = desc, 0, len(items)
        return _Counted(with_progress(items, desc, unit="it"), self)

    def where(self) -> str:
        """Where the count stood: "in training synthetic+qrnn seed 0 (812 of 2400)", "after ..." once complete."""
        if self.stage is None:
            return "before its first stream was drawn"
        return f"{'after' if self.done == self.total else 'in'} {self.stage} ({self.done} of {self.total})"


class _Counted:
    """``items`` (a progress bar or the plain sequence), counting each item whose work is done into ``progress``;
    a bar's own methods (``set_postfix``) still reach it."""

    def __init__(self, items, progress: TrainingProgress) -> None:
        self._items, self._progress = items, progress

    def __iter__(self):
        for item in self._items:
            yield item
            self._progress.done += 1

    def __getattr__(self, name: str):
        return getattr(self._items, name)


def train_options_from_args(args: argparse.Namespace):
    options = TrainOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainOptions)}).check()
    for conflict in options.conflicts():
        warn(conflict)
    return options


def cmd_train(args: argparse.Namespace) -> int:
    """Train a small dual encoder with adapters on synthetic event streams (CPU, minutes)."""
    from sdqes_edge.runtime.output_locks import hold, release
    from sdqes_edge.training import train

    options = train_options_from_args(args)
    out = Path(args.out)
    checkpoint = out / f"{options.model_config().name}.pt"
    # One training of a model into a folder at a time: two started together each found no checkpoint, and the one
    # that ended last replaced the other's model without a word.
    lock = hold(checkpoint, "--out", "a trained model", folder=out)
    try:
        _refuse_overwriting_a_model(checkpoint)
        print(f"training {options.model_config().name} (seed {options.seed}) for {options.steps} steps on "
              f"{options.train_streams} synthetic streams; validation {options.val_streams}, test "
              f"{options.test_streams}")
        progress = TrainingProgress()
        try:
            result = train(options, out, progress=progress)
        except KeyboardInterrupt:  # then said as any stop is, by the command line
            say(f"note: train stopped {progress.where()}; nothing was written: a model is written once it has "
                "trained to its last step and its threshold is calibrated")
            raise
    finally:
        release(lock)
    show(f"wrote {result.checkpoint} and {out / (result.checkpoint.stem + '.record.json')}")
    # No --threshold: export takes the calibrated one from the checkpoint's record, whole, and says so.
    print(f"\nnext: {PROG} export --checkpoint {result.checkpoint} --out bundles/{result.checkpoint.stem}")
    return 0


def _refuse_overwriting_a_model(checkpoint: Path) -> None:
    """A checkpoint is named for its model, not its seed or settings: a second `train` of the same kind into the
    default --out replaced the first model without a word."""
    if not checkpoint.exists():
        return
    try:
        made_by = f", made by `{parse_json(checkpoint.with_suffix('.record.json').read_text())['command']}`"
    except (OSError, ValueError, KeyError, TypeError):
        made_by = ""
    raise UserError(f"{checkpoint} exists{made_by}; give another --out (e.g. {checkpoint.parent}-2) to keep it, or "
                    "delete it to train that model again")


def _add_train_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    for f in dataclasses.fields(TrainOptions):
        flag = "--" + f.name.replace("_", "-")
        if f.name in skip:
            parser.set_defaults(**{f.name: f.default})
        elif f.name == "adapter":
            parser.add_argument(flag, choices=ADAPTER_KINDS, default=f.default, help=TRAIN_HELP[f.name])
        else:
            kind = (seed_number if f.name == "seed" else frames_per_second if f.name == "fps"
                    else int if f.type in ("int", "int | None") else finite_number if f.type.startswith("float")
                    else str)
            parser.add_argument(flag, type=kind, default=f.default, help=TRAIN_HELP[f.name])


def cmd_accuracy(args: argparse.Namespace) -> int:
    """Accuracy tables on held-out synthetic test streams: per adapter kind over seeds, per deployment format."""
    from sdqes_edge.benchmarks.accuracy import REPORT_NAME, checkpoint_path
    from sdqes_edge.benchmarks.accuracy import run as run_accuracy
    from sdqes_edge.runtime.output_locks import hold

    base = dataclasses.replace(train_options_from_args(args), adapter="none", seed=args.seeds[0])
    if not args.kinds and not args.formats:
        raise UserError("nothing to do: give --kinds and/or --formats KIND [KIND ...]")
    # One run at a time (let go as the command ends): a second into the same --out trained again every model the
    # first had not finished, both writing the same checkpoints and tables.
    hold(Path(args.out) / REPORT_NAME, "--out", "accuracy tables", folder=args.out)
    runs = len(args.kinds) * len(args.seeds)
    trained = (f"{runs} training runs ({', '.join(args.kinds)} x seeds {', '.join(map(str, args.seeds))}), "
               f"{base.steps} steps each" if runs else "no adapter table")
    print(f"accuracy: {trained}"
          + (f"; formats of {', '.join(args.formats)}" if args.formats else "") + f"; results in {args.out}/")
    progress = TrainingProgress()
    try:
        path = run_accuracy(base, args.kinds, args.seeds, args.formats, Path(args.out), progress=progress)
    except KeyboardInterrupt:  # then said as any stop is, by the command line
        say(f"note: accuracy stopped {progress.where()}; the runs it finished are kept in {Path(args.out) / 'runs'}, "
            "and the same command goes on from them")
        raise
    print()
    print(path.read_text())
    show(f"wrote {path} and {path.with_suffix('.json')}")
    # A model this run trained (the first kind scored per format, else the first of the table), at the first seed.
    checkpoint = checkpoint_path(Path(args.out), base, (args.formats or args.kinds)[0], args.seeds[0])
    print(f"\nnext: {PROG} export --checkpoint {checkpoint} --out bundles/{checkpoint.stem.replace('+', '-')}")
    return 0



def add_parsers(sub: argparse._SubParsersAction) -> None:
    synth = add_subcommand(
        sub, "synth", "write a synthetic dataset: scenes where queried events start at known times",
        "Seeded OpenCV scenes (a door, a lamp, balls and squares of named colours) in which events start at known "
        "times: some visible in one frame (a square appears), others only over time (a ball starts or stops "
        "rolling, the lamp turns on after the door opened, a ball shows up a second time). Writes videos/*.avi "
        "and annotations.csv in the EgoSDQES columns, each stream in one split.",
        examples=("--out data/synthetic", "--out data/corpus --train 0 --val 0 --test 40"))
    synth.add_argument("--out", type=path_text, required=True, help="new folder for videos/ and annotations.csv")
    synth.add_argument("--train", type=at_least(0), default=20, help="training streams (default %(default)s)")
    synth.add_argument("--val", type=at_least(0), default=5, help="validation streams (default %(default)s)")
    synth.add_argument("--test", type=at_least(0), default=5, help="test streams (default %(default)s)")
    synth.add_argument("--seconds", type=finite_number, default=60.0,
                       help=f"length of each stream, at least {MIN_STREAM_SECONDS:g} s (default %(default)s)")
    synth.add_argument("--fps", type=frames_per_second, default=2.0,
                       help="frames per second drawn (default %(default)s)")
    synth.add_argument("--seed", type=seed_number, default=0, help="first stream's seed; streams use consecutive seeds "
                                                           "(default %(default)s)")
    synth.set_defaults(func=cmd_synth, output_dirs=("out",))

    train = add_subcommand(
        sub, "train", "train a small model with adapters on synthetic event streams (CPU, minutes)",
        "The paper's recipe at small scale: a small dual encoder (ViT with the same adapters as the real presets, "
        "CLIP tokenizer) trained with binary cross-entropy on cos(frame, query) against dense per-frame labels, "
        "over windows of frames at 1 fps, on synthetic streams split by stream. The threshold is calibrated on "
        "validation streams; the test streams are scored once. Writes <model>.pt (a checkpoint `export "
        "--checkpoint` reads) and <model>.record.json.", examples=("--adapter qrnn --out runs/qrnn",))
    _add_train_options(train)
    train.add_argument("--out", type=path_text, default="runs/synthetic", help="folder for the checkpoint and record "
                                                                               "(default %(default)s)")
    train.set_defaults(func=cmd_train, output_dirs=("out",))

    acc = add_subcommand(
        sub, "accuracy", "accuracy on held-out synthetic streams: per adapter kind (seeds) and per deployment format",
        "Train one model per adapter kind and seed on the same synthetic splits (as `sdqes-edge train`), and report "
        "SR@1/SR@3/SMD@1 at [-5,+10] s on held-out test streams for single-frame and temporal event types, every "
        "seed and the spread; then export one kind to fp32/fp16/int8 and score PyTorch against ONNX Runtime at "
        "each precision with the state carried over every test stream. Writes accuracy.md and accuracy.json.",
        examples=("--kinds qrnn st --seeds 0 1",))
    acc.add_argument("--kinds", nargs="*", action=UniqueValues, choices=ADAPTER_KINDS, default=list(ADAPTER_KINDS),
                     help="adapter kinds to train (default: all)")
    acc.add_argument("--seeds", nargs="+", action=UniqueValues, type=seed_number, default=[0, 1, 2],
                     help="training seeds (default 0 1 2)")
    acc.add_argument("--formats", nargs="*", action=UniqueValues, choices=ADAPTER_KINDS, default=["qrnn"],
                     help="kinds whose first-seed models are scored per deployment format, e.g. --formats qrnn st "
                          "retnet (default qrnn)")
    acc.add_argument("--out", type=path_text, default="accuracy-results", help="results folder (default %(default)s)")
    _add_train_options(acc, skip=("adapter", "seed"))
    acc.set_defaults(func=cmd_accuracy, output_dirs=("out",))
