"""Scoring a bundle over a whole video corpus: one score trace per stream, written as ``run --scores`` writes it.

An application of the runtime (as the demo is): the annotations say which queries each video is asked, the
video folder holds the videos, and each stream is scored by the same detector ``sdqes-edge run`` uses, with
every query of that video in one pass through the image tower (the text side is the only per-query cost).

Where the work runs is a separate choice: in this process (``workers=1``), in a pool of worker processes that
each keep one loaded bundle (the default: one per core, ONNX Runtime's threads divided among them), or on a
Ray cluster (``sdqes_edge.corpus_ray``). Either way the driver writes each finished trace atomically as it
arrives, so an interrupted run keeps what it finished and a re-run skips it; a stream that fails is reported
by name with its error and the others carry on.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from sdqes_edge.annotations import Annotation, by_video
from sdqes_edge.compat import shutdown_cancelling
from sdqes_edge.contract import REFERENCE_PRECISION
from sdqes_edge.errors import UserError, first_line
from sdqes_edge.files import make_folders, parse_json, scratch, write_text_atomically
from sdqes_edge.path_checks import path_problem
from sdqes_edge.tokenizer import QueryTruncatedWarning
from sdqes_edge.traces import TRACE_SUFFIX, StreamScores, load_scores, save_scores

TRACES_FOLDER = "traces"
SCRATCH_PREFIX = "sdqes-score-"  # a stream's trace chunks while it is scored, in the temp folder


@dataclass(frozen=True)
class StreamTask:
    """One video to stream, with every query the annotations ask of it."""
    stream: str  # the trace's stream name: the annotations' video_uid (what `eval` matches traces by)
    video: str | None  # the file found for it; None when the folder has none
    queries: tuple[tuple[str, str], ...]  # (query, alert message), in annotation order, each text once
    clip_only: str | None = None  # where the video is missing: a file of one of its clips that the folder holds
    also: tuple[str, ...] = ()  # other files of the same name, not streamed (full_scale/ and video_540ss/ copies)
    truncate_queries: bool = False  # cut queries over the model's context length (score --truncate-queries)
    images_fps: float | None = None  # where ``video`` is a folder of its frames: the rate they were taken at

    @property
    def frames_folder(self) -> bool:
        return self.video is not None and Path(self.video).is_dir()


@dataclass(frozen=True)
class StepChoice:
    """Which of the bundle's step graphs scores the streams, on which ONNX Runtime device, and with this project's
    kernel library (runtime/fused_ops.py) where given: the same graph, its fused steps one kernel each."""
    precision: str = REFERENCE_PRECISION
    ort_device: str = "cpu"
    ort_ops: str | None = None

    def format(self) -> dict:
        """What a trace's numbers depend on, which one output folder holds one of: the graph and the device. The
        library is not part of it: it runs the same graph, to the graph's own rounding."""
        return {"precision": self.precision, "ort_device": self.ort_device}


@dataclass
class StreamOutcome:
    stream: str
    trace: StreamScores | None  # None when it failed
    frames: int = 0
    seconds: float = 0.0
    error: str | None = None  # one line: what went wrong


def plan_streams(annotations: list[Annotation], videos: Path) -> list[StreamTask]:
    """One task per video of the annotations, its file found by video_uid as the file's stem.

    Never a clip file in its place (named by clip_uid): EgoSDQES times every event from the start of the whole
    video, and a clip starts part-way into it, by an offset the annotations do not hold; streamed as the video,
    every event start was off by it and the scores silently wrong. Such a clip is named in the stream's failure."""
    problem = path_problem(videos, "folder")
    if problem:
        raise UserError(f"video folder {videos} {problem}; give the folder that holds the annotated videos")
    from sdqes_edge.runtime.sources import VIDEO_SUFFIXES  # OpenCV is loaded where videos are looked for

    files: dict[str, Path] = {}
    copies: dict[str, list[str]] = {}  # stem -> the files after the first, in name order
    folders: dict[str, Path] = {}  # video_uid -> a folder of its frames (the authors' code: <uid>/frame_*.jpg)
    uids = {a.video_uid for a in annotations}
    for path in sorted(videos.rglob("*")):
        if path.suffix.lower() in VIDEO_SUFFIXES and path.is_file():
            if path.stem in files:
                copies.setdefault(path.stem, []).append(str(path))
            files.setdefault(path.stem, path)
        elif path.name in uids and path.name not in folders and _holds_images(path):
            folders[path.name] = path
    files = {**{uid: folder for uid, folder in folders.items() if uid not in files}, **files}  # a video first
    tasks = []
    for uid, group in by_video(annotations).items():
        found = files.get(uid)
        clip = None if found else next((files[a.clip_uid] for a in group if a.clip_uid in files), None)
        queries: dict[str, str] = {}
        for a in group:
            queries.setdefault(a.query, a.response)
        tasks.append(StreamTask(uid, str(found) if found else None, tuple(queries.items()),
                                str(clip) if clip else None, tuple(copies.get(uid, ()))))
    if tasks and not any(task.video for task in tasks):  # the wrong folder: one line, not a failure per stream
        raise UserError(_no_video_found(tasks, videos, files))
    return tasks


def _holds_images(folder: Path) -> bool:
    from sdqes_edge.runtime.sources import IMAGE_SUFFIXES

    return folder.is_dir() and any(p.suffix.lower() in IMAGE_SUFFIXES for p in folder.iterdir())


def _no_video_found(tasks: list[StreamTask], videos: Path, files: dict[str, Path]) -> str:
    """Why a video folder holding none of the annotated videos is refused, and which folder to give."""
    from sdqes_edge.runtime.sources import VIDEO_SUFFIXES

    named = f"each named by its video_uid (e.g. {tasks[0].stream}.mp4), in the folder or below it"
    if not files:
        kinds = ", ".join(suffix.lstrip(".") for suffix in VIDEO_SUFFIXES)
        return (f"video folder {videos} holds no video ({kinds}); give the folder of the {len(tasks)} annotated "
                f"videos, {named} (Ego4D: v2/full_scale)")
    clips = [task for task in tasks if task.clip_only]
    if clips:
        return (f"none of the {len(tasks)} annotated videos is in {videos}, only clips of {len(clips)} of them (e.g. "
                f"{Path(clips[0].clip_only).name}, named by clip_uid): a clip starts part-way into its video, and the "
                f"annotations time events from the video's start; give the full-scale videos, {named} "
                "(Ego4D: v2/full_scale)")
    return (f"none of the {len(tasks)} annotated videos is in {videos}, whose {len(files)} video(s) (e.g. "
            f"{next(iter(files.values())).name}) are named otherwise; give the folder of the annotated videos, "
            f"{named} (Ego4D: v2/full_scale)")


def copies_words(tasks: list[StreamTask]) -> str | None:
    """A warning for videos found more than once in the folder (which file each streams is chosen by name), or
    None. Copies of another size or encoding score differently, and which one was streamed went unsaid."""
    doubled = [t for t in tasks if t.video and t.also]
    if not doubled:
        return None
    first = doubled[0]
    return (f"{len(doubled)} annotated video(s) have more than one file in the video folder (e.g. {first.stream}: "
            f"{first.video}, also {', '.join(first.also)}); each is streamed from the first in name order; give "
            "--videos the folder of one copy (Ego4D: v2/full_scale) to choose")


def over_long_queries(tasks: list[StreamTask], tokenizer) -> list[tuple[str, str, int]]:
    """(stream, query, tokens) of each query longer than ``tokenizer``'s context: found before any video is
    streamed, since each would fail its whole video (after loading it), and fail it again on every re-run."""
    counts: dict[str, int] = {}
    found = []
    for task in tasks:
        for text, _ in task.queries:
            if text not in counts:
                counts[text] = tokenizer.count(text)
            if counts[text] > tokenizer.context_length:
                found.append((task.stream, text, counts[text]))
    return found


def trace_path(out: Path, stream: str) -> Path:
    return out / TRACES_FOLDER / f"{stream}{TRACE_SUFFIX}"


SCORED_BY_NAME = "scored_by.json"  # in the output folder: the model its traces come from


def claim_output(out: Path, model_identity: str, fps: float, step: StepChoice = StepChoice(),
                 images_fps: float | None = None) -> None:
    """Tie ``out`` to one model, step graph and device: recorded by the first run, and a re-run with another model,
    frame rate, precision or device refused, since it would skip the streams already scored and report two formats'
    traces as one. A record from before precisions and devices were recorded was written by an fp32 run on the CPU
    (the only one there was). ``images_fps``: the rate of the corpus's folders of frames, where it has some."""
    record = out / SCORED_BY_NAME
    mine = {"model_identity": model_identity, "fps": fps, **step.format(), "images_fps": images_fps}
    if record.is_file():
        try:
            theirs = parse_json(record.read_text())
        except (OSError, ValueError):
            theirs = None
        if isinstance(theirs, dict):
            theirs = {**StepChoice().format(), **theirs}
        if not isinstance(theirs, dict) or {k: theirs.get(k) for k in mine} != mine:
            raise UserError(f"{out} holds traces scored by another model, frame rate, precision or device, or of "
                            f"frames at another --images-fps ({record} says {theirs}); give a new --out, or remove "
                            f"{out} to score it again with this bundle")
        return
    make_folders(out)
    write_text_atomically(record, json.dumps(mine, indent=2) + "\n")


def finished(out: Path, task: StreamTask) -> bool:
    """A trace for this stream is in place and scores exactly its queries (a re-run skips it)."""
    path = trace_path(out, task.stream)
    if not path.is_file():
        return False
    try:
        return load_scores(path).query_texts == [text for text, _ in task.queries]
    except (UserError, OSError, ValueError):
        return False


def missing_video_error(task: StreamTask) -> str:
    """A stream's failure where the video folder lacks its video (one line, as failures.json keeps it)."""
    clip = (f", only {Path(task.clip_only).name}, one of its clips: the annotations time events from the start of the "
            "whole video and a clip starts part-way into it; give the full-scale videos (Ego4D: v2/full_scale)"
            ) if task.clip_only else ""
    return f"no video named {task.stream}.* in the video folder{clip}"


class StreamScorer:
    """One loaded bundle that scores whole streams, one after another; each worker keeps one."""

    def __init__(self, bundle: str | Path, threads: int | None = None, step: StepChoice = StepChoice()):
        from sdqes_edge.runtime.bundle import load_bundle
        from sdqes_edge.runtime.fused_ops import MissingKernelsWarning
        from sdqes_edge.runtime.onnxruntime_backend import SlowPrecisionWarning
        from sdqes_edge.runtime.queries import text_encoder_for
        from sdqes_edge.runtime.step_backends import make_backend

        self.bundle = load_bundle(bundle)
        # A precision slow on its device, a library lacking some of the graph's kernels: said once by the driver
        # (sdqes_edge/cli/score.py), not by every worker.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SlowPrecisionWarning)
            warnings.simplefilter("ignore", MissingKernelsWarning)
            self.backend = make_backend(self.bundle, precision=step.precision, threads=threads,
                                        ort_device=step.ort_device, ort_ops=step.ort_ops)
        self.text_encoder = text_encoder_for(self.bundle, threads=threads)

    def score(self, task: StreamTask) -> StreamOutcome:
        """The stream's trace, as ``sdqes-edge run VIDEO --query ... --scores`` records it; a failure as a line."""
        started = time.perf_counter()
        if task.video is None:
            return StreamOutcome(task.stream, None, error=missing_video_error(task))
        try:
            trace, frames = self._trace(task)
        except Exception as exc:  # noqa: BLE001  (any failure of one video is reported; the rest carry on)
            return StreamOutcome(task.stream, None, error=first_line(exc), seconds=time.perf_counter() - started)
        return StreamOutcome(task.stream, trace, frames, time.perf_counter() - started)

    def _trace(self, task: StreamTask) -> tuple[StreamScores, int]:
        from sdqes_edge.runtime.detector import RunStats, StreamingDetector
        from sdqes_edge.runtime.sinks import ScoreTraceRecorder
        from sdqes_edge.runtime.sources import open_source

        # The scorer's one encoder serves every task; a task says whether its long queries are cut.
        self.text_encoder.on_overflow = "truncate" if task.truncate_queries else "error"
        detector = StreamingDetector(self.bundle, backend_instance=self.backend, text_encoder=self.text_encoder)
        with warnings.catch_warnings():  # the driver said which queries are cut, once (over_long_queries)
            warnings.simplefilter("ignore", QueryTruncatedWarning)
            detector.add_queries([text for text, _ in task.queries], [message for _, message in task.queries])
        source = open_source(task.video, detector.fps, images_fps=task.images_fps if task.frames_folder else None)
        source.log = lambda message: None  # a worker's lines would break the driver's bar; it reports each outcome
        stats = RunStats()
        with scratch(SCRATCH_PREFIX) as folder:
            path = folder / f"{task.stream}{TRACE_SUFFIX}"
            detector.add_sink(ScoreTraceRecorder(path, source.name, detector.fps, model=detector.bundle.model_identity))
            for _ in detector.run([source], stats):
                pass
            shortfall = source.stats.shortfall_words(Path(task.video).name)
            if shortfall:
                raise UserError(shortfall)
            trace = load_scores(path)
        trace.stream = task.stream  # the annotations' name, whatever the file is called
        return trace, stats.frames


# --- where the work runs -----------------------------------------------------------------------------

Report = Callable[[StreamOutcome], None]

_worker_scorer: StreamScorer | None = None  # one per worker process, loaded by the pool's initializer
_worker_load_error: str | None = None  # why it could not be (a GPU session that will not start), said to the driver


def _load_worker(bundle: str, threads: int, step: StepChoice, quiet_opencv: bool) -> None:
    global _worker_scorer, _worker_load_error
    # Ctrl-C reaches the whole process group: the driver alone decides what stops (it ends the pool), so a
    # worker never prints a KeyboardInterrupt traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if quiet_opencv:  # what the parent chose for itself, chosen again in this fresh process
        from sdqes_edge.runtime.sources import quiet_opencv_logs

        quiet_opencv_logs()
    try:
        _worker_scorer = StreamScorer(bundle, threads, step)
    except Exception as exc:  # noqa: BLE001  (raised here: a traceback from every worker and a broken pool that
        _worker_load_error = first_line(exc)  # says not why; kept, the driver says it once as the run's error)


def _score_in_worker(task: StreamTask) -> StreamOutcome:
    if _worker_scorer is None:  # every stream would fail the same way: the run stops, saying why
        raise UserError(f"a worker process could not load the bundle: {_worker_load_error}")
    return _worker_scorer.score(task)


def score_here(tasks: Iterable[StreamTask], bundle: Path, threads: int | None, report: Report,
               step: StepChoice = StepChoice()) -> None:
    """Every stream in this process, one after another (the baseline a pool is measured against)."""
    scorer = StreamScorer(bundle, threads, step)
    for task in tasks:
        report(scorer.score(task))


def score_in_pool(tasks: list[StreamTask], bundle: Path, workers: int, threads: int, report: Report,
                  quiet_opencv: bool = False, step: StepChoice = StepChoice()) -> None:
    """Streams spread over ``workers`` processes, each with one loaded bundle (the ``step`` graph on its device)
    and ``threads`` ORT threads; outcomes reported as they finish. A worker that dies fails the streams it had, not
    the run. ``quiet_opencv``: silence OpenCV's own logs in the workers (``runtime.sources.quiet_opencv_logs``)."""
    context = multiprocessing.get_context("forkserver")  # workers start clean: no threads or sessions inherited
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_load_worker,
                               initargs=(str(bundle), threads, step, quiet_opencv))
    try:
        futures = {pool.submit(_score_in_worker, task): task for task in tasks}  # starts the workers
        for future in as_completed(futures):
            try:
                report(future.result())
            except BrokenProcessPool:
                report(StreamOutcome(futures[future].stream, None, error="its worker process died (out of memory?)"))
    except BaseException:  # the run ends early (Ctrl-C, SIGTERM, a trace it cannot write): nothing in flight is kept
        _end_workers(pool)
        raise
    finally:
        shutdown_cancelling(pool, wait=True)


def _end_workers(pool: ProcessPoolExecutor) -> None:
    """Stop a pool's workers now (SIGTERM), not after the streams they hold: a stopped run must stop promptly
    (``docker stop`` kills it 10 s after asking), and an unfinished stream is scored again on the next run.

    ``ProcessPoolExecutor.terminate_workers`` exists from Python 3.14; before it, the pool's own process table
    (``_processes``, unchanged since 3.2) is the only handle on its workers."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


def save_outcome(out: Path, outcome: StreamOutcome) -> Path | None:
    """A finished stream's trace, written atomically where ``eval --scores OUT/traces`` reads it."""
    if outcome.trace is None:
        return None
    return save_scores(trace_path(out, outcome.stream), outcome.trace)  # its folders made as it is written
