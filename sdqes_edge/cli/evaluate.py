"""``sdqes-edge eval``: SR@k / SMD@k of score traces (or baselines) against EgoSDQES-style annotations."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from sdqes_edge.cli.common import (
    PROG,
    UniqueValues,
    add_subcommand,
    at_least,
    finite_number,
    folder_for_new_results,
    frames_per_second,
    path_text,
    seed_number,
    show,
    warn,
)
from sdqes_edge.config import DEFAULT_FPS, DEFAULT_THRESHOLD
from sdqes_edge.errors import UserError
from sdqes_edge.metrics import THRESHOLD_CANDIDATES

# Method name -> (annotations, score traces), in the same order (typing's Dict: Python 3.8 evaluates no dict[...]).
Methods = Dict[str, Tuple[List, List]]
DEFAULT_SEED = 0  # the random baseline's


def cmd_eval(args: argparse.Namespace) -> int:
    """SR@k / SMD@k of score traces (or baselines) against EgoSDQES-style annotations."""
    from sdqes_edge.annotations import require_annotations
    from sdqes_edge.evaluation import REPORT_FILE, late_words, text_table, write_reports

    target_bundle = _check_eval_args(args)
    args.out = folder_for_new_results(args.out, REPORT_FILE)  # its plots of other queries were left among the new
    started = time.perf_counter()
    annotations = require_annotations(args.annotations, split=args.split, source=args.source)
    methods, set_aside = _methods(args, annotations, target_bundle)
    threshold = args.threshold if args.threshold is not None else DEFAULT_THRESHOLD
    rows, calibrations = _score(methods, threshold, args.calibrate, args.per_label)
    rate = "traces at their own fps" if args.scores and not args.baseline else f"{args.fps:g} fps"
    print(f"{len(annotations)} annotations ({args.split or 'all splits'}), {rate}\n")
    print(text_table(rows))
    for name in methods:  # the calibrated rows of a method put aside the same queries
        if late := late_words(rows[name]):
            print(f"note: {name}: {late}")
    policies = _choose_policies(methods, calibrations, threshold) if args.calibrate_policy else {}
    out = Path(args.out)
    extra = {"annotations": args.annotations, "split": args.split, "fps": args.fps,
             "calibration": {n: c.to_dict() for n, c in calibrations.items()}, "alert_policy": policies,
             "annotations_not_scored": set_aside}
    json_path, md_path = write_reports(out, rows, extra)
    plots = _plot(out, methods, calibrations, threshold, args.plots) if args.plots else []
    show(f"\nwrote {json_path}, {md_path}" + (f" and {len(plots)} plots under {out / 'plots'}" if plots else "")
         + f" in {time.perf_counter() - started:.1f} s")
    if args.write_threshold:
        _write_to_bundle(args, target_bundle, rows, calibrations, policies, threshold)
    print(f"\nnext: open {md_path}" + (f" and {plots[0]}" if plots else ""))
    return 0


def _check_eval_args(args: argparse.Namespace):
    """Refuse conflicting options (and a bad --write-threshold bundle) before the work; the bundle or None."""
    from sdqes_edge.eval_plots import PLOTS_NEED, plotting_available

    if args.plots and not plotting_available():
        print(f"note: no plots: {PLOTS_NEED}; eval.json and eval.md are written as usual", file=sys.stderr)
        args.plots = 0
    # Options of the baselines alone, given without them: said, not taken without a word as a trace's rate or seed.
    if args.fps is not None and not args.baseline:
        warn(f"--fps {args.fps:g} is the baselines' sampling rate, and score traces keep the rate they were recorded "
             "at: it does nothing without --baseline oracle/random; leave it out")
    if args.seed is not None and "random" not in (args.baseline or []):
        warn(f"--seed {args.seed} seeds the random baseline: it does nothing without --baseline random; leave it out")
    args.fps = DEFAULT_FPS if args.fps is None else args.fps
    args.seed = DEFAULT_SEED if args.seed is None else args.seed
    if not 0.0 < args.fps < math.inf:  # NaN too
        raise UserError(f"--fps must be a positive number, not {args.fps}")
    if args.threshold is not None and not 0.0 < args.threshold < 1.0:
        raise UserError(f"--threshold is a probability sigmoid(cos) in (0, 1), not {args.threshold}")
    if args.per_label and not args.calibrate:  # a per-label threshold is one of the calibration's choices
        warn("--per-label chooses a threshold per label while calibrating; without --calibrate it "
             "does nothing: add --calibrate")
    if args.write_threshold and not (args.calibrate or args.calibrate_policy):
        raise UserError("--write-threshold writes what was calibrated: add --calibrate and/or --calibrate-policy")
    if not args.write_threshold:
        return None
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.output_locks import hold_bundle

    # Held to the command's end, the manifest read now written after the work: an export replacing the bundle
    # meanwhile was given the manifest of the graphs it replaced.
    hold_bundle(args.write_threshold, "--write-threshold")
    target_bundle = load_bundle(args.write_threshold)
    if args.threshold is None and not args.calibrate:  # the policy is chosen at the bundle's own threshold
        args.threshold = target_bundle.default_threshold
    return target_bundle


def _methods(args: argparse.Namespace, annotations: list, target_bundle=None) -> tuple[Methods, dict]:
    """The score traces to evaluate: the runtime's (--scores) and each baseline's; and the annotations the runtime's
    leave out, by row and why (``Matched.put_aside_rows``; empty without --scores)."""
    from sdqes_edge.annotations import oracle_traces, random_traces
    from sdqes_edge.evaluation import length_mismatch_words, match_traces

    methods: Methods = {}
    set_aside: dict = {}
    if args.scores:
        from sdqes_edge.traces import load_score_dir

        traces = load_score_dir(args.scores)
        _check_one_model(traces, args.scores, target_bundle)
        matched = match_traces(annotations, traces)
        if mismatch := length_mismatch_words(annotations, traces):
            warn(mismatch)
        notes = matched.put_aside_notes()
        if not matched.traces and notes:
            raise UserError(f"none of the {len(annotations)} annotations can be scored: the "
                            f"{sum(count for count, _ in notes)} with a trace in {args.scores} are put aside because "
                            + "; and ".join(why for _, why in notes))
        if not matched.traces:
            raise _nothing_matched(args, annotations, traces)
        if matched.missing:
            print(f"note: {len(matched.missing)} of {len(annotations)} annotations have no score trace and are "
                  "not scored")
        for count, why in notes:
            print(f"note: {count} of {len(annotations)} annotations are not scored: {why}")
        methods[f"scores ({Path(args.scores).name})"] = (matched.annotations, matched.traces)
        set_aside = matched.put_aside_rows()
    for baseline in args.baseline or []:
        if baseline == "oracle":
            methods[baseline] = (annotations, oracle_traces(annotations, args.fps))
        else:
            methods[f"random (seed {args.seed})"] = (annotations, random_traces(annotations, args.fps, seed=args.seed))
    if not methods:
        raise UserError("give --scores DIR (traces from `sdqes-edge run`) or --baseline oracle/random")
    return methods, set_aside


def _nothing_matched(args: argparse.Namespace, selected: list, traces: list) -> UserError:
    """The refusal for traces that answer none of the selected annotations, naming the split and source of those
    they do answer: `score` scores every split by default and eval picks 'val', so a corpus of test streams was
    refused as if its traces matched nothing in the file."""
    from sdqes_edge.annotations import load_annotations
    from sdqes_edge.evaluation import match_traces

    asked = [(column, value) for column, value in (("split", args.split), ("source", args.source)) if value]
    words = (f"none of the {len(selected)} annotations" + "".join(f" of {column} {value!r}" for column, value in asked)
             + f" has a trace in {args.scores}")
    answered = match_traces(load_annotations(args.annotations), traces).annotations if asked else []
    fixes = []
    for column, value in asked:
        held = sorted({getattr(a, column) for a in answered})
        if held and value not in held:
            fixes.append(f"--{column} {held[0] if len(held) == 1 else repr('')}")
            words += f"; its traces answer annotations of {column} {', '.join(map(repr, held))}"
    if fixes:
        return UserError(f"{words}: give {' '.join(fixes)}")
    return UserError(f"{words}: {_what_differs(selected, traces)}")


def _what_differs(selected: list, traces: list) -> str:
    """Which half of the (stream name, query text) key matched nothing: a folder of traces that `run` wrote with
    queries of the user's own has the annotated videos but none of their queries."""
    from sdqes_edge.traces import query_key

    videos = {a.video_uid for a in selected}
    watched = [t for t in traces if t.stream in videos]
    if not watched:
        return (f"traces are named for their video's file name ({_some(sorted(t.stream for t in traces))}), "
                f"annotations for their video_uid ({_some(sorted(videos))}); name each video for its video_uid")
    asked = {query_key(a.query) for a in selected if a.video_uid in {t.stream for t in watched}}
    texts = sorted({text for t in watched for text in t.query_texts if query_key(text) not in asked})
    return (f"its traces of {len(watched)} annotated video(s) score other queries ({_some(texts)}) than the "
            f"annotations ask of them; score the videos with their annotated queries: {PROG} score BUNDLE "
            "--annotations ANNOTATIONS.csv --videos FOLDER")


def _some(names: list[str], shown: int = 2) -> str:
    """The first few of many names, quoted, with how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(map(repr, names[:shown])) + more


def _check_one_model(traces: list, folder: str, target_bundle) -> None:
    """One report, one model: traces name the model that scored them (older ones name none), and a threshold
    calibrated on one model's scores means nothing in another model's bundle."""
    models = sorted({t.model for t in traces if t.model})
    if len(models) > 1:
        raise UserError(f"the traces in {folder} were scored by {len(models)} different models; evaluate each "
                        "model's traces in a folder of their own")
    if target_bundle is not None and models and models[0] != target_bundle.model_identity:
        raise UserError(f"the traces in {folder} were scored by another model than {target_bundle.root}'s: a "
                        "threshold calibrated on them means nothing there; score that bundle (sdqes-edge score) "
                        "and calibrate on its own traces")


def _score(methods: Methods, threshold: float, calibrate: bool, per_label: bool) -> tuple[dict, dict]:
    """Table rows per method (and per calibrated threshold), and each method's calibration."""
    from sdqes_edge.evaluation import calibrate_thresholds, evaluate_with
    from sdqes_edge.metrics import evaluate_per_metric

    rows, calibrations = {}, {}
    for name, (anns, traces) in methods.items():
        labels = [a.label for a in anns]
        rows[name] = evaluate_with(traces, labels, threshold)
        if calibrate:
            cal = calibrate_thresholds(traces, labels, per_label)
            calibrations[name] = cal
            rows[f"{name}, calibrated"] = evaluate_with(traces, labels, cal.threshold)
            # As the paper reports: each window's SR and the SMD at a threshold chosen for that metric alone.
            rows[f"{name}, per-metric thresholds (paper)"] = evaluate_per_metric(traces, cal.per_metric)
            if per_label:
                rows[f"{name}, per-label ({len(cal.per_label)} labels)"] = evaluate_with(
                    traces, labels, cal.threshold, cal.per_label)
    return rows, calibrations


def _choose_policies(methods: Methods, calibrations: dict, threshold: float) -> dict:
    from sdqes_edge.alert_tuning import choose_policy, score_policy
    from sdqes_edge.runtime.alerts import AlertPolicy

    print()
    policies = {}
    for name, (_, traces) in methods.items():
        at = calibrations[name].threshold if name in calibrations else threshold
        best, sweep = choose_policy(traces, at)
        plain = score_policy(traces, AlertPolicy(at))
        policies[name] = {"threshold": at, "chosen": best.to_dict(), "plain": plain.to_dict(),
                          "sweep": [s.to_dict() for s in sweep]}
        show(f"alert policy for {name} at threshold {at:.4f}: on until p <= {at - best.exit_margin:.4f} (margin "
             f"{best.exit_margin:g}), {best.cooldown_s:g} s cooldown; false alerts "
             f"{plain.false_alerts_per_minute:.3f} -> {best.false_alerts_per_minute:.3f} per query-minute, events "
             f"alerted in their window {plain.events_alerted:.1f}% -> {best.events_alerted:.1f}%, first-alert "
             f"accuracy {best.first_alert_accuracy:.1f}% (the same under any policy)")
    return policies


def _plot(out: Path, methods: Methods, calibrations: dict, threshold: float, count: int) -> list[Path]:
    from sdqes_edge.eval_plots import plot_extremes
    from sdqes_edge.evaluation import per_query_distance
    from sdqes_edge.metrics import is_scorable

    plots = []
    for name, (anns, traces) in methods.items():
        # Only the queries the table scored: one asked after its event started was drawn as a "worst" query.
        scored = [(a, t) for a, t in zip(anns, traces) if is_scorable(t)]
        anns, traces = [a for a, _ in scored], [t for _, t in scored]
        cal = calibrations.get(name)
        per_trace = [cal.per_label.get(a.label, cal.threshold) if cal else threshold for a in anns]
        distances = [per_query_distance(t, thr) for t, thr in zip(traces, per_trace)]
        folder = out / "plots" / "".join(c if c.isalnum() else "-" for c in name).strip("-")
        plots += plot_extremes(folder, traces, anns, per_trace, distances, count)
    return plots


def _write_to_bundle(args: argparse.Namespace, target_bundle, rows: dict, calibrations: dict, policies: dict,
                     threshold: float) -> None:
    """The first method's calibrated threshold and/or alert policy, recorded in --write-threshold BUNDLE."""
    from sdqes_edge.runtime.bundle import write_thresholds

    name = next(iter(rows))
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
        show(f"set the default threshold of {args.write_threshold} to {cal.threshold:.4f}"
             + (f", and {len(cal.per_label)} per-label thresholds: run and score use them for a query given its "
                "label (a 'label' column in --queries-file)" if cal.per_label else ""))
    else:
        write_thresholds(args.write_threshold, threshold, target_bundle.manifest["thresholds"].get("per_label"),
                         None, policy=policy)
    if policy:
        show(f"recorded the alert policy in {args.write_threshold}: margin {policy['exit_margin']:g}, "
             f"{policy['cooldown_s']:g} s cooldown")


def add_parser(sub: argparse._SubParsersAction) -> None:
    ev = add_subcommand(
        sub, "eval", "Streaming Recall / Minimum Distance of score traces against annotations",
        "Score the runtime's per-frame traces (or the oracle / random baselines) against EgoSDQES-style "
        "annotations: SR@1/2/3 in the [-5,+10] s and [-2,+5] s windows and SMD@1/2/3, as the paper and its "
        "reference code define them. Writes eval.json, eval.md and PNG plots of the best and worst queries.",
        examples=("--annotations egosdqes_all.csv --split val --baseline oracle random",
                  "--annotations egosdqes_all.csv --scores traces/ --calibrate --write-threshold bundle/"))
    ev.add_argument("--annotations", type=path_text,
                    required=True, help="EgoSDQES CSV (egosdqes_all.csv) or one with its columns")
    ev.add_argument("--split", default="val", help="annotation split to score (default %(default)s; '' for all)")
    ev.add_argument("--source", help="only annotations from this source (EgoSDQES: moments, nlq; synth: temporal, "
                                     "single_frame)")
    ev.add_argument("--scores", type=path_text, help="folder of *.npz score traces written by the runtime (run "
                                                     "--scores, score), or one such trace")
    ev.add_argument("--baseline", nargs="+", action=UniqueValues, choices=["oracle", "random"],
                    help="baselines that need no video: oracle (must give 100 / 0) and seeded random scores")
    ev.add_argument("--fps", type=frames_per_second,
                    help=f"sampling rate of the baselines (default {DEFAULT_FPS}); score traces keep their own")
    ev.add_argument("--threshold", type=finite_number, help=f"alert threshold (default {DEFAULT_THRESHOLD})")
    ev.add_argument("--calibrate", action="store_true",
                    help=f"also pick the threshold with the best SR@1 [-5,+10] among {THRESHOLD_CANDIDATES} evenly "
                         "spaced candidates (the one --write-threshold writes), and add a row with each metric at "
                         "its own best threshold, as the paper reports them")
    ev.add_argument("--per-label", action="store_true",
                    help="with --calibrate: a threshold per query label (labels with >= 5 queries); "
                         "--write-threshold records them, for queries asked with their label")
    ev.add_argument("--calibrate-policy", action="store_true",
                    help="also choose the alert policy (hysteresis margin, cooldown) with the best F1 of useful "
                         "alerts (the first in an event's window) at the (calibrated or given) threshold")
    ev.add_argument("--write-threshold", type=path_text, metavar="BUNDLE",
                    help="write the calibrated threshold and/or policy into BUNDLE (the runtime's defaults)")
    ev.add_argument("--seed", type=seed_number, help=f"seed of the random baseline (default {DEFAULT_SEED})")
    ev.add_argument("--plots", type=at_least(0), default=3, metavar="N",
                    help="plot the N best and N worst queries (default %(default)s)")
    ev.add_argument("--out", type=path_text,
                    default="sdqes-eval", help="folder for eval.json, eval.md, plots/ (default %(default)s); one that "
                    "holds an earlier run's eval.json is kept, and the run writes to NAME-2 (NAME-3, ...) instead")
    ev.set_defaults(func=cmd_eval, output_dirs=("out",))

