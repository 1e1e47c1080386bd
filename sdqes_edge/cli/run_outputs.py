"""What ``sdqes-edge run`` writes besides its console lines (the alert log, score traces, annotated videos, the state
snapshot): its options, the path of each output per source, and the sinks that write them. Torch-free."""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sdqes_edge.cli.common import finite_number, path_text, say, say_error, seconds_at_least, show, warn
from sdqes_edge.cli.output_locks import hold_source_outputs
from sdqes_edge.cli.refusals import refusal_words
from sdqes_edge.errors import SourceUnavailable, UserError
from sdqes_edge.traces import TRACE_SUFFIX

if TYPE_CHECKING:  # the detector loads OpenCV: imported where a command runs, so that --help needs no cv2
    from sdqes_edge.runtime.annotated_video import AnnotatedVideoSink
    from sdqes_edge.runtime.detector import RunStats, StreamingDetector

# run --state writes its snapshot after a step that alerted, at most this often: a query set that alerts every
# frame would otherwise write the whole state (9 MiB a stream at ViT-B/16) at every step.
ALERT_SNAPSHOT_SECONDS = 5.0
STATE_WRITTEN = f"after an alert (at most every {ALERT_SNAPSHOT_SECONDS:g} s) and when the stream ends or is stopped"
# A live stream's annotated video, in files of this much stream time each: a video is playable only once it is
# closed, so one that grew for weeks was lost whole to a power cut, and could not be watched while the stream ran.
LIVE_ANNOTATION_SEGMENT_SECONDS = 600.0
VIDEOS_NAMED_IN_SUMMARY = 3  # a week of 10-minute segments is counted, not listed


def paths_per_source(path: str | Path, sources: list) -> list[Path]:
    """A file output (--annotate's video, --scores FILE.npz) for each source: the path itself for one source, and
    for several one beside it named for each (out.mp4 -> out.kitchen.mp4, ...): one file held only the first
    source, silently."""
    path = Path(path)
    if len(sources) == 1:
        return [path]
    return [path.with_name(f"{path.stem}.{source.name}{path.suffix}") for source in sources]


def score_trace_paths(scores: str, sources: list) -> list[Path]:
    """--scores FILE.npz (one per source beside it when there are several), or a folder of SOURCE.npz."""
    target = Path(scores)
    if target.suffix == TRACE_SUFFIX:
        return paths_per_source(target, sources)
    return [target / f"{source.name}{TRACE_SUFFIX}" for source in sources]


def annotation_segment_seconds(args: argparse.Namespace, source) -> float | None:
    """--annotate-segment where given (0: one video), else segments for a live source and one video for a file."""
    if args.annotate_segment is not None:
        return args.annotate_segment or None
    return LIVE_ANNOTATION_SEGMENT_SECONDS if source.live else None


STDOUT_FILE = "/dev/stdout"  # what --events - writes to: the alerts' JSONL piped to another program (jq, a notifier)


def resolve_events_on_stdout(args: argparse.Namespace) -> None:
    """--events - is stdout, as for most Unix tools (it wrote a file named '-'); there, or where --events is stdout's
    own file (/dev/stdout), the console's alert lines go to stderr (``args.events_on_stdout``): mixed into the JSONL
    they broke the program reading it."""
    if args.events == "-":
        if not os.path.exists(STDOUT_FILE):
            raise UserError(f"--events - writes the alerts to stdout through {STDOUT_FILE}, which this system lacks; "
                            "give a file")
        args.events = STDOUT_FILE
    args.events_on_stdout = False
    if not args.events:
        return
    try:
        args.events_on_stdout = os.path.samestat(os.stat(args.events), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError, AttributeError):  # no such file yet; a stdout without a file (closed, replaced)
        pass


def events_reader_left(error: Exception, events: str | None) -> bool:
    """Whether ``error`` is --events' pipe (--events -, a FIFO) closed by the program reading it, said as a stop, as
    the reader of stdout leaving is: it ended the run in a traceback."""
    if not (isinstance(error, OSError) and error.errno == errno.EPIPE and events and error.filename == events):
        return False
    say(f"stopping: the program reading the alert log (--events {events}) has closed it")
    return True


def attach_sinks(detector: StreamingDetector, sources: list,
                 args: argparse.Namespace) -> tuple[list[Path], list[AnnotatedVideoSink]]:
    """Console, --events, --annotate and --scores sinks; the score trace paths, one per source, and the video
    sinks (which name the videos they wrote)."""
    from sdqes_edge.runtime.alert_log import JsonlSink
    from sdqes_edge.runtime.annotated_video import AnnotatedVideoSink
    from sdqes_edge.runtime.sinks import ConsoleSink, ScoreTraceRecorder

    trace_paths = score_trace_paths(args.scores, sources) if args.scores else []
    video_paths = paths_per_source(args.annotate, sources) if args.annotate else []
    hold_source_outputs(trace_paths, video_paths)  # before any is opened: another run of this source is refused
    if not args.quiet:
        on_stderr = getattr(args, "events_on_stdout", False)
        detector.add_sink(ConsoleSink((lambda line: show(line, file=sys.stderr)) if on_stderr else print))
    if args.events:
        detector.add_sink(JsonlSink(args.events)).log = say
    keep = args.annotate_keep * 3600 if args.annotate_keep else None
    videos = [AnnotatedVideoSink(path, detector.fps, detector.thresholds, stream=i,
                                 segment_seconds=annotation_segment_seconds(args, source),
                                 first_frame=source.start_index, keep_seconds=keep, resumed=bool(args.resume))
              for i, (source, path) in enumerate(zip(sources, video_paths))]
    for sink, source in zip(videos, sources):
        sink.log = say
        detector.add_sink(sink)
        if sink.segment_seconds and args.annotate_segment is None and not args.quiet:
            say(f"note: {source.name} is live: its annotated video is written in files of "
                f"{sink.segment_seconds:g} s ({sink.path.stem}.UTC-START{sink.path.suffix}), each playable once the "
                "next begins; --annotate-segment 0 for one video"
                + ("" if keep else ", --annotate-keep HOURS to remove old ones"))
    if (keep or args.annotate_segment is not None) and not args.annotate:
        warn("--annotate-segment and --annotate-keep shape --annotate's video, and no --annotate is given: ignored")
    elif keep and not any(sink.segment_seconds for sink in videos):
        warn("--annotate-keep removes old segments, and no annotated video here is in segments (a file's is not, "
             "unless --annotate-segment): ignored")
    for i, (source, path) in enumerate(zip(sources, trace_paths)):
        recorder = ScoreTraceRecorder(path, source.name, detector.fps, stream=i, model=detector.bundle.model_identity,
                                      first_frame=source.start_index)
        recorder.log = say
        detector.add_sink(recorder)
    return trace_paths, videos


class StateAfterAlerts:
    """run --state's snapshots while the stream goes on: after a step that alerted, at most every
    ``ALERT_SNAPSHOT_SECONDS``, written by a thread of their own. One the machine refuses (a full disk) is said as
    it happens and the stream goes on alerting, as sdqes-run's does: the run had ended at the next snapshot, the
    camera unwatched, and said only "the disk is full", not where. It is tried again at each step past the interval
    until written, said once, however often refused, and said again once written. The snapshot at the end, refused
    too, is the run's error, as --save-state's is."""

    def __init__(self, detector: StreamingDetector, path: str):
        self.detector, self.path = detector, path
        self._unsaved, self._saved_at = False, -math.inf
        self._refused = False  # the last write's outcome, set on the writing thread

    def after_step(self, alerted: bool) -> None:
        # A refused write is tried again: an alert's count and time (--max-alerts, --cooldown) outlive a power cut.
        self._unsaved = self._unsaved or alerted or self._refused
        if self._unsaved and time.monotonic() - self._saved_at >= ALERT_SNAPSHOT_SECONDS:
            self.detector.save_state(self.path, wait=False, on_done=self._done)  # written while the stream goes on
            self._unsaved, self._saved_at = False, time.monotonic()

    def _done(self, refusal: OSError | None) -> None:
        if refusal is not None and not self._refused:
            warn(f"cannot write --state {self.path}: {refusal.strerror or refusal} (the file there, if any, is "
                 f"unchanged); the stream goes on, and tries again every {ALERT_SNAPSHOT_SECONDS:g} s")
        elif refusal is None and self._refused:
            say(f"note: --state {self.path} is written again")
        self._refused = refusal is not None


def finish_outputs(detector: StreamingDetector, save_state: str | None) -> list[Exception]:
    """Close every sink, then write --save-state's snapshot -> the refusals (a full disk), each costing none of the
    other outputs: the snapshot's refusal had hidden the trace's, and the run's summary was not said."""
    refusals: list[Exception] = []
    for finish in [detector.close] + ([lambda: detector.save_state(save_state)] if save_state else []):
        try:
            finish()
        except (UserError, OSError) as refused:
            refusals.append(refused)
    return refusals


def raise_failures(failures: list[Exception]) -> None:
    """Say each failure after the first in one line, and raise the first (the command line says it last): a run's
    failure in the middle of its stream, or the first output refused as it closed."""
    for other in failures[1:]:
        said = refusal_words(other) if isinstance(other, OSError) else (str(other), 1)
        if said is None:
            raise other
        say_error(said[0])
    if failures:
        raise failures[0]


def videos_written(sinks: list[AnnotatedVideoSink]) -> list[str]:
    """The annotated videos for the summary's "wrote" line: each, or a long run's segments counted, with those a
    full disk cut off (said as they were) counted."""
    words = []
    for sink in sinks:
        written = [f"{p} (incomplete)" if p in sink.incomplete else str(p) for p in sink.written]
        if len(written) > VIDEOS_NAMED_IN_SUMMARY:
            cut = f", {len(sink.incomplete)} of them incomplete" if sink.incomplete else ""
            written = [f"{sink.written[0]} ... {sink.written[-1]} ({len(written)} videos{cut})"]
        words += written
    return words


def add_output_options(run: argparse.ArgumentParser) -> None:
    """What a run writes besides its console lines, and the state it carries from an earlier run."""
    run.add_argument("--events", type=path_text,
                     help="append alerts to this JSONL file, one object per alert with its stream time, wall-clock "
                          "time (UTC), score, and the query's threshold and label; on the disk before the next frame "
                          "(a frame's alerts in one sync), and followed when logrotate moves it; - for stdout (the "
                          "console's alert lines then go to stderr)")
    run.add_argument("--scores", type=path_text,
                     help="per-frame score trace: FILE.npz (with several sources, FILE.SOURCE.npz "
                          "for each), or a folder of SOURCE.npz")
    run.add_argument("--annotate", type=path_text,
                     help="write the stream with score bars and alert banners to this video (with "
                          "several sources, one video each: out.mp4 -> out.SOURCE.mp4); a live stream's in "
                          "segments (--annotate-segment)")
    run.add_argument("--annotate-segment", type=seconds_at_least(0.0), metavar="SECONDS",
                     help="write --annotate's video in files of this much stream time each, named for the time (UTC) "
                          "each begins (out.20261128T031502Z.mp4), each playable once the next begins; 0: one video "
                          f"(default: {LIVE_ANNOTATION_SEGMENT_SECONDS:g} s for a camera or stream, one video for a "
                          "file)")
    run.add_argument("--annotate-keep", type=_hours, metavar="HOURS",
                     help="with segments, remove those begun more than HOURS ago (earlier runs' too) as each new one "
                          "begins, so that a camera watched for months does not fill its disk (default: keep all)")
    run.add_argument("--resume", type=path_text,
                     help="state snapshot (.npz) to resume from: the file it stopped in goes on at the "
                          "next sample; another file or a camera starts at its beginning, the state and "
                          "alert states carried on")
    run.add_argument("--save-state", type=path_text,
                     help="write the state to this .npz when the stream ends or is stopped")
    run.add_argument("--state", type=path_text,
                     help="keep the state in this .npz across runs (a service that restarts): resume from it where "
                          f"it exists, write it {STATE_WRITTEN}; one that no longer fits (the bundle exported anew, "
                          "damaged) is renamed aside with a warning and the stream starts fresh")


def _hours(text: str) -> float:
    """--annotate-keep's type: a positive number of hours."""
    value = finite_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"give a positive number of hours, not {text}")
    return value


def summarize_run(sources: list, stats: RunStats, exit_code: int, written: list[str]) -> None:
    """A run's last lines on stderr: what it streamed ("done:", or "interrupted after" where ``exit_code`` is not
    0), each source's shortfall or loss, and the files ``written``."""
    dropped = sum(s.stats.dropped for s in sources)
    # A step takes a frame of every source (a live one that falls behind idles): with several, "frames" counted
    # steps, not the frames stepped.
    unit = "frame" if len(sources) == 1 else "step"
    counted = f"{stats.frames} {unit}{'' if stats.frames == 1 else 's'}" + (
        f" of {len(sources)} sources" if len(sources) > 1 else "")
    alerts = f"{stats.events} alert{'' if stats.events == 1 else 's'}"
    # No frame, no speed: "0.0 frames/s, latency p50 0.0 ms" read as a measured stall.
    speed = (f", {stats.fps:.1f} {unit}s/s, latency p50 {stats.latency(50):.1f} ms p99 {stats.latency(99):.1f} ms"
             if stats.frames else "")
    print(f"{'interrupted after' if exit_code != 0 else 'done:'} {counted}, {alerts}{speed}"
          + (f", {dropped} frames dropped (the model is slower than the source)" if dropped else ""), file=sys.stderr)
    for source in sources:
        shortfall = source.stats.shortfall_words(source.name)
        if shortfall:
            say(f"incomplete: {shortfall}")
        lost = source.lost_words()
        if lost:
            status = f" (exit status {SourceUnavailable.exit_code})" if exit_code == 0 else ""
            say_error(f"{lost}{status}")  # (a stop asked for after keeps its own status)
        if source.start_index and not source.stats.sampled and exit_code == 0:  # resumed past its end: 0 frames
            say(f"note: {source.name} has no frames after {source.start_index / source.fps:g} s, where the "
                "state snapshot stopped: the run it resumes had streamed it to its end")
    if written:
        show(f"wrote {', '.join(written)}", file=sys.stderr)
