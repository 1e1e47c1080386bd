"""``sdqes-edge run``: stream a video, camera or URL through a bundle and raise alerts. Torch-free."""

from __future__ import annotations

import argparse
import signal
import sys
import textwrap
import time
from contextlib import AbstractContextManager, closing, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from sdqes_edge.cli.common import (
    PROG,
    add_subcommand,
    at_least,
    frames_per_second,
    path_text,
    say,
    seconds_at_least,
    show,
    text_key,
    warn,
)
from sdqes_edge.cli.output import stdout_reader_left
from sdqes_edge.cli.output_locks import hold_run_outputs
from sdqes_edge.cli.queries_file import QUERIES_FILE_HELP, QueryLine, read_queries_file
from sdqes_edge.cli.queries_watch import Asked, LineAsker, QueriesFileWatcher, file_signature, keyed
from sdqes_edge.cli.run_device import backend_words, device_tip
from sdqes_edge.cli.run_outputs import (
    STATE_WRITTEN,
    StateAfterAlerts,
    add_output_options,
    attach_sinks,
    events_reader_left,
    finish_outputs,
    raise_failures,
    resolve_events_on_stdout,
    summarize_run,
    videos_written,
)
from sdqes_edge.cli.run_policy import add_policy_options, check_policy_args, policy_options, policy_words
from sdqes_edge.contract import PRECISIONS, REFERENCE_PRECISION
from sdqes_edge.errors import SourceUnavailable, UserError
from sdqes_edge.files import set_aside
from sdqes_edge.path_checks import (
    ALERT_LOG_EXAMPLE,
    SCORE_TRACE_EXAMPLE,
    SNAPSHOT_EXAMPLE,
    check_output_dir,
    check_output_file,
)
from sdqes_edge.progress import LOG_LINE_SECONDS, progress_bar, stderr_is_a_terminal
from sdqes_edge.runtime.backend import BACKENDS
from sdqes_edge.runtime.frame_source import STREAM_TIMEOUT_MIN_S, STREAM_TIMEOUT_S
from sdqes_edge.runtime.ort_sessions import DEVICE_PROVIDERS
from sdqes_edge.service_manager import ServiceManager
from sdqes_edge.stopping import FinishFrameThenStop, exit_code_of, exit_status
from sdqes_edge.traces import TRACE_SUFFIX
from sdqes_edge.train_options import random_weights_warning, training_data_note

if TYPE_CHECKING:  # the detector loads OpenCV: imported where a command runs, so that --help needs no cv2
    from sdqes_edge.runtime.detector import RunStats, StreamingDetector

LIVE_REPORT_SECONDS = 5.0  # a live stream's status line on a terminal; in a log, one every LOG_LINE_SECONDS
# A camera or stream URL that went away for good ends the run with the status of one that cannot be opened: a
# failure (systemd's Restart=on-failure starts it again), not the end of a file (0), a mistake (2) or a stop (143).
LOST_SOURCE_EXIT = SourceUnavailable.exit_code
READER_LEFT_EXIT = exit_status(signal.SIGPIPE)  # stdout's reader gone: as a process SIGPIPE ends
EXIT_STATUSES = (  # run --help's last lines, for a service's unit or a script that calls run
    f"exit status: 0 every source ended (or --max-frames); {LOST_SOURCE_EXIT} a camera or stream that cannot be "
    f"opened or was lost, or a full disk; {UserError.exit_code} a mistake in the command or the bundle; "
    f"{', '.join(str(exit_status(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))} stopped by Ctrl-C, "
    f"SIGTERM, SIGHUP (the frame in hand finished, every output complete); {READER_LEFT_EXIT} the program reading "
    "the alerts on stdout closed it")


def cmd_run(args: argparse.Namespace) -> int:
    from sdqes_edge.runtime.detector import RunStats, StreamingDetector
    from sdqes_edge.runtime.source_opening import open_sources
    from sdqes_edge.runtime.sources import give_distinct_names

    _check_run_args(args)
    detector = StreamingDetector(args.bundle, backend=args.backend, precision=args.precision, threads=args.threads,
                                 ort_device=args.ort_device, truncate_queries=args.truncate_queries,
                                 ort_ops=args.ort_ops)
    detector.check_source_count(len(args.source))  # before any source is opened or output started
    file_queries, command_line_keys = _add_queries(detector, args)
    detector.warm_up()  # before a camera opens: the first real frame's latency is a steady one
    # All at once, on threads of their own: a stop while a stream is still opening comes at once.
    sources = open_sources(args.source, detector.fps, log=say, stream_timeout_s=args.stream_timeout or STREAM_TIMEOUT_S,
                           images_fps=args.images_fps)
    renamed = give_distinct_names(sources)
    if renamed:
        say(f"note: several sources have the same name; in alerts and outputs they are called "
            f"{', '.join(s.name for s in sources)}")
    for source in sources:
        source.log = say
    if args.resume:
        _resume(detector, args)
    detector.attach(sources)  # a file the snapshot was reading goes on where it stopped (before the progress bar)
    trace_paths, video_sinks = attach_sinks(detector, sources, args)
    live = any(s.live for s in sources)
    count = len(detector.queries.ids)
    header = (f"streaming {', '.join(s.name for s in sources)} at {detector.fps:g} fps with {count} "
              f"quer{'y' if count == 1 else 'ies'}, {policy_words(detector, args)} "
              f"({backend_words(detector.backend, args)})")
    show(header + ("; Ctrl-C to stop" if live else ""), file=sys.stderr)  # source names shown
    manager = ServiceManager()  # systemd's Type=notify: ready now, a watchdog ping per frame, stopping at the end
    manager.ready(header)
    _say_what_runs(detector, args)
    stats = RunStats()
    asker = LineAsker(detector, args.threshold, **policy_options(args))
    watcher = QueriesFileWatcher(detector, args.queries_file, file_queries, command_line_keys, asker,
                                 args.queries_file_version) if args.watch_queries else nullcontext()
    sinks = list(detector.sinks)
    exit_code, failures = _stream(detector, sources, args, stats, live, manager, watcher)
    # Only the first output refused as the sinks closed is raised: the others had been written, said the summary.
    failures += [sink.refusal for sink in sinks if sink.refusal is not None and sink.refusal not in failures]
    refused = {getattr(failure, "filename", None) for failure in failures}  # outputs the machine refused: marked
    summarize_run(sources, stats, exit_code, [f"{p} (not written)" if str(p) in refused else str(p) for p in [
        args.events, *videos_written(video_sinks), args.save_state, *trace_paths] if p])
    raise_failures(failures)  # what ran and was written first, then what went wrong, as sdqes-run ends
    if trace_paths:
        # --scores FILE.npz itself: the folder it lies in may hold other arrays (a --save-state snapshot).
        one_file = len(trace_paths) == 1 and Path(args.scores).suffix == TRACE_SUFFIX
        traces = trace_paths[0] if one_file else trace_paths[0].parent
        show(f"next: {PROG} eval --annotations ANNOTATIONS.csv --scores {traces}", file=sys.stderr)
    if exit_code == 0 and any(source.lost_words() for source in sources):
        return LOST_SOURCE_EXIT  # not a stream that ended: a service manager should start the run again
    return exit_code


def _check_run_args(args: argparse.Namespace) -> None:
    """Every mistake in the arguments refused before a bundle is loaded or a source opened."""
    args.ort_device_given = args.ort_device is not None  # left out: the CPU, with a tip where a GPU would work
    args.ort_device = args.ort_device or "cpu"
    if len(args.message or []) > len(args.query or []):
        raise UserError(f"{len(args.message)} --message but {len(args.query or [])} --query; each message follows "
                        "its query")
    check_policy_args(args)
    if args.watch_queries and not args.queries_file:
        raise UserError("--watch-queries reads the --queries-file again when it changes; give --queries-file FILE")
    # Its version before it is read: --watch-queries applies a change made while the model loads (never misses it).
    args.queries_file_version = file_signature(args.queries_file) if args.watch_queries else None
    args.file_queries = read_queries_file(args.queries_file) if args.queries_file else []
    if args.max_frames is not None and args.max_frames < 1:
        raise UserError(f"--max-frames {args.max_frames}: give a positive number of steps (or leave it out to "
                        "stream to the end)")
    if args.annotate:
        from sdqes_edge.runtime.annotated_video import check_annotation_path

        check_annotation_path(args.annotate)
    if args.scores:
        scores = Path(args.scores)
        if scores.suffix == TRACE_SUFFIX:
            check_output_file(scores, "--scores", SCORE_TRACE_EXAMPLE)
        else:
            if scores.suffix and not scores.is_dir():  # scores.txt, traces.json: meant as a file, most likely
                warn(f"--scores {scores} does not end in {TRACE_SUFFIX}, so it is a folder "
                     f"(one SOURCE{TRACE_SUFFIX} per stream); for one file name it "
                     f"{scores.with_suffix(TRACE_SUFFIX)}")
            check_output_dir(scores, "--scores")
    resolve_events_on_stdout(args)
    hold_run_outputs(args)  # before anything is loaded or said: a second run on the same files is refused at once
    _state_file(args)
    if args.save_state:
        from sdqes_edge.runtime.snapshots import SNAPSHOT_SUFFIX, snapshot_path

        if Path(args.save_state).suffix != SNAPSHOT_SUFFIX:  # so that the summary names the file written
            written = str(snapshot_path(args.save_state))
            warn(f"--save-state {args.save_state} does not end in {SNAPSHOT_SUFFIX}, so the "
                 f"snapshot goes to {written} (--resume finds it by either name)")
            args.save_state = written
    from sdqes_edge.runtime.live_source import is_stream_url
    from sdqes_edge.runtime.sources import source_kind

    if args.stream_timeout is not None and not any(is_stream_url(source) for source in args.source):
        warn("--stream-timeout is for stream URLs (rtsp://, http://, udp://, tcp://), and no --source is one: ignored")
    if args.images_fps is not None and not any(source_kind(source) == "folder" for source in args.source):
        warn("--images-fps is the rate an image folder's images were taken at, and no --source is a folder (a video "
             "keeps its frames' own times): ignored")
    if args.ort_ops and args.backend != BACKENDS[0]:
        warn(f"--ort-ops is ONNX Runtime's (--backend {BACKENDS[0]}); a TensorRT engine fuses these steps "
             "itself: ignored")
        args.ort_ops = None


def _state_file(args: argparse.Namespace) -> None:
    """--state FILE: --resume FILE where it exists and --save-state FILE. A service restarted by systemd or docker
    goes on with the state it stopped with, and its first start, with no snapshot yet, is not refused."""
    if not args.state:
        return
    if args.resume or args.save_state:
        given = " and ".join(f for f, v in (("--resume", args.resume), ("--save-state", args.save_state)) if v)
        raise UserError(f"--state {args.state} both resumes from and saves to that file; give it alone, or {given} "
                        "alone")
    from sdqes_edge.runtime.snapshots import snapshot_to_read

    args.save_state = args.state
    if snapshot_to_read(args.state).is_file():
        args.resume = args.state
    elif not args.quiet:
        say(f"note: no state snapshot at {args.state} yet: the stream starts fresh, and its state is "
            f"written there {STATE_WRITTEN}")


def _resume(detector: StreamingDetector, args: argparse.Namespace) -> None:
    """--resume FILE, or --state FILE where it exists. A --state snapshot that no longer fits (its bundle exported
    anew, another --batch, a damaged file) is set aside with a warning and the stream starts fresh: a service whose
    model was updated was refused at every start (exit 2, which its unit rightly does not restart), until someone
    deleted the file. --resume names a snapshot to go on from: one that does not fit is still refused."""
    from sdqes_edge.runtime.snapshots import UnusableSnapshot, snapshot_to_read

    try:
        detector.load_state(args.resume)
    except UnusableSnapshot as exc:
        if not args.state:
            raise
        kept = set_aside(snapshot_to_read(args.state), "unusable")
        warn(f"--state {args.state} {exc.problem}: the stream starts fresh, its state written there {STATE_WRITTEN}; "
             f"that file is kept as {kept}")


def _add_queries(detector: StreamingDetector, args: argparse.Namespace) -> tuple[dict[str, Asked], set[str]]:
    """The --query texts with their --message (by position) and the --queries-file's, else the bundle's
    pre-encoded queries. Returns what --watch-queries keeps: the file's queries by key, and the command line's keys
    (a line of the file that asks one of those again is not added)."""
    queries, messages = args.query or [], args.message or []
    paired = [QueryLine(text, messages[i] if i < len(messages) else None) for i, text in enumerate(queries)]
    command_line_keys, from_file = {text_key(line.text) for line in paired}, {}
    ask = LineAsker(detector, args.threshold, **policy_options(args))
    asked = keyed(paired + args.file_queries)
    for (key, line), query in zip(asked.items(), ask.ask_all(list(asked.values()), not args.quiet)):
        if key not in command_line_keys:
            from_file[key] = Asked(line, query)
    # The bundle's queries that the given ones leave out (one asked again in the same words is asked).
    own = [q for q in (detector.bundle.queries() or ([], None))[0] if text_key(q["text"]) not in asked]
    if not paired + args.file_queries:
        if not detector.add_bundle_queries(args.threshold, **policy_options(args)):
            raise UserError("no queries: give --query TEXT or --queries-file FILE (or export the bundle with --query)")
    elif own:  # the bundle's queries were left out without a word
        say(f"note: the bundle's own {len(own)} quer{'y' if len(own) == 1 else 'ies'} ({own[0]['text']!r}"
            f"{', ...' if len(own) > 1 else ''}) {'is' if len(own) == 1 else 'are'} not asked: --query and "
            "--queries-file replace them; give them there too to ask them as well")
    return from_file, command_line_keys


def expected_steps(sources: list, max_frames: int | None) -> int | None:
    """The steps a run will take (its progress bar's total): the longest source's samples, since a step takes a
    frame of each source still going until all have ended, and at most --max-frames. None where a source cannot
    say (a camera, a stream, a container without a frame count)."""
    lengths = [getattr(source, "duration_frames", None) for source in sources]
    if None in lengths:
        return None
    return max(lengths) if max_frames is None else min(max(lengths), max_frames)


def live_report_seconds() -> float:
    """How often a live stream's status line comes: every few seconds on a terminal; in a log (journald, docker) as
    often as progress lines come there, not 17,000 lines a day from a service that runs for weeks."""
    return LIVE_REPORT_SECONDS if stderr_is_a_terminal() else LOG_LINE_SECONDS


def _say_what_runs(detector: StreamingDetector, args: argparse.Namespace) -> None:
    """A faster way to run this bundle here, and what its model's alerts are worth: trained on synthetic scenes only,
    or weights drawn at random (a preset's export, which `--help` starts a user with)."""
    tip = device_tip(detector, args)
    if tip:
        say(f"tip: {tip}")
    if trained_on := training_data_note(detector.bundle.training_record):
        say(f"note: {trained_on}")
    if random := random_weights_warning(detector.bundle.manifest):
        warn(random)


def _stream(detector: StreamingDetector, sources: list, args: argparse.Namespace, stats: RunStats,
            live: bool, manager: ServiceManager, watcher: AbstractContextManager) -> tuple[int, list[Exception]]:
    """Step until the sources end, --max-frames, a signal (the frame in hand finished) or a failure in the middle of
    the stream (a source's reader's); every sink closed -> (exit status, that failure and those of the outputs refused
    as they closed, to be said once the run's summary is). ``watcher`` (--watch-queries) changes the queries while it
    is open, never once the detector closes."""
    failures: list[Exception] = []
    bar = progress_bar(expected_steps(sources, args.max_frames), "frame" if len(sources) == 1 else "step",
                       "streaming", enabled=not args.quiet and not live)
    last_report, report_every = time.perf_counter(), live_report_seconds()
    stop = FinishFrameThenStop()  # Ctrl-C, SIGTERM (docker stop, systemd) or SIGHUP: finish the frame, close sinks
    exit_code, state_saves = 0, StateAfterAlerts(detector, args.state) if args.state else None
    try:
        with stop, watcher, closing(detector.run(sources, stats, max_frames=args.max_frames,
                                                  stop_requested=lambda: stop.requested)) as steps:
            for alerts in steps:
                if state_saves is not None:  # a power cut or a kill keeps each alert's count and time
                    state_saves.after_step(bool(alerts))
                manager.alive()
                if bar is not None:
                    bar.update(1)
                if time.perf_counter() - last_report >= report_every:
                    last_report = time.perf_counter()
                    report = (f"{stats.fps:.1f} frames/s, latency p50 {stats.latency(50):.0f} ms, p99 "
                              f"{stats.latency(99):.0f} ms, dropped {sum(s.stats.dropped for s in sources)}, "
                              f"{stats.events} alert{'' if stats.events == 1 else 's'}")
                    manager.status(report)
                    if live and not args.quiet:
                        say(report)
                if stop.requested:
                    break
                if stdout_reader_left():  # `run ... | head -3`: the alerts' reader has what it wanted
                    say("stopping: the program reading the alerts on stdout has closed it")
                    exit_code = READER_LEFT_EXIT  # the frame in hand finished
                    break
        exit_code = stop.exit_code or exit_code
    except KeyboardInterrupt as interrupt:  # a second signal, or one outside the loop
        exit_code = exit_code_of(interrupt)
    except (UserError, OSError) as error:  # said after the summary, as sdqes-run ends (an OSError by the last net)
        if events_reader_left(error, args.events):  # --events - piped to a program that has closed it
            exit_code = READER_LEFT_EXIT
        elif not stats.frames:  # before any frame ran: said alone
            raise
        else:
            failures.append(error)
            # An output the machine refused as the sinks closed (a full disk): the summary says how the stream ended.
            ended = stats.streamed or stop.requested
            exit_code = (stop.exit_code or exit_code) if ended else getattr(error, "exit_code", 1)
    finally:
        manager.stopping(f"stopping after {stats.frames} frames: finishing every output")
        if bar is not None:
            bar.close()
        failures += finish_outputs(detector, args.save_state)
    return exit_code, failures


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = add_subcommand(
        sub, "run", "stream a video, camera or URL through a bundle and alert when a queried event starts",
        "Read frames with OpenCV, sample them at the bundle's fps by timestamp, step the model with its state "
        "carried from frame to frame, score every query in one product, and alert on each rising edge of "
        "p = sigmoid(cos) above the threshold. Needs numpy, OpenCV and ONNX Runtime (or TensorRT); never torch.",
        examples=("bundles/qrnn --source kitchen.mp4 --query 'When I start cooking, remind me to wash my hands.' "
                  "--message 'Wash your hands!' --events alerts.jsonl",
                  "bundles/qrnn --source 0 --query 'when I open the fridge'     (camera 0)",
                  "bundles/qrnn --source rtsp://cam/stream --backend trt --precision fp16"))
    run.epilog += "\n\n" + textwrap.fill(EXIT_STATUSES, width=100, subsequent_indent="  ")
    run.add_argument("bundle", type=path_text, help="bundle directory made by `sdqes-edge export`")
    run.add_argument("--source", type=path_text, action="append", required=True,
                     help="video file, image folder (frames in number order, one per sample unless --images-fps "
                          "says their rate), camera index (0) "
                          "or device (/dev/v4l/by-id/...), URL or GStreamer pipeline; repeat for several streams "
                          "(needs a bundle exported with --batch N), stepped together: a camera that stalls idles "
                          "its stream, memory kept, while the others step; of several cameras, one absent at the "
                          "start or lost is tried again every few seconds while the others run")
    run.add_argument("--images-fps", type=frames_per_second, metavar="FPS",
                     help="the rate an image folder's images were taken at (2 for frames extracted at 2 fps, as the "
                          "authors' code stores them), sampled at the bundle's fps by time as a video is; default: "
                          "one image per sample, the folder taken to be sampled at the bundle's fps already")
    run.add_argument("--stream-timeout", type=seconds_at_least(STREAM_TIMEOUT_MIN_S), metavar="SECONDS",
                     help="how long a stream URL may take to open, or to send its next frame, before it is "
                          f"reconnected (default {STREAM_TIMEOUT_S:g}; FFmpeg's own is 30)")
    run.add_argument("--query", action="append", help="event to wait for (repeatable); default: the bundle's")
    run.add_argument("--message", action="append", help="alert message for the query of the same position")
    run.add_argument("--queries-file", type=path_text,
                     help=f"more queries with their alert messages: {QUERIES_FILE_HELP}")
    run.add_argument("--watch-queries", action="store_true",
                     help="read the --queries-file again whenever it changes, while the stream runs (within 2 s): "
                          "lines added are asked, lines removed stop, a changed message, threshold or label keeps its "
                          "query's alert state; "
                          "a service's queries change without a restart")
    add_policy_options(run)
    run.add_argument("--backend", choices=BACKENDS, default=BACKENDS[0],
                     help="ort: ONNX Runtime, trt: a TensorRT engine made by build-engine (default %(default)s)")
    run.add_argument("--precision", choices=PRECISIONS, default=REFERENCE_PRECISION,
                     help="step graph (or engine) to run; the bundle must have it (default %(default)s)")
    run.add_argument("--threads", type=at_least(1), help="ONNX Runtime intra-op threads (default: all cores)")
    run.add_argument("--ort-device", choices=list(DEVICE_PROVIDERS),
                     help="ONNX Runtime execution provider (default cpu; cuda/tensorrt need onnxruntime-gpu, and "
                          "the state then stays on the GPU between frames; a run left on the CPU where they would "
                          "work says so)")
    run.add_argument("--ort-ops", type=path_text, metavar="LIBRARY",
                     help="this project's ONNX Runtime kernels (build them with sdqes-edge build-ort-ops; nvcc "
                          "for cuda): each QRNN adapter's pooling step one kernel instead of six, each RetNet "
                          "adapter's retention step one instead of twelve")
    add_output_options(run)
    run.add_argument("--max-frames", type=int, help="stop after this many steps")
    run.add_argument("--truncate-queries", action="store_true", help="cut queries over the bundle's token limit "
                     "(CLIP's 77; `sdqes-edge inspect` says a bundle's) instead of refusing them")
    run.add_argument("--quiet", action="store_true", help="no console alerts or progress")
    # --annotate and --scores are checked in cmd_run (their kind depends on the name)
    run.set_defaults(func=cmd_run, output_files={"events": ALERT_LOG_EXAMPLE, "save_state": SNAPSHOT_EXAMPLE,
                                                 "state": SNAPSHOT_EXAMPLE})
