"""``sdqes-edge run``: stream a video, camera or URL through a bundle and raise alerts. Torch-free."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import closing
from pathlib import Path

from ..errors import UserError
from ..files import check_output_dir, check_output_file
from ..stopping import FinishFrameThenStop, exit_code_of
from .sinks import check_annotation_path

PROG = "sdqes-edge"
LIVE_REPORT_SECONDS = 5.0


def _progress(total: int | None, enabled: bool):
    """A progress bar for files (tqdm where installed; the runtime does not require it)."""
    if not enabled or total is None:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="frame", desc="streaming", leave=False, file=sys.stderr)


def _backend_words(backend, args: argparse.Namespace) -> str:
    """What actually steps: the backend, precision and, for ONNX Runtime, the provider it assigned."""
    words = f"{args.backend}, {args.precision}"
    providers = getattr(backend, "providers", None)
    if providers:
        words += f", {providers[0]}"
        if getattr(backend, "buffers", None) is not None:
            words += ", state bound on the device" + (" with CUDA graphs" if backend.cuda_graph else "")
    return words


def cmd_run(args: argparse.Namespace) -> int:
    from .detector import RunStats, StreamingDetector
    from .sinks import AnnotatedVideoSink, ConsoleSink, JsonlSink, ScoreTraceRecorder
    from .sources import open_source

    queries = args.query or []
    messages = args.message or []
    if len(messages) > len(queries):
        raise UserError(f"{len(messages)} --message but {len(queries)} --query; each message follows its query")
    if args.threshold is not None and not 0.0 < args.threshold < 1.0:
        raise UserError(f"--threshold {args.threshold} is outside (0, 1): it is a probability sigmoid(cos)")
    if args.max_frames is not None and args.max_frames < 1:
        raise UserError(f"--max-frames {args.max_frames}: give a positive number of steps (or leave it out to "
                        "stream to the end)")
    if args.annotate:
        check_annotation_path(args.annotate)
    if args.scores:
        if Path(args.scores).suffix == ".npz" and len(args.source) == 1:
            check_output_file(args.scores, "--scores")
        else:
            check_output_dir(args.scores, "--scores")
    detector = StreamingDetector(args.bundle, backend=args.backend, precision=args.precision, threads=args.threads,
                                 ort_device=args.ort_device, truncate_queries=args.truncate_queries)
    policy = dict(exit_threshold=args.exit_threshold, cooldown_s=args.cooldown, max_alerts=args.max_alerts)
    for i, text in enumerate(queries):
        detector.add_query(text, messages[i] if i < len(messages) else None, args.threshold, **policy)
    if not queries:
        added = detector.add_bundle_queries(args.threshold, **policy)
        if not added:
            raise UserError("no queries: give --query TEXT (or export the bundle with --query)")
    sources = [open_source(spec, detector.fps) for spec in args.source]
    for source in sources:
        source.log = lambda message: print(f"{PROG}: {message}", file=sys.stderr)
    if args.resume:
        detector.load_state(args.resume)
    if not args.quiet:
        detector.add_sink(ConsoleSink())
    if args.events:
        detector.add_sink(JsonlSink(args.events))
    if args.annotate:
        detector.add_sink(AnnotatedVideoSink(args.annotate, detector.fps, detector.thresholds))
    trace_paths = []
    if args.scores:
        target = Path(args.scores)
        for i, source in enumerate(sources):
            path = target if target.suffix == ".npz" and len(sources) == 1 else target / f"{source.name}.npz"
            trace_paths.append(path)
            detector.add_sink(ScoreTraceRecorder(path, source.name, detector.fps, stream=i))

    live = any(s.live for s in sources)
    names = ", ".join(s.name for s in sources)
    policy = next(iter(detector.queries.queries.values())).policy
    print(f"streaming {names} at {detector.fps:g} fps with {len(detector.queries.ids)} quer"
          f"{'y' if len(detector.queries.ids) == 1 else 'ies'}, {policy.describe()}"
          f" ({_backend_words(detector.backend, args)})" + ("; Ctrl-C to stop" if live else ""), file=sys.stderr)
    trained_on = detector.bundle.training_data
    if trained_on:
        print(f"{PROG}: note: this model was trained on {trained_on} only; on other footage its alerts mean "
              "little", file=sys.stderr)
    stats = RunStats()
    bar = _progress(getattr(sources[0], "duration_frames", None), not args.quiet and not live)
    last_report = time.perf_counter()
    stop = FinishFrameThenStop()  # Ctrl-C, SIGTERM (docker stop, systemd) or SIGHUP: finish the frame, close sinks
    exit_code = 0
    try:
        with stop, closing(detector.run(sources, stats, max_frames=args.max_frames)) as steps:
            for _ in steps:
                if bar is not None:
                    bar.update(1)
                if live and not args.quiet and time.perf_counter() - last_report >= LIVE_REPORT_SECONDS:
                    last_report = time.perf_counter()
                    print(f"{PROG}: {stats.fps:.1f} frames/s, latency p50 {stats.latency(50):.0f} ms, p99 "
                          f"{stats.latency(99):.0f} ms, dropped {sum(s.stats.dropped for s in sources)}",
                          file=sys.stderr)
                if stop.requested:
                    break
        exit_code = stop.exit_code
    except KeyboardInterrupt as interrupt:  # a second signal, or one outside the loop
        exit_code = exit_code_of(interrupt)
    finally:
        if bar is not None:
            bar.close()
        detector.close()
        if args.save_state:
            detector.save_state(args.save_state)
    interrupted = exit_code != 0
    dropped = sum(s.stats.dropped for s in sources)
    print(f"{'interrupted after' if interrupted else 'done:'} {stats.frames} frames, {stats.events} alerts, "
          f"{stats.fps:.1f} frames/s, latency p50 {stats.latency(50):.1f} ms p99 {stats.latency(99):.1f} ms"
          + (f", {dropped} frames dropped (the model is slower than the source)" if dropped else ""), file=sys.stderr)
    for source in sources:
        shortfall = source.stats.shortfall_words(source.name)
        if shortfall:
            print(f"{PROG}: incomplete: {shortfall}", file=sys.stderr)
    written = [str(p) for p in [args.events, args.annotate, args.save_state, *trace_paths] if p]
    if written:
        print(f"wrote {', '.join(written)}", file=sys.stderr)
    if trace_paths:
        folder = trace_paths[0].parent
        print(f"next: {PROG} eval --annotations ANNOTATIONS.csv --scores {folder}", file=sys.stderr)
    return exit_code


def add_parsers(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run", help="stream a video, camera or URL through a bundle and alert when a queried event starts",
        description="Read frames with OpenCV, sample them at the bundle's fps by timestamp, step the model with "
                    "its state carried from frame to frame, score every query in one product, and alert on each "
                    "rising edge of p = sigmoid(cos) above the threshold. Needs numpy, OpenCV and ONNX Runtime "
                    "(or TensorRT); never torch.",
        epilog=f"examples:\n  {PROG} run bundles/qrnn --source kitchen.mp4 --query 'When I start cooking, remind me "
               "to wash my hands.' --message 'Wash your hands!' --events alerts.jsonl\n"
               f"  {PROG} run bundles/qrnn --source 0 --query 'when I open the fridge'     (camera 0)\n"
               f"  {PROG} run bundles/qrnn --source rtsp://cam/stream --backend trt --precision fp16",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("bundle", help="bundle directory made by `sdqes-edge export`")
    run.add_argument("--source", action="append", required=True,
                     help="video file, image folder, camera index (0) or URL / GStreamer pipeline; repeat for "
                          "several streams (needs a bundle exported with --batch N)")
    run.add_argument("--query", action="append", help="event to wait for (repeatable); default: the bundle's")
    run.add_argument("--message", action="append", help="alert message for the query of the same position")
    run.add_argument("--threshold", type=float, help="alert threshold on sigmoid(cos); default: the bundle's")
    run.add_argument("--exit-threshold", type=float, help="hysteresis: stay 'on' until p falls to this "
                                                           "(default: the bundle's policy, else the threshold)")
    run.add_argument("--cooldown", type=float, help="seconds without a new alert after one (default: the "
                                                    "bundle's policy, else 0)")
    run.add_argument("--max-alerts", type=int, help="alerts per query after which it goes quiet")
    run.add_argument("--backend", choices=["ort", "trt"], default="ort", help="ONNX Runtime (default) or TensorRT")
    run.add_argument("--precision", choices=["fp32", "fp16", "int8"], default="fp32")
    run.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: all cores)")
    run.add_argument("--ort-device", choices=["cpu", "cuda", "tensorrt"], default="cpu",
                     help="ONNX Runtime execution provider (cuda/tensorrt need onnxruntime-gpu; the state then "
                          "stays on the GPU between frames)")
    run.add_argument("--events", help="append alerts to this JSONL file (flushed per alert)")
    run.add_argument("--scores", help="per-frame score trace: FILE.npz, or a folder (one file per stream)")
    run.add_argument("--annotate", help="write the stream with score bars and alert banners to this video")
    run.add_argument("--resume", help="state snapshot (.npz) to resume from")
    run.add_argument("--save-state", help="write the state to this .npz when the stream ends or is stopped")
    run.add_argument("--max-frames", type=int, help="stop after this many steps")
    run.add_argument("--truncate-queries", action="store_true", help="cut queries over 77 tokens")
    run.add_argument("--quiet", action="store_true", help="no console alerts or progress")
    run.set_defaults(func=cmd_run, output_files=("events", "save_state"))  # --annotate, --scores: in cmd_run
