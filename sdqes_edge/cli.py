"""The ``sdqes-edge`` command line: one entry point, one subcommand per job.

Every subcommand checks its arguments up front, reports a user's mistake as
one line with a non-zero exit (no traceback), and ends by printing the next
command worth running.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Sequence

from . import __version__
from .config import ADAPTER_KINDS, DEFAULT_THRESHOLD, PRESETS, ModelConfig, preset, with_authors_adapter
from .errors import UserError
from .tolerances import SOAK_BLOCK_FRAMES
from .stopping import exit_code_of, raise_on_termination
from .files import check_output_dir, check_output_file, format_bytes

PROG = "sdqes-edge"


def _model_from_args(args: argparse.Namespace):
    """(model, description) from --checkpoint or --preset/--adapter."""
    from .model import SDQESModel

    if getattr(args, "checkpoint", None):
        from .checkpoints import load_model, resolve_head_counts

        heads = resolve_head_counts(args.checkpoint)
        model, ckpt = load_model(args.checkpoint, **heads.overrides())
        return model, f"{args.checkpoint} ({ckpt.source_format}, sha256 {ckpt.sha256[:12]}; {heads.rule})"
    cfg = preset(args.preset)
    if args.adapter and args.adapter != cfg.adapter.kind:
        cfg = with_authors_adapter(cfg, args.adapter)
    return SDQESModel(cfg).eval(), f"preset {cfg.name} (random weights)"


# --- info -----------------------------------------------------------------------

def cmd_info(args: argparse.Namespace) -> int:
    if args.list_presets:
        for name, cfg in PRESETS.items():
            v = cfg.vision
            print(f"{name:22s} {v.image_size}px/{v.patch_size} width {v.width} x{v.layers} layers, "
                  f"embed {cfg.embed_dim}, adapter {cfg.adapter.kind}")
        print(f"\nnext: {PROG} info --preset clip-vit-b16 --adapter qrnn")
        return 0
    model, source = _model_from_args(args)
    cfg: ModelConfig = model.cfg
    visual_params = sum(p.numel() for p in model.visual.parameters())
    adapter_params = sum(p.numel() for n, p in model.visual.named_parameters() if ".adapter" in n)
    text_params = sum(p.numel() for p in model.text.parameters())
    spec = model.state_spec(1)
    if args.json:
        print(json.dumps({"source": source, "config": cfg.to_dict(), "params": {
            "image_tower": visual_params, "adapters": adapter_params, "text_tower": text_params},
            "state_spec": spec.to_list(), "state_bytes_per_stream": spec.nbytes}, indent=2))
        return 0
    print(f"model      {cfg.name}  from {source}")
    print(f"image      {cfg.vision.image_size}px, patch {cfg.vision.patch_size}, width {cfg.vision.width}, "
          f"{cfg.vision.layers} layers, {cfg.vision.heads} heads, {cfg.vision.num_tokens} tokens/frame")
    print(f"text       width {cfg.text.width}, {cfg.text.layers} layers, {cfg.text.heads} heads, "
          f"context {cfg.text.context_length}")
    a = cfg.adapter
    detail = "" if a.kind == "none" else (f", {a.per_block} per block, ratio {a.ratio}, lookback {a.lookback}"
                                          + (f", QRNN down-projecting to hidden ratio {a.qrnn_hidden_ratio}"
                                             if a.kind == "qrnn" and a.qrnn_downsample else ""))
    print(f"adapter    {a.kind}{detail}")
    print(f"params     image tower {visual_params / 1e6:.2f}M (adapters {adapter_params / 1e6:.2f}M), "
          f"text tower {text_params / 1e6:.2f}M")
    print(f"state      {len(spec)} tensors, {format_bytes(spec.nbytes)} per stream")
    for t in list(spec)[: args.show_state]:
        print(f"  {t.input_name:44s} {list(t.shape)}")
    if len(spec) > args.show_state:
        print(f"  ... {len(spec) - args.show_state} more (--show-state N, or --json for all)")
    print(f"\nnext: {PROG} check   (step form against window form for every adapter kind)")
    return 0


# --- check ----------------------------------------------------------------------

def cmd_check(args: argparse.Namespace) -> int:
    """Step form against window form, for every adapter kind, with the state carried over many frames."""
    import torch

    from .model import SDQESModel
    from .model.init import randomize_adapters
    from .tolerances import FP32_EMBEDDING_ATOL

    base = preset(args.preset)
    if base.adapter.kind != "none":
        raise UserError(f"--preset {args.preset} already has an adapter; give a base preset such as 'tiny'")
    if args.frames < 2 or args.batch < 1:
        raise UserError("--frames must be >= 2 and --batch >= 1")
    if args.soak and (args.soak < 2 * args.soak_block or args.soak_block < 1):
        raise UserError(f"--soak {args.soak} needs at least two blocks of --soak-block {args.soak_block} frames "
                        "(the first is the warm-up)")
    torch.manual_seed(args.seed)
    print(f"step form vs window form: preset {base.name}, batch {args.batch}, {args.frames} frames, "
          f"random adapter weights (seed {args.seed}); tolerance {FP32_EMBEDDING_ATOL:g}")
    print(f"{'adapter':8s} {'per block':>9s} {'max |step - window|':>20s} {'state/stream':>13s} "
          f"{'history matters':>15s} {'time':>7s}  result")
    failures = 0
    for kind in args.adapters:
        for per_block in (1, 2):
            if kind == "none" and per_block == 2:
                continue
            cfg = base if kind == "none" else with_authors_adapter(base, kind, per_block=per_block)
            model = randomize_adapters(SDQESModel(cfg).eval(), seed=args.seed)
            frames = torch.randn(args.batch, args.frames, 3, cfg.vision.image_size, cfg.vision.image_size)
            start = time.perf_counter()
            with torch.no_grad():
                window = model.forward_clip(frames)
                steps, _ = model.step_frames(frames)
                # Does the last embedding depend on an earlier frame? It must for temporal adapters.
                altered = frames.clone()
                altered[:, -2] += 1.0
                moved = (model.forward_clip(altered)[:, -1] - window[:, -1]).abs().max().item()
            err = (steps - window).abs().max().item()
            ok = err <= FP32_EMBEDDING_ATOL
            failures += not ok
            print(f"{kind:8s} {per_block if kind != 'none' else '-':>9} {err:20.2e} "
                  f"{format_bytes(model.state_spec(1).nbytes):>13s} {('yes' if moved > 1e-6 else 'no'):>15s} "
                  f"{time.perf_counter() - start:6.2f}s  {'ok' if ok else 'FAIL'}")
    if failures:
        print(f"\n{failures} configuration(s) outside tolerance")
        return 1
    if args.soak:
        failures += _soak_table(base, args)
    if failures:
        return 1
    print(f"\nall forms agree. next: {PROG} info --preset clip-vit-b16 --adapter qrnn")
    return 0


def _soak_table(base: ModelConfig, args: argparse.Namespace) -> int:
    """Export each adapter kind and stream --soak frames through the whole runtime loop: state and memory."""
    import tempfile
    from pathlib import Path

    from .export import ExportOptions, export_bundle
    from .model import SDQESModel
    from .model.init import randomize_adapters
    from .runtime.soak import soak_bundle
    from .tolerances import SOAK_RSS_GROWTH_BYTES

    print(f"\nlong stream through the runtime: {args.soak} frames per adapter kind (exported, 2 adapters per "
          f"block, random adapter weights), max |state| per {args.soak_block} frames; memory must stay within "
          f"{SOAK_RSS_GROWTH_BYTES / 2**20:.0f} MiB of its level after the first block")
    failures = 0
    for kind in args.adapters:
        cfg = base if kind == "none" else with_authors_adapter(base, kind, per_block=2)
        model = randomize_adapters(SDQESModel(cfg).eval(), args.seed)
        with tempfile.TemporaryDirectory(prefix="sdqes-soak-bundle-") as tmp:
            bundle = Path(tmp) / kind
            export_bundle(model, bundle, ExportOptions(show_progress=False), log=lambda message: None)
            print(f"{kind}:")
            report = soak_bundle(bundle, args.soak, block=args.soak_block, seed=args.seed, log=print)
        failures += not report.ok
        print(f"{kind}: state {'finite' if report.finite else 'NOT FINITE'}, largest "
              f"{max(b.max_state_abs for b in report.blocks):.4g}; memory after warm-up "
              f"{report.rss_growth_bytes / 2**20:+.1f} MiB ({'flat' if report.flat else 'GROWING'}); "
              f"{report.frames / report.seconds:.0f} frames/s  {'ok' if report.ok else 'FAIL'}")
    return failures


# --- tokenize -------------------------------------------------------------------

def cmd_tokenize(args: argparse.Namespace) -> int:
    from .tokenizer import default_tokenizer

    tok = default_tokenizer()
    ids = tok.tokenize(args.text, on_overflow="truncate" if args.truncate_queries else "error")
    for text, row in zip(args.text, ids):
        used = [int(i) for i in row if i != 0]
        print(f"{len(used):3d} tokens  {used}  {text!r}")
    return 0


# --- eval -----------------------------------------------------------------------------

def cmd_eval(args: argparse.Namespace) -> int:
    """SR@k / SMD@k of score traces (or baselines) against EgoSDQES-style annotations."""
    from pathlib import Path

    from .annotations import load_annotations, oracle_traces, random_traces
    from .evaluation import (calibrate_thresholds, evaluate_with, match_traces, per_query_distance, text_table,
                             write_reports)
    from .eval_plots import PLOTS_NEED, plotting_available

    if args.plots and not plotting_available():
        print(f"note: no plots: {PLOTS_NEED}; eval.json and eval.md are written as usual", file=sys.stderr)
        args.plots = 0
    if args.fps <= 0:
        raise UserError(f"--fps must be positive, not {args.fps}")
    if args.threshold is not None and not 0.0 < args.threshold < 1.0:
        raise UserError(f"--threshold is a probability sigmoid(cos) in (0, 1), not {args.threshold}")
    if args.write_threshold and not (args.calibrate or args.calibrate_policy):
        raise UserError("--write-threshold writes what was calibrated: add --calibrate and/or --calibrate-policy")
    if args.write_threshold:
        from .runtime.bundle import load_bundle

        target_bundle = load_bundle(args.write_threshold)  # refuse a bad bundle before the work
        if args.threshold is None and not args.calibrate:  # the policy is chosen at the bundle's own threshold
            args.threshold = target_bundle.default_threshold
    started = time.perf_counter()
    annotations = load_annotations(args.annotations, split=args.split, source=args.source)
    if not annotations:
        raise UserError(f"{args.annotations} has no annotations for split {args.split!r}"
                        + (f" and source {args.source!r}" if args.source else ""))
    methods = {}
    if args.scores:
        from .traces import load_score_dir

        matched = match_traces(annotations, load_score_dir(args.scores))
        if not matched.traces:
            raise UserError(f"none of the {len(annotations)} annotations has a trace in {args.scores}: traces are "
                            "matched by stream name (the video_uid) and query text")
        if matched.missing:
            print(f"note: {len(matched.missing)} of {len(annotations)} annotations have no score trace and are "
                  "not scored")
        methods[f"scores ({Path(args.scores).name})"] = (matched.annotations, matched.traces)
    for baseline in args.baseline or []:
        traces = oracle_traces(annotations, args.fps) if baseline == "oracle" else \
            random_traces(annotations, args.fps, seed=args.seed)
        methods[baseline if baseline == "oracle" else f"random (seed {args.seed})"] = (annotations, traces)
    if not methods:
        raise UserError("give --scores DIR (traces from `sdqes-edge run`) or --baseline oracle/random")

    threshold = args.threshold if args.threshold is not None else DEFAULT_THRESHOLD
    rows, extra, calibrations = {}, {"annotations": args.annotations, "split": args.split, "fps": args.fps}, {}
    for name, (anns, traces) in methods.items():
        labels = [a.label for a in anns]
        rows[f"{name}"] = evaluate_with(traces, labels, threshold)
        if args.calibrate:
            cal = calibrate_thresholds(traces, labels, args.per_label)
            calibrations[name] = cal
            rows[f"{name}, calibrated"] = evaluate_with(traces, labels, cal.threshold)
            if args.per_label:
                rows[f"{name}, per-label ({len(cal.per_label)} labels)"] = evaluate_with(
                    traces, labels, cal.threshold, cal.per_label)
    rate = "traces at their own fps" if args.scores and not args.baseline else f"{args.fps:g} fps"
    print(f"{len(annotations)} annotations ({args.split or 'all splits'}), {rate}\n")
    print(text_table(rows))
    policies = {}
    if args.calibrate_policy:
        from .alert_tuning import choose_policy, score_policy
        from .runtime.alerts import AlertPolicy

        print()
        for name, (anns, traces) in methods.items():
            at = calibrations[name].threshold if name in calibrations else threshold
            best, sweep = choose_policy(traces, at)
            plain = score_policy(traces, AlertPolicy(at))
            policies[name] = {"threshold": at, "chosen": best.to_dict(), "plain": plain.to_dict(),
                              "sweep": [s.to_dict() for s in sweep]}
            print(f"alert policy for {name} at threshold {at:.4f}: on until p <= {at - best.exit_margin:.4f} (margin "
                  f"{best.exit_margin:g}), {best.cooldown_s:g} s cooldown; false alerts {plain.false_alerts_per_minute:.3f} -> "
                  f"{best.false_alerts_per_minute:.3f} per query-minute, events alerted in their window "
                  f"{plain.events_alerted:.1f}% -> {best.events_alerted:.1f}%, first-alert accuracy "
                  f"{best.first_alert_accuracy:.1f}% (the same under any policy)")
    out = Path(args.out)
    extra["calibration"] = {n: c.to_dict() for n, c in calibrations.items()}
    extra["alert_policy"] = policies
    json_path, md_path = write_reports(out, rows, extra)
    plots = []
    if args.plots:
        from .eval_plots import plot_extremes

        for name, (anns, traces) in methods.items():
            cal = calibrations.get(name)
            per_trace = [cal.per_label.get(a.label, cal.threshold) if cal else threshold for a in anns]
            distances = [per_query_distance(t, thr) for t, thr in zip(traces, per_trace)]
            folder = out / "plots" / "".join(c if c.isalnum() else "-" for c in name).strip("-")
            plots += plot_extremes(folder, traces, anns, per_trace, distances, args.plots)
    print(f"\nwrote {json_path}, {md_path}" + (f" and {len(plots)} plots under {out / 'plots'}" if plots else "")
          + f" in {time.perf_counter() - started:.1f} s")
    if args.write_threshold:
        from .runtime.bundle import write_thresholds

        name = next(iter(methods))
        cal = calibrations.get(name)
        provenance = {"method": name, "annotations": args.annotations, "split": args.split,
                      "queries": rows[name].queries}
        policy = None
        if name in policies:
            chosen = policies[name]["chosen"]
            policy = {"exit_margin": chosen["exit_margin"], "cooldown_s": chosen["cooldown_s"], "chosen_on": provenance,
                      "false_alerts_per_query_minute": chosen["false_alerts_per_minute"],
                      "first_alert_accuracy": chosen["first_alert_accuracy"]}
        if cal is not None:
            write_thresholds(args.write_threshold, cal.threshold, cal.per_label, provenance, policy=policy)
            print(f"set the default threshold of {args.write_threshold} to {cal.threshold:.4f}"
                  + (f" ({len(cal.per_label)} per-label thresholds)" if cal.per_label else ""))
        else:
            write_thresholds(args.write_threshold, threshold, target_bundle.manifest["thresholds"].get("per_label"),
                             None, policy=policy)
        if policy:
            print(f"recorded the alert policy in {args.write_threshold}: margin {policy['exit_margin']:g}, "
                  f"{policy['cooldown_s']:g} s cooldown")
    print(f"\nnext: open {md_path}" + (f" and {plots[0]}" if plots else ""))
    return 0


# --- bench ----------------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    """Parameters, MACs, state, latency per backend, streaming vs sliding window, scaling, batches, end to end."""
    import dataclasses
    from pathlib import Path

    from .benchmarks.suite import QUICK, BenchConfig, run as run_bench

    cfg = BenchConfig(**QUICK) if args.quick else BenchConfig()
    changes = {k: v for k, v in (("preset", args.preset), ("window", args.window), ("repetitions", args.repetitions),
                                 ("threads", args.threads), ("out", args.out), ("device", args.device))
               if v is not None}
    if args.no_int8:
        changes["int8"] = False
    cfg = dataclasses.replace(cfg, **changes)
    if preset(cfg.preset).adapter.kind != "none":  # refuse before minutes of work
        raise UserError(f"--preset {cfg.preset} already has an adapter; give a base preset (tiny, clip-vit-b16)")
    print(f"benchmarking {cfg.preset} ({'quick' if args.quick else 'full'}: {cfg.repetitions} repetitions); "
          f"results go to {cfg.out}/")
    results, files = run_bench(cfg, log=print)
    print()
    print((Path(cfg.out) / "bench.md").read_text())
    print(f"wrote {', '.join(str(f) for f in files)} in {results['seconds']:.0f} s")
    print(f"\nnext: {PROG} export --preset {cfg.preset} --adapter qrnn --out bundles/{cfg.preset}")
    return 0


# --- synth ----------------------------------------------------------------------------

def cmd_synth(args: argparse.Namespace) -> int:
    """Write a synthetic EgoSDQES-shaped dataset: videos plus annotations.csv, split by stream."""
    from pathlib import Path

    from .synthetic import write_dataset

    counts = {"train": args.train, "val": args.val, "test": args.test}
    if any(n < 0 for n in counts.values()) or sum(counts.values()) == 0:
        raise UserError("--train/--val/--test must be >= 0 and not all 0")
    if args.seconds < 10 or args.fps <= 0:
        raise UserError("--seconds must be >= 10 and --fps positive")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} is not empty; give a new folder")
    seeds, next_seed = {}, args.seed
    for split, n in counts.items():
        seeds[split] = list(range(next_seed, next_seed + n))
        next_seed += n
    started = time.perf_counter()
    csv_path = write_dataset(out, seeds, seconds=args.seconds, fps=args.fps)
    total = sum(counts.values())
    print(f"wrote {total} streams of {args.seconds:g} s at {args.fps:g} fps ({args.train} train, {args.val} val, "
          f"{args.test} test) and {csv_path} in {time.perf_counter() - started:.1f} s")
    print(f"\nnext: {PROG} eval --annotations {csv_path} --split test --fps {args.fps:g} --baseline oracle random")
    return 0


# --- train ----------------------------------------------------------------------------

TRAIN_HELP = {
    "adapter": "adapter kind, authors' settings (default %(default)s)",
    "seed": "seed of initialisation and batch order (default %(default)s); the data is the same for every seed",
    "preset": "base model (default %(default)s: 64 px ViT, 4 layers, width 64; text width 32)",
    "train_streams": "60-s training streams (default %(default)s)",
    "val_streams": "validation streams, used only to calibrate the threshold (default %(default)s)",
    "test_streams": "held-out test streams, scored once at the end (default %(default)s)",
    "stream_seconds": "length of each stream (default %(default)s)",
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


def train_options_from_args(args: argparse.Namespace):
    import dataclasses

    from .train_options import TrainOptions

    return TrainOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainOptions)}).check()


def cmd_train(args: argparse.Namespace) -> int:
    """Train a small dual encoder with adapters on synthetic event streams (CPU, minutes)."""
    from pathlib import Path

    from tqdm import tqdm

    from .training import train

    options = train_options_from_args(args)
    out = Path(args.out)
    print(f"training {options.model_config().name} (seed {options.seed}) for {options.steps} steps on "
          f"{options.train_streams} synthetic streams; validation {options.val_streams}, test {options.test_streams}")
    result = train(options, out, progress=lambda it, desc: tqdm(it, desc=desc, mininterval=2, leave=False))
    print(f"wrote {result.checkpoint} and {out / (result.checkpoint.stem + '.record.json')}")
    print(f"\nnext: {PROG} export --checkpoint {result.checkpoint} --threshold {result.record['threshold']:.4f} "
          f"--out bundles/{result.checkpoint.stem}")
    return 0


def _add_train_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    import dataclasses

    from .train_options import TrainOptions

    for f in dataclasses.fields(TrainOptions):
        flag = "--" + f.name.replace("_", "-")
        if f.name in skip:
            parser.set_defaults(**{f.name: f.default})
        elif f.name == "adapter":
            parser.add_argument(flag, choices=ADAPTER_KINDS, default=f.default, help=TRAIN_HELP[f.name])
        else:
            kind = int if f.type in ("int", "int | None") else float if f.type.startswith("float") else str
            parser.add_argument(flag, type=kind, default=f.default, help=TRAIN_HELP[f.name])


def add_accuracy_parser(sub) -> None:
    acc = sub.add_parser(
        "accuracy", help="accuracy on held-out synthetic streams: per adapter kind (seeds) and per deployment format",
        description="Train one model per adapter kind and seed on the same synthetic splits (as `sdqes-edge train`), "
                    "and report SR@1/SR@3/SMD@1 at [-5,+10] s on held-out test streams for single-frame and "
                    "temporal event types, every seed and the spread; then export one kind to fp32/fp16/int8 and "
                    "score PyTorch against ONNX Runtime at each precision with the state carried over every test "
                    "stream. Writes accuracy.md and accuracy.json.")
    acc.add_argument("--kinds", nargs="*", choices=ADAPTER_KINDS, default=list(ADAPTER_KINDS),
                     help="adapter kinds to train (default: all)")
    acc.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="training seeds (default 0 1 2)")
    acc.add_argument("--formats", choices=ADAPTER_KINDS, default="qrnn",
                     help="kind whose first-seed model is scored per deployment format (default %(default)s)")
    acc.add_argument("--out", default="accuracy-results", help="results folder (default %(default)s)")
    _add_train_options(acc, skip=("adapter", "seed"))
    acc.set_defaults(func=cmd_accuracy, output_dirs=("out",))


def add_train_parser(sub) -> None:
    train = sub.add_parser(
        "train", help="train a small model with adapters on synthetic event streams (CPU, minutes)",
        description="The paper's recipe at small scale: a small dual encoder (ViT with the same adapters as the "
                    "real presets, CLIP tokenizer) trained with binary cross-entropy on cos(frame, query) against "
                    "dense per-frame labels, over windows of frames at 1 fps, on synthetic streams split by stream. "
                    "The threshold is calibrated on validation streams; the test streams are scored once. Writes "
                    "<model>.pt (a checkpoint `export --checkpoint` reads) and <model>.record.json.")
    _add_train_options(train)
    train.add_argument("--out", default="runs/synthetic", help="folder for the checkpoint and record "
                                                               "(default %(default)s)")
    train.set_defaults(func=cmd_train, output_dirs=("out",))


def cmd_accuracy(args: argparse.Namespace) -> int:
    """Accuracy tables on held-out synthetic test streams: per adapter kind over seeds, per deployment format."""
    import dataclasses
    from pathlib import Path

    from tqdm import tqdm

    from .benchmarks.accuracy import run as run_accuracy

    base = dataclasses.replace(train_options_from_args(args), adapter="none", seed=args.seeds[0])
    if not args.kinds and not args.formats:
        raise UserError("nothing to do: give --kinds and/or --formats KIND")
    runs = len(args.kinds) * len(args.seeds)
    print(f"accuracy: {runs} training runs ({', '.join(args.kinds) or 'none'} x seeds "
          f"{', '.join(map(str, args.seeds))}), {base.steps} steps each"
          + (f"; formats of {args.formats}" if args.formats else "") + f"; results in {args.out}/")
    path = run_accuracy(base, args.kinds, args.seeds, args.formats, Path(args.out),
                        progress=lambda it, desc: tqdm(it, desc=desc, mininterval=5, leave=False))
    print()
    print(path.read_text())
    print(f"wrote {path} and {path.with_suffix('.json')}")
    print(f"\nnext: {PROG} export --checkpoint {args.out}/runs/qrnn-seed{args.seeds[0]}/synthetic+qrnn.pt "
          f"--out bundles/synthetic-qrnn")
    return 0


# --- parser -----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Streaming Detection of Queried Event Start on edge devices: load CLIP-style models with "
                    "streaming temporal adapters, check them, export them to verified deployment bundles, run "
                    "them on a video or camera with alerts, measure their cost and score their accuracy.",
        epilog=f"Start with: {PROG} check   |   {PROG} export --preset tiny --adapter qrnn --out /tmp/b   |   "
               f"{PROG} run /tmp/b --source VIDEO --query TEXT",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    info = sub.add_parser("info", help="describe a model: shapes, parameters, streaming state",
                          description="Describe a preset or a checkpoint: dimensions, parameter counts and the "
                                      "streaming state it carries per stream.")
    src = info.add_mutually_exclusive_group()
    src.add_argument("--preset", default="clip-vit-b16", help="preset name (default: %(default)s)")
    src.add_argument("--checkpoint", help="OpenAI CLIP / open_clip / SDQES Lightning checkpoint; config inferred")
    info.add_argument("--adapter", choices=ADAPTER_KINDS, help="swap the preset's adapter kind (authors' settings)")
    info.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    info.add_argument("--show-state", type=int, default=6, metavar="N", help="state tensors to list (default 6)")
    info.add_argument("--json", action="store_true", help="print everything as JSON")
    info.set_defaults(func=cmd_info)

    check = sub.add_parser("check", help="verify step form == window form for every adapter kind",
                           description="Run the step form frame by frame with the state carried over, and the "
                                       "window form over the same frames, for each adapter kind with 1 and 2 "
                                       "adapters per block; print the largest difference.")
    check.add_argument("--preset", default="tiny", help="base preset without adapter (default: %(default)s)")
    check.add_argument("--adapters", nargs="+", choices=ADAPTER_KINDS, default=list(ADAPTER_KINDS))
    check.add_argument("--frames", type=int, default=16, help="frames per stream (default: %(default)s)")
    check.add_argument("--batch", type=int, default=2, help="streams in a batch (default: %(default)s)")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--soak", type=int, default=0, metavar="N",
                       help="also export each adapter kind and stream N frames through the whole runtime loop "
                            "(sinks included), reporting the state's magnitude and the process memory per block "
                            "(e.g. 100000; about a minute per kind per 100000 frames)")
    check.add_argument("--soak-block", type=int, default=SOAK_BLOCK_FRAMES, metavar="N",
                       help="frames per reported block of the soak; the first is the warm-up (default %(default)s)")
    check.set_defaults(func=cmd_check)

    tok = sub.add_parser("tokenize", help="show CLIP token ids of queries",
                         description="Tokenize queries exactly as CLIP does (77 positions, start/end tokens).")
    tok.add_argument("text", nargs="+", help="one or more queries")
    tok.add_argument("--truncate-queries", action="store_true",
                     help="cut queries over 77 tokens (with a warning) instead of refusing them")
    tok.set_defaults(func=cmd_tokenize)

    ev = sub.add_parser(
        "eval", help="Streaming Recall / Minimum Distance of score traces against annotations",
        description="Score the runtime's per-frame traces (or the oracle / random baselines) against "
                    "EgoSDQES-style annotations: SR@1/2/3 in the [-5,+10] s and [-2,+5] s windows and SMD@1/2/3, "
                    "as the paper and its reference code define them. Writes eval.json, eval.md and PNG plots of "
                    "the best and worst queries.",
        epilog=f"examples:\n  {PROG} eval --annotations egosdqes_all.csv --split val --baseline oracle random\n"
               f"  {PROG} eval --annotations egosdqes_all.csv --scores traces/ --calibrate --write-threshold bundle/",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("--annotations", required=True, help="EgoSDQES CSV (egosdqes_all.csv) or one with its columns")
    ev.add_argument("--split", default="val", help="annotation split to score (default: %(default)s; '' for all)")
    ev.add_argument("--source", choices=["moments", "nlq"], help="only annotations from this source")
    ev.add_argument("--scores", help="folder of *.npz score traces written by the runtime")
    ev.add_argument("--baseline", nargs="+", choices=["oracle", "random"],
                    help="baselines that need no video: oracle (must give 100 / 0) and seeded random scores")
    ev.add_argument("--fps", type=float, default=1.0, help="sampling rate of the baselines (default 1)")
    ev.add_argument("--threshold", type=float, help=f"alert threshold (default {DEFAULT_THRESHOLD})")
    ev.add_argument("--calibrate", action="store_true",
                    help="also pick the threshold with the best SR@1 among 20 evenly spaced candidates")
    ev.add_argument("--per-label", action="store_true",
                    help="with --calibrate: a threshold per query label (labels with >= 5 queries)")
    ev.add_argument("--calibrate-policy", action="store_true",
                    help="also choose the alert policy (hysteresis margin, cooldown) with the best F1 of useful "
                         "alerts (the first in an event's window) at the (calibrated or given) threshold")
    ev.add_argument("--write-threshold", metavar="BUNDLE",
                    help="write the calibrated threshold and/or policy into BUNDLE (the runtime's defaults)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the random baseline")
    ev.add_argument("--plots", type=int, default=3, metavar="N", help="plot the N best and N worst queries")
    ev.add_argument("--out", default="sdqes-eval", help="folder for eval.json, eval.md, plots/ (default %(default)s)")
    ev.set_defaults(func=cmd_eval, output_dirs=("out",))

    bench = sub.add_parser(
        "bench", help="measure parameters, MACs, state and per-frame latency of every model form",
        description="One table for a preset (default clip-vit-b16, random weights): backbone, each adapter and the "
                    "sliding-window baseline, with parameters, MACs/FLOPs from the exported graph, state bytes, and "
                    "per-frame latency p50/p90/p99 for PyTorch eager, ONNX Runtime fp32 and int8 (TensorRT fp16 "
                    "where an NVIDIA GPU is), timed interleaved; ratios; scaling with stream length; several "
                    "streams per step; the runtime loop against the bare step. Writes bench.json (with the "
                    "machine), bench.md and PNG plots.")
    bench.add_argument("--quick", action="store_true", help="tiny preset, few repetitions (what CI runs)")
    bench.add_argument("--preset", help="base preset without adapter (default clip-vit-b16; --quick: tiny)")
    bench.add_argument("--window", type=int, help="frames of the sliding-window baseline (default 4)")
    bench.add_argument("--repetitions", type=int, help="timed repetitions per candidate (default 20)")
    bench.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: all cores)")
    bench.add_argument("--no-int8", action="store_true", help="skip the int8 column (saves the quantization)")
    bench.add_argument("--out", help="results folder (default bench-results)")
    bench.add_argument("--device", choices=("cuda",),
                       help="also measure on this device, side by side: PyTorch eager fp32/fp16, the ONNX Runtime "
                            "step fp32/fp16 (state bound on the device, CUDA graphs), the sliding window with the "
                            "same treatment, 1/8/32 streams per step, a 3000-frame stream and the runtime loop")
    bench.set_defaults(func=cmd_bench, output_dirs=("out",))

    synth = sub.add_parser(
        "synth", help="write a synthetic dataset: scenes where queried events start at known times",
        description="Seeded OpenCV scenes (a door, a lamp, balls and squares of named colours) in which events "
                    "start at known times: some visible in one frame (a square appears), others only over time "
                    "(a ball starts or stops rolling, the lamp turns on after the door opened, a ball shows up a "
                    "second time). Writes videos/*.avi and annotations.csv in the EgoSDQES columns, each stream "
                    "in one split.")
    synth.add_argument("--out", required=True, help="new folder for videos/ and annotations.csv")
    synth.add_argument("--train", type=int, default=20, help="training streams (default %(default)s)")
    synth.add_argument("--val", type=int, default=5, help="validation streams (default %(default)s)")
    synth.add_argument("--test", type=int, default=5, help="test streams (default %(default)s)")
    synth.add_argument("--seconds", type=float, default=60.0, help="length of each stream (default %(default)s)")
    synth.add_argument("--fps", type=float, default=2.0, help="frames per second drawn (default %(default)s)")
    synth.add_argument("--seed", type=int, default=0, help="first stream's seed; streams use consecutive seeds")
    synth.set_defaults(func=cmd_synth, output_dirs=("out",))

    add_train_parser(sub)
    add_accuracy_parser(sub)
    from .export.commands import add_parsers as add_export_parsers

    add_export_parsers(sub)
    from .runtime.commands import add_parsers as add_runtime_parsers

    add_runtime_parsers(sub)
    from .runtime.demo import add_parser as add_demo_parser

    add_demo_parser(sub)
    return parser


def check_output_paths(args: argparse.Namespace) -> None:
    """Every output a subcommand declares (``output_files``, ``output_dirs``) checked before any work starts."""
    for attr in getattr(args, "output_files", ()):
        if getattr(args, attr, None):
            check_output_file(getattr(args, attr), "--" + attr.replace("_", "-"))
    for attr in getattr(args, "output_dirs", ()):
        if getattr(args, attr, None):
            check_output_dir(getattr(args, attr), "--" + attr.replace("_", "-"))


def run(argv: Sequence[str] | None, parser_factory: Callable[[], argparse.ArgumentParser] = build_parser) -> int:
    parser = parser_factory()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    raise_on_termination()  # SIGTERM/SIGHUP unwind like Ctrl-C: staging folders removed, outputs closed
    try:
        check_output_paths(args)
        return args.func(args)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as interrupt:
        print(f"{PROG}: interrupted ({interrupt.args[0] if interrupt.args else 'SIGINT'})", file=sys.stderr)
        return exit_code_of(interrupt)


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
