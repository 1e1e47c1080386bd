"""``sdqes-edge demo``: the shipped model finds queried event starts in a stream it has never seen. Torch-free.

The bundle under ``runtime/demo_bundle/`` was trained by ``sdqes-edge train``
on synthetic streams and exported by ``sdqes-edge export`` (its
``training_record.json`` says how). The demo draws a fresh stream from a seed
outside every training split, writes it as a video, streams the video through
the bundle with the runtime a device would use, and prints each alert beside
the ground-truth start of its event.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..alert_tuning import false_alerts, in_window
from ..errors import UserError
from ..metrics import TOLERANCE_WINDOWS
from ..train_options import is_training_seed

PROG = "sdqes-edge"
DEMO_BUNDLE = Path(__file__).resolve().parent / "demo_bundle"
DEMO_SEED = 7  # no split uses seeds below 100,000 (train_options.SPLIT_SEED_BASE)
DEMO_SECONDS = 60.0
DEMO_VIDEO_FPS = 2.0  # the video is drawn at 2 fps; the runtime samples it at the bundle's 1 fps


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
    from ..eval_plots import _pyplot

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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cmd_demo(args: argparse.Namespace) -> int:
    from ..synthetic import generate_stream, write_video
    from ..traces import load_scores
    from .detector import RunStats, StreamingDetector
    from .sinks import AnnotatedVideoSink, CallbackSink, JsonlSink, ScoreTraceRecorder
    from .sources import open_source

    started = time.perf_counter()
    bundle = Path(args.bundle) if args.bundle else DEMO_BUNDLE
    if not (bundle / "manifest.json").is_file():
        raise UserError(f"the demo bundle is missing at {bundle}; reinstall sdqes-edge, or make one with "
                        f"`{PROG} train` and `{PROG} export --checkpoint ... --out DIR` and pass --bundle DIR")
    if is_training_seed(args.seed):
        print(f"{PROG}: warning: seed {args.seed} is in a training, validation or test split's range; pick a seed "
              "below 100000 to see a stream no model was trained or calibrated on", file=sys.stderr)
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, not {args.seed}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the demo's video, plot and logs")
    out.mkdir(parents=True, exist_ok=True)

    stream = generate_stream(args.seed, DEMO_SECONDS, DEMO_VIDEO_FPS, uid=f"demo-seed{args.seed}")
    video = write_video(out / "stream.avi", stream)
    detector = StreamingDetector(bundle, threads=args.threads)
    record = json.loads((bundle / "training_record.json").read_text()) if (bundle / "training_record.json").is_file() \
        else {}
    policy = detector.default_policy()
    policy_words = policy.describe() + (" (policy chosen on the validation streams)"
                                        if detector.bundle.alert_policy else "")
    print(f"model: {detector.bundle.manifest['model']['name']} "
          + (f"(trained by `{record['command']}`, test SR@1 {record['test']['all']['SR@1']:.1f}), "
             if record else "") + policy_words)
    print(f"stream: {video} ({DEMO_SECONDS:g} s, seed {args.seed}, never seen in training)\n")

    outcomes: dict[str, QueryOutcome] = {}
    for event in stream.events:
        query = detector.add_query(event.query, event.response)
        outcomes[query.id] = QueryOutcome(event.kind, event.query, event.start_time, [])
    print(f"{'query':70s} {'event starts':>12s}")
    for o in outcomes.values():
        print(f"{o.query:70s} {o.start_time:10.1f} s")
    print()

    def on_alert(event) -> None:
        outcome = outcomes[event.query_id]
        outcome.alerts.append(event.stream_time)
        print(f"  t={event.stream_time:5.1f} s  ALERT  {event.message!r:42s} p={event.score:.3f}   "
              f"true start {outcome.start_time:5.1f} s ({event.stream_time - outcome.start_time:+.1f} s)")

    detector.add_sink(CallbackSink(on_alert))
    detector.add_sink(JsonlSink(out / "alerts.jsonl"))
    detector.add_sink(AnnotatedVideoSink(out / "annotated.avi", detector.fps, detector.thresholds))
    detector.add_sink(ScoreTraceRecorder(out / "scores.npz", stream.uid, detector.fps))
    stats = RunStats()
    try:
        for _ in detector.run([open_source(str(video), detector.fps)], stats):
            pass
    finally:
        detector.close()

    results = list(outcomes.values())
    hits = sum(o.hit() for o in results)
    print(f"\n{'event':16s} {'true start':>10s} {'first alert':>11s}  verdict ([-5, +10] s)")
    for o in results:
        first = "-" if o.first_alert is None else f"{o.first_alert:.1f} s"
        print(f"{o.kind:16s} {o.start_time:8.1f} s {first:>11s}  {_verdict(o)}")
    false_alerts = sum(o.false_alerts for o in results)
    false_per_minute = false_alerts / (DEMO_SECONDS / 60.0)
    print(f"\nfirst-alert accuracy: {hits} of {len(results)} queries alerted within [-5, +10] s of the true start "
          f"on their first alert; false alerts: {false_alerts} of {sum(len(o.alerts) for o in results)} "
          f"({false_per_minute:.1f} per minute of stream, all queries together)")
    print(f"({stats.frames} frames, {stats.fps:.0f} frames/s, step p50 {stats.latency(50):.1f} ms)")
    trace = load_scores(out / "scores.npz")
    plot = plot_scores(out / "scores.png", trace, results,
                       float(detector.bundle.default_threshold))
    (out / "summary.json").write_text(json.dumps({
        "seed": args.seed, "bundle": str(bundle), "hits": hits, "queries": len(results),
        "first_alert_accuracy": 100.0 * hits / len(results), "false_alerts": false_alerts,
        "false_alerts_per_minute": false_per_minute, "alert_policy": policy_words,
        "outcomes": [{"kind": o.kind, "query": o.query, "start_time": o.start_time, "alerts": o.alerts,
                      "hit": o.hit(), "false_alerts": o.false_alerts} for o in results]}, indent=2))
    files = [video, out / "annotated.avi", out / "alerts.jsonl", out / "scores.npz", out / "summary.json"]
    files += [plot] if plot else []
    print("wrote " + ", ".join(str(f) for f in files) + (" (no scores.png: pip install matplotlib)" if not plot
                                                          else ""))
    print(f"done in {time.perf_counter() - started:.1f} s")
    print(f"\nnext: {PROG} run {bundle} --source {video} --query 'Tell me when the lamp turns on.' "
          f"--annotate {out}/mine.avi   (your own query)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo", help="see the shipped model alert on a fresh synthetic stream (about 10 s, no arguments needed)",
        description="Draw a 60-s synthetic scene from a seed no training run used, run the model shipped with "
                    "the package (trained on synthetic streams by `sdqes-edge train`) through the torch-free "
                    "runtime with the stream's five queries, print each alert beside the true start of its event, "
                    "and write the video, an annotated video, the alert log and a score-curve plot.")
    demo.add_argument("--seed", type=int, default=DEMO_SEED, help="stream seed (default %(default)s; training "
                                                                  "uses seeds from 100000 on)")
    demo.add_argument("--out", default="sdqes-demo", help="output folder (default %(default)s)")
    demo.add_argument("--bundle", help="another bundle to run instead of the shipped one")
    demo.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: all cores)")
    demo.set_defaults(func=cmd_demo, output_dirs=("out",))
