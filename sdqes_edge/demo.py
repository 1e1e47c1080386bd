"""The demo application: the shipped model finds queried event starts in a stream it has never seen.

An application of the runtime library, not part of it (it draws its stream with the synthetic-data code and
scores it with the metrics): ``sdqes-edge demo`` runs it. Torch-free. The bundle under
``sdqes_edge/data/demo_bundle/`` was trained by ``sdqes-edge train``
on synthetic streams and exported by ``sdqes-edge export`` (its
``training_record.json`` says how). The demo draws a fresh stream from a seed
outside every training split, writes it as a video, streams the video through
the bundle with the runtime a device would use, and prints each alert beside
the ground-truth start of its event.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdqes_edge.alert_tuning import false_alerts, in_window
from sdqes_edge.contract import MANIFEST_NAME, REFERENCE_PRECISION
from sdqes_edge.errors import UserError, terminal_safe
from sdqes_edge.files import make_folders, parse_json, write_text_atomically
from sdqes_edge.metrics import TOLERANCE_WINDOWS
from sdqes_edge.runtime.alert_log import JsonlSink
from sdqes_edge.runtime.annotated_video import AnnotatedVideoSink
from sdqes_edge.runtime.bundle import load_bundle
from sdqes_edge.runtime.detector import RunStats, StreamingDetector
from sdqes_edge.runtime.sinks import CallbackSink, ScoreTraceRecorder
from sdqes_edge.runtime.sources import open_source
from sdqes_edge.synthetic import Stream, generate_stream, write_video
from sdqes_edge.traces import load_scores
from sdqes_edge.train_options import random_weights_warning

DEMO_BUNDLE = Path(__file__).resolve().parent / "data" / "demo_bundle"
DEMO_SECONDS = 60.0
DEMO_VIDEO_FPS = 2.0  # the video is drawn at 2 fps; the runtime samples it at the bundle's 1 fps
# What a demo writes in its folder; a run replaces the files of the demo before it there.
STREAM_VIDEO, ANNOTATED_VIDEO, ALERT_LOG = "stream.avi", "annotated.avi", "alerts.jsonl"
SCORE_TRACE, SCORE_PLOT, SUMMARY_NAME = "scores.npz", "scores.png", "summary.json"
DEMO_OUTPUTS = (STREAM_VIDEO, ANNOTATED_VIDEO, ALERT_LOG, SCORE_TRACE, SUMMARY_NAME, SCORE_PLOT)
# Written as a demo takes its folder, before any output: a demo that failed (a full disk) before its summary.json
# left outputs that the next demo, in the same folder, refused as the user's own.
CLAIM_MARKER = ".sdqes-demo"


@dataclass
class QueryOutcome:
    kind: str
    query: str
    start_time: float
    alerts: list[float]  # stream times of this query's alerts

    @property
    def first_alert(self) -> float | None:
        return self.alerts[0] if self.alerts else None

    def hit(self) -> bool:
        """The paper's SR@1: the first alert lies within [start - a, start + l]."""
        return self.first_alert is not None and in_window(self.first_alert, self.start_time)

    @property
    def false_alerts(self) -> int:
        return false_alerts(self.alerts, self.start_time)


def _verdict(outcome: QueryOutcome) -> str:
    first = outcome.first_alert
    if first is None:
        return "missed (no alert)"
    delta = first - outcome.start_time
    return f"{'correct' if outcome.hit() else 'wrong'} ({delta:+.1f} s)"


def plot_scores(path: Path, trace, outcomes: list[QueryOutcome], threshold: float) -> Path | None:
    """One panel per query: p over time, the threshold, the true start, the alerts."""
    from sdqes_edge.eval_plots import _pyplot, save_figure

    try:
        plt = _pyplot()
    except UserError:  # no matplotlib: the demo still runs, and says the plot is missing
        return None

    times = np.arange(len(trace.probs)) / trace.fps
    fig, axes = plt.subplots(len(outcomes), 1, figsize=(9, 1.7 * len(outcomes)), sharex=True, squeeze=False)
    for ax, (q, outcome) in zip(axes[:, 0], enumerate(outcomes)):
        ax.plot(times, trace.probs[:, q], color="tab:blue", lw=1.4, label="p = sigmoid(cos)")
        ax.axhline(threshold, color="grey", ls="--", lw=1, label="threshold")
        before, after = TOLERANCE_WINDOWS[0]
        ax.axvspan(outcome.start_time - before, outcome.start_time + after, color="tab:green", alpha=0.12,
                   label=f"[-{before:g}, +{after:g}] s")
        ax.axvline(outcome.start_time, color="tab:green", lw=1.5, label="event starts")
        for t in outcome.alerts:
            ax.axvline(t, color="tab:red", lw=1.2, ls=":")
        ax.set_title(f"{outcome.query}  ->  {_verdict(outcome)}", fontsize=8, loc="left")
        ax.set_ylabel("p", fontsize=8)
        ax.set_ylim(0.25, 0.75)  # sigmoid of a cosine lies in [0.27, 0.73]
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=6, loc="upper left", ncol=4)
    axes[-1, 0].set_xlabel("stream time (s); red dotted: alerts")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def run_demo(seed: int, out: Path, next_command: str, bundle: Path = DEMO_BUNDLE, threads: int | None = None,
             precision: str = REFERENCE_PRECISION) -> dict:
    """Draw the seeded stream, run ``bundle`` over it with its queries, print alerts beside the truth and
    write the video, annotated video, alert log, score trace, plot and summary.json under ``out``;
    ``next_command`` is the program the printed hints name (the command line's)."""
    started = time.perf_counter()
    if bundle == DEMO_BUNDLE and not (bundle / MANIFEST_NAME).is_file():
        raise UserError(f"the demo bundle is missing at {bundle}; reinstall sdqes-edge, or make one with "
                        f"`{next_command} train` and `{next_command} export --checkpoint ... --out DIR` and pass "
                        "--bundle DIR")
    # Another bundle's problems in the loader's words (a missing one was told to reinstall sdqes-edge), before
    # anything is written.
    loaded = load_bundle(bundle)
    _claim_folder(out)
    stream = generate_stream(seed, DEMO_SECONDS, DEMO_VIDEO_FPS, uid=f"demo-seed{seed}")
    video = write_video(out / STREAM_VIDEO, stream)
    detector = StreamingDetector(loaded, precision=precision, threads=threads)
    policy_words = _describe(detector, video, seed)
    outcomes = _add_queries(detector, stream)
    _attach_sinks(detector, outcomes, out, stream.uid)
    stats = RunStats()
    try:
        for _ in detector.run([open_source(str(video), detector.fps)], stats):
            pass
    finally:
        detector.close()
    summary = _report(list(outcomes.values()), stats)
    plot = plot_scores(out / SCORE_PLOT, load_scores(out / SCORE_TRACE), list(outcomes.values()),
                       float(detector.bundle.default_threshold))
    summary = {"seed": seed, "bundle": str(bundle), "precision": precision, **summary, "alert_policy": policy_words,
               "outcomes": [{"kind": o.kind, "query": o.query, "start_time": o.start_time, "alerts": o.alerts,
                             "hit": o.hit(), "false_alerts": o.false_alerts} for o in outcomes.values()]}
    write_text_atomically(out / SUMMARY_NAME, json.dumps(summary, indent=2))
    files = [video, *(out / name for name in (ANNOTATED_VIDEO, ALERT_LOG, SCORE_TRACE, SUMMARY_NAME))]
    print("wrote " + ", ".join(str(f) for f in files + ([plot] if plot else []))
          + ("" if plot else " (no scores.png: pip install matplotlib)"))
    print(f"done in {time.perf_counter() - started:.1f} s")
    print(f"\nnext: {next_command} run {bundle} --source {video} --query 'Tell me when the lamp turns on.' "
          f"--annotate {out}/mine.avi   (your own query)")
    return summary


def _claim_folder(out: Path) -> None:
    """Make ``out`` the demo's: a new or empty folder, or one an earlier demo wrote, whose outputs this run
    replaces. The alert log is appended to by its sink, so a second demo in one folder logged both runs' alerts;
    a folder of the user's own that holds a file of a demo output's name is refused rather than written over."""
    taken = [name for name in DEMO_OUTPUTS if (out / name).exists()]
    if taken and not (out / CLAIM_MARKER).is_file() and not _is_demo_summary(out / SUMMARY_NAME):
        raise UserError(f"--out {out} already holds {', '.join(taken)}, not from an earlier demo; the demo would "
                        f"write over {'it' if len(taken) == 1 else 'them'}: give a new folder (default sdqes-demo)")
    make_folders(out)
    write_text_atomically(out / CLAIM_MARKER, "outputs of `sdqes-edge demo`, which replaces them as it runs again\n")
    (out / ALERT_LOG).unlink(missing_ok=True)  # the earlier demo's: this run's log holds this run alone


def _is_demo_summary(path: Path) -> bool:
    try:
        summary = parse_json(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and {"seed", "bundle", "outcomes"} <= summary.keys()


def _describe(detector: StreamingDetector, video: Path, seed: int) -> str:
    """Print the model (with how it was trained) and the stream; the alert policy in words."""
    record = detector.bundle.training_record or {}
    policy_words = detector.default_policy().describe() + (" (policy chosen on the validation streams)"
                                                           if detector.bundle.alert_policy else "")
    print(f"model: {detector.bundle.manifest['model']['name']}" + _training_words(record) + f", {policy_words}")
    if random := random_weights_warning(detector.bundle.manifest):  # --bundle of a preset's export
        print(f"warning: {random}")
    print(f"stream: {video} ({DEMO_SECONDS:g} s, seed {seed}, never seen in training)\n")
    return policy_words


def _training_words(record: dict) -> str:
    """How the model was trained, from a bundle's training record, as far as it says ("(trained by `sdqes-edge
    train ...`, test SR@1 74.0)"): the record is the bundle's, someone else's data, so a key it lacks is no reason to
    stop, and its control characters are shown, not obeyed."""
    command = record.get("command")
    try:
        sr = f", test SR@1 {float(record['test']['all']['SR@1']):.1f}"
    except (KeyError, TypeError, ValueError):
        sr = ""
    return f" (trained by `{terminal_safe(command)}`{sr})" if isinstance(command, str) else ""


def _add_queries(detector: StreamingDetector, stream: Stream) -> dict[str, QueryOutcome]:
    """One query per event of the stream, with its alert message; printed beside its true start."""
    outcomes: dict[str, QueryOutcome] = {}
    for event in stream.events:
        query = detector.add_query(event.query, event.response)
        outcomes[query.id] = QueryOutcome(event.kind, event.query, event.start_time, [])
    print(f"{'query':70s} {'event starts':>12s}")
    for o in outcomes.values():
        print(f"{o.query:70s} {o.start_time:10.1f} s")
    print()
    return outcomes


def _attach_sinks(detector: StreamingDetector, outcomes: dict[str, QueryOutcome], out: Path, uid: str) -> None:
    def on_alert(event) -> None:
        outcome = outcomes[event.query_id]
        outcome.alerts.append(event.stream_time)
        print(f"  t={event.stream_time:5.1f} s  ALERT  {event.message!r:42s} p={event.score:.3f}   "
              f"true start {outcome.start_time:5.1f} s ({event.stream_time - outcome.start_time:+.1f} s)")

    detector.add_sink(CallbackSink(on_alert))
    detector.add_sink(JsonlSink(out / ALERT_LOG))
    detector.add_sink(AnnotatedVideoSink(out / ANNOTATED_VIDEO, detector.fps, detector.thresholds))
    detector.add_sink(ScoreTraceRecorder(out / SCORE_TRACE, uid, detector.fps, model=detector.bundle.model_identity))


def _report(results: list[QueryOutcome], stats: RunStats) -> dict:
    """Print each event's first alert against its true start; the totals, for summary.json."""
    hits = sum(o.hit() for o in results)
    print(f"\n{'event':16s} {'true start':>10s} {'first alert':>11s}  verdict ([-5, +10] s)")
    for o in results:
        first = "-" if o.first_alert is None else f"{o.first_alert:.1f} s"
        print(f"{o.kind:16s} {o.start_time:8.1f} s {first:>11s}  {_verdict(o)}")
    false_count = sum(o.false_alerts for o in results)
    false_per_minute = false_count / (DEMO_SECONDS / 60.0)
    print(f"\nfirst-alert accuracy: {hits} of {len(results)} queries alerted within [-5, +10] s of the true start "
          f"on their first alert; false alerts: {false_count} of {sum(len(o.alerts) for o in results)} "
          f"({false_per_minute:.1f} per minute of stream, all queries together)")
    print(f"({stats.frames} frames, {stats.fps:.0f} frames/s, step p50 {stats.latency(50):.1f} ms)")
    return {"hits": hits, "queries": len(results), "first_alert_accuracy": 100.0 * hits / len(results),
            "false_alerts": false_count, "false_alerts_per_minute": false_per_minute}
