"""``sdqes-edge score``: a bundle over a whole annotated video corpus, then the SR/SMD report, in one command."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sdqes_edge.cli.common import (
    PROG,
    add_subcommand,
    at_least,
    finite_number,
    frames_per_second,
    given_flags,
    path_text,
    say,
    show,
    warn,
)
from sdqes_edge.cli.run_policy import check_threshold
from sdqes_edge.cli.score_report import report_scores
from sdqes_edge.contract import FP16, PRECISIONS, REFERENCE_PRECISION
from sdqes_edge.errors import UserError, install_command
from sdqes_edge.files import make_folders, write_text_atomically
from sdqes_edge.progress import progress_bar
from sdqes_edge.runtime.ort_sessions import DEVICE_PROVIDERS

if TYPE_CHECKING:  # the corpus module is loaded where the command runs, so that --help stays light
    from sdqes_edge.corpus import StepChoice

LOCAL_RAY = "local"  # --ray with no address: start a local Ray instance (or join RAY_ADDRESS)
FAILURES_NAME = "failures.json"


def cmd_score(args: argparse.Namespace) -> int:
    from sdqes_edge.annotations import require_annotations
    from sdqes_edge.corpus import SCORED_BY_NAME, StepChoice, copies_words, plan_streams
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.output_locks import hold, release

    _check_score_args(args)
    bundle = load_bundle(args.bundle)  # a bad bundle is refused before any worker starts
    step = _with_library(bundle, StepChoice(args.precision, args.ort_device), args.ort_ops)
    _check_step(bundle, step)
    annotations = require_annotations(args.annotations, split=args.split or None, source=args.source)
    out = Path(args.out)
    tasks = _with_frame_rate(_checked_query_lengths(plan_streams(annotations, Path(args.videos)), bundle, args),
                             args, bundle.fps)
    _check_query_capacity(tasks, bundle)
    if (copies := copies_words(tasks)) is not None:
        warn(copies)
    if args.bench:
        return _bench(tasks, Path(args.bundle), out, args.precision)
    # One run at a time: a second into the same --out scored every stream the first had not finished again, both
    # writing the same traces and report.
    lock = hold(out / SCORED_BY_NAME, "--out", "a corpus's scores", folder=out)
    try:
        return _score_corpus(args, bundle, step, annotations, tasks, out)
    finally:
        release(lock)


def _score_corpus(args: argparse.Namespace, bundle, step: StepChoice, annotations: list, tasks: list, out: Path) -> int:
    """Score the streams of ``tasks`` not yet scored in ``out``, then the report -> the exit status."""
    from sdqes_edge.corpus import claim_output, finished, missing_video_error

    # Before a trace of another model or format counts as finished.
    claim_output(out, bundle.model_identity, bundle.fps, step, next((t.images_fps for t in tasks if t.frames_folder),
                                                                    None))
    todo = [t for t in tasks if not finished(out, t)]
    absent = [t for t in todo if t.video is None]  # failed here in one line: a failure line each was hundreds
    if absent:
        warn(_absent_words(absent, len(todo), args))
        todo = [t for t in todo if t.video is not None]
    # With --ray: the actors (0: as many as the cluster's CPUs allow) and ORT threads per actor.
    workers, threads = (args.ray_actors or 0, args.threads or 1) if args.ray else _pool_size(args, len(todo))
    where = (f"Ray ({args.ray if args.ray != LOCAL_RAY else 'a local instance'}), {threads} thread(s) per actor"
             if args.ray else f"{workers} worker process(es) x {threads} ONNX Runtime thread(s)")
    where += f", the {step.precision} step graph on {'the CPU' if step.ort_device == 'cpu' else step.ort_device}"
    where += f" with {Path(step.ort_ops).name}'s kernels" if step.ort_ops else ""
    show(f"{len(tasks)} streams ({len(annotations)} queries) in {args.annotations}; "
         f"{len(tasks) - len(todo) - len(absent)} already scored in {out}, {len(todo)} to score with {where}",
         file=sys.stderr)
    failures = [{"stream": t.stream, "error": missing_video_error(t)} for t in absent]
    failures += _score(todo, Path(args.bundle), out, workers, threads, args, step)
    _write_failures(out, failures)
    # As `run` alerts: the bundle's threshold for each query's label where it has one (--threshold: one for all).
    thresholds = ((bundle.default_threshold, bundle.label_thresholds) if args.threshold is None
                  else (args.threshold, {}))
    code = report_scores(out, tasks, annotations, thresholds, step)
    _say_what_the_figures_are_worth(bundle)
    if code == 0:
        show(f"next: {_eval_command(args, out)} --calibrate (a threshold chosen on these streams)")
    if failures:
        without = f", {len(absent)} of them for want of their video" if absent else ""
        say(f"{len(failures)} of {len(tasks)} streams failed{without} (listed above and in {out / FAILURES_NAME}); "
            "re-run the same command to retry them: finished traces are kept")
        return 1
    return code


def _with_frame_rate(tasks: list, args: argparse.Namespace, fps: float) -> list:
    """``tasks`` with --images-fps for the videos kept as folders of frames, where the corpus has any; refused
    without it: taken one image per sample, frames extracted at 2 fps showed a 1-fps model time running twice as
    fast, unsaid."""
    from dataclasses import replace

    folders = [t for t in tasks if t.frames_folder]
    if folders and args.images_fps is None:
        raise UserError(f"{len(folders)} of the {len(tasks)} annotated videos are folders of frames in {args.videos} "
                        f"(e.g. {folders[0].video}): give --images-fps, the rate they were extracted at (the authors' "
                        f"code extracts at 2), so that each is sampled at the bundle's {fps:g} fps by time")
    if args.images_fps is not None and not folders:
        warn("--images-fps is the rate of folders of frames, and every annotated video found is a video file: ignored")
    return [replace(t, images_fps=args.images_fps) for t in tasks] if folders else tasks


def _absent_words(absent: list, count: int, args: argparse.Namespace) -> str:
    """One warning for the streams to score whose video the folder lacks (a corpus partly downloaded)."""
    clips = [t for t in absent if t.clip_only]
    clip_words = (f"; {len(clips)} of them only as a clip (e.g. {Path(clips[0].clip_only).name}), which starts "
                  "part-way into its video, where the annotations time events from its start") if clips else ""
    split = "" if args.split else " (--split picks one split's videos)"
    return (f"{len(absent)} of the {count} annotated videos to score are not in {args.videos} (e.g. "
            f"{absent[0].stream}.*): they are left unscored, each a failure, and a later run scores them once they are "
            f"there{split}{clip_words}")


def _check_score_args(args: argparse.Namespace) -> None:
    """Conflicts resolved with a warning, mistakes refused up front."""
    check_threshold(args.threshold)
    if args.bench:
        given = given_flags(args, "workers", "threads", "ray", "ray_actors", "shared_bundle", "threshold", "ort_device",
                            "ort_ops")
        if given:  # the bench sizes each way of scoring itself, and reports speed, not SR/SMD
            warn(f"--bench scores the corpus each way with sizes of its own for this machine's "
                 f"cores, and reports speed, not SR/SMD: ignoring {', '.join(given)}")
        args.ort_device, args.ort_ops = "cpu", None
        return
    if args.ort_ops and args.ray:  # built for one machine's ONNX Runtime and GPU; the cluster's nodes have their own
        warn("--ort-ops names a kernel library on this machine, which Ray's actors on other nodes may not have: "
             "ignoring it with --ray")
        args.ort_ops = None
    if args.ort_device not in (None, "cpu"):
        from sdqes_edge.package_builds import require_provider

        if args.ray:  # Ray gives an actor that asks for no GPU none (CUDA_VISIBLE_DEVICES empty)
            raise UserError(f"--ray scores on the cluster's CPUs; --ort-device {args.ort_device} runs with the local "
                            "pool on this machine's GPU: leave out one of them")
        require_provider(DEVICE_PROVIDERS[args.ort_device][0])
    args.ort_device = args.ort_device or "cpu"
    if args.ray:
        from sdqes_edge.corpus_ray import require_ray

        require_ray()
        if args.workers is not None:
            warn("--workers is for the local pool; with --ray each actor is one worker "
                 "(--ray-actors sets how many)")
    elif given := given_flags(args, "shared_bundle", "ray_actors"):
        warn(f"{' and '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} with --ray; "
             f"ignoring {'it' if len(given) == 1 else 'them'}")


def _say_what_the_figures_are_worth(bundle) -> None:
    """Beside the report, once, as `run` says them: a preset's random weights, a model of synthetic scenes only."""
    from sdqes_edge.train_options import random_weights_warning, training_data_note

    if random := random_weights_warning(bundle.manifest):
        warn(random)
    if trained_on := training_data_note(bundle.training_record):
        say(f"note: {trained_on}")


def _check_step(bundle, step: StepChoice) -> None:
    """The bundle has the step graph asked for (else one line naming those it has); a graph slow on its device is
    said once here, not by every worker."""
    from sdqes_edge.runtime.onnxruntime_backend import slow_precision_words

    bundle.step_graph(step.precision)
    if step.precision == FP16 and step.ort_device == "cpu":
        warn("the fp16 graph is a GPU format: ONNX Runtime's CPU provider, which scores here, runs most of it in "
             "float32 between Casts it adds, slower than fp32 and not bit for bit what a GPU computes")
    elif (words := slow_precision_words(step.precision, step.ort_device, bundle.root)) is not None:
        warn(words)


def _with_library(bundle, step: StepChoice, library: str | None) -> StepChoice:
    """``step`` with this project's kernel library where given: one that will not load, or cannot run on the device,
    refused in one line before any worker starts; one the graph has no node for (plain ONNX) ignored with a warning,
    and one that lacks some of the graph's kernels (built before them) used with a warning, each said once here, not
    by every worker."""
    from dataclasses import replace

    from sdqes_edge.runtime.fused_ops import idle_library_words, load_fused_ops, missing_kernels_words

    if not library:
        return step
    fused = load_fused_ops(library)
    if (why := fused.usable_on(step.ort_device)) is not None:
        raise UserError(why)
    graph = bundle.step_graph(step.precision)
    if (idle := idle_library_words(fused, bundle.manifest["graphs"]["step"][step.precision].get("operators"),
                                   graph.name)) is not None:
        warn(f"{idle}: ignoring --ort-ops")
        return step
    if (missing := missing_kernels_words(fused, bundle.step_description(step.precision).get("fused_ops"),
                                         graph.name)) is not None:
        warn(missing)
    return replace(step, ort_ops=str(fused.path))


def _check_query_capacity(tasks: list, bundle) -> None:
    """A bundle exported with --fuse-queries scores at most the queries given at export at once: a video asking
    more would fail after loading, and again on every re-run."""
    from sdqes_edge.runtime.queries import fused_capacity_words

    capacity = bundle.manifest.get("query_count")
    busiest = max(tasks, key=lambda task: len(task.queries), default=None)
    if capacity is not None and busiest is not None and len(busiest.queries) > capacity:
        raise UserError(f"{bundle.root} {fused_capacity_words(capacity)}, but {busiest.stream} asks "
                        f"{len(busiest.queries)}; re-export the bundle without --fuse-queries to score this corpus")


def _checked_query_lengths(tasks: list, bundle, args: argparse.Namespace) -> list:
    """The tasks, their queries over the model's context length refused before any video is streamed, or cut with
    a warning under --truncate-queries."""
    from dataclasses import replace

    from sdqes_edge.corpus import over_long_queries
    from sdqes_edge.runtime.queries import text_encoder_for

    tokenizer = text_encoder_for(bundle).tokenizer  # the bundle's, as the workers' detectors read queries
    limit = tokenizer.context_length
    long = over_long_queries(tasks, tokenizer)
    if long:
        stream, text, count = long[0]
        which = (f"{len(long)} annotation quer{'y is' if len(long) == 1 else 'ies are'} over the model's limit of "
                 f"{limit} tokens (e.g. {stream}: {text[:60]!r}... is {count})")
        if not args.truncate_queries:
            raise UserError(f"{which}; shorten {'it' if len(long) == 1 else 'them'} in {args.annotations}, or pass "
                            f"--truncate-queries to cut {'it' if len(long) == 1 else 'them'} to {limit}")
        ends = "its end is" if len(long) == 1 else "their ends are"
        warn(f"{which}: cut to {limit} tokens (--truncate-queries), so {ends} not scored")
    return [replace(t, truncate_queries=True) for t in tasks] if args.truncate_queries else tasks


def _pool_size(args: argparse.Namespace, streams: int) -> tuple[int, int]:
    """(worker processes, ONNX Runtime threads each) of the local pool: at most one worker per core and per stream
    to score, since each holds a loaded bundle (64 workers on 2 cores loaded 64 bundles, 600 MB each at ViT-B/16,
    to take turns on the cores); the cores shared out among the workers unless --threads says."""
    from sdqes_edge.runtime.cores import checked_threads, usable_cores

    cores = usable_cores()
    # On a GPU one worker: its reader and preprocessing threads keep the GPU fed, and each more would hold its own
    # CUDA context and copy of the weights there.
    workers = args.workers or (cores if args.ort_device == "cpu" else 1)
    if workers > cores:
        warn(f"--workers {workers} on {cores} usable core(s): each worker holds a loaded bundle and "
             f"more would only take turns; using {cores}")
        workers = cores
    workers = max(1, min(workers, streams))
    threads = checked_threads(args.threads) or max(1, cores // workers)  # said once here, not by every worker
    if workers * threads > cores:
        warn(f"{workers} workers x {threads} threads is more than the {cores} usable core(s): they "
             "will take turns; lower --threads (default: the cores shared out among the workers)")
    return workers, threads


def _score(todo: list, bundle: Path, out: Path, workers: int, threads: int, args: argparse.Namespace,
           step: StepChoice) -> list:
    """Score the streams where the arguments say; each finished trace saved as it arrives; the failures."""
    from sdqes_edge.corpus import save_outcome, score_here, score_in_pool

    failures = []
    bar = progress_bar(len(todo), "stream", "scoring", enabled=not args.quiet and bool(todo))
    frames, started = 0, time.perf_counter()

    def report(outcome) -> None:
        nonlocal frames
        save_outcome(out, outcome)
        frames += outcome.frames
        if outcome.error:
            failures.append({"stream": outcome.stream, "error": outcome.error})
            say(f"failed: {outcome.stream}: {outcome.error}")
        if bar is not None:
            bar.set_postfix(frames=frames, fps=f"{frames / max(time.perf_counter() - started, 1e-9):.1f}")
            bar.update(1)

    try:
        if not todo:
            pass
        elif args.ray:
            from sdqes_edge.corpus_ray import score_on_ray

            score_on_ray(todo, bundle, threads, report, address=None if args.ray == LOCAL_RAY else args.ray,
                         actors=workers or None, shared_bundle=args.shared_bundle, quiet_opencv=True, step=step)
        elif workers == 1:
            score_here(todo, bundle, threads, report, step)
        else:
            score_in_pool(todo, bundle, min(workers, len(todo)), threads, report, quiet_opencv=True, step=step)
    finally:
        if bar is not None:
            bar.close()
    if todo:
        print(f"scored {len(todo) - len(failures)} of {len(todo)} streams, {frames} frames in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    return failures


def _bench(tasks: list, bundle: Path, out: Path, precision: str) -> int:
    """The corpus scored by one process, the local pool and Ray, side by side: videos per minute."""
    from sdqes_edge.benchmarks.corpus import bench_corpus, markdown
    from sdqes_edge.runtime.cores import usable_cores

    results = bench_corpus(tasks, bundle, usable_cores(), log=lambda message: print(message, file=sys.stderr),
                           precision=precision)
    make_folders(out)
    write_text_atomically(out / "bench.json", json.dumps(results, indent=2) + "\n")
    write_text_atomically(out / "bench.md", markdown(results))
    print(markdown(results))
    show(f"wrote {out / 'bench.json'} and {out / 'bench.md'}")
    return 0


def _eval_command(args: argparse.Namespace, out: Path) -> str:
    """`eval` of these traces against the annotations they were scored for: its split spelled out, since eval's
    default split ('val') is not score's (every split)."""
    selection = ["--split", args.split or ""] + (["--source", args.source] if args.source else [])
    return shlex.join([PROG, "eval", "--annotations", args.annotations, *selection, "--scores", str(out / "traces")])


def _write_failures(out: Path, failures: list[dict]) -> None:
    make_folders(out)
    write_text_atomically(out / FAILURES_NAME, json.dumps(failures, indent=2) + "\n")


def add_parser(sub: argparse._SubParsersAction) -> None:
    score = add_subcommand(
        sub, "score", "score a bundle over an annotated video corpus (every core, or a Ray cluster), then SR/SMD",
        "Find each annotated video in a folder (by video_uid, as the file name without suffix; not a clip of it), "
        "stream it through the bundle with every query the annotations ask of it (one pass through the image "
        "tower per video), write one score trace per stream as `run --scores` does, then report SR@k/SMD@k as "
        "`eval` does. Runs on every core of this machine by default (worker processes, each with one loaded "
        "bundle), or on a Ray cluster with --ray. Finished traces are kept: a re-run scores only what is "
        "missing. A video that fails is named with its error; the others carry on (exit status 1).",
        examples=("sdqes_edge/data/demo_bundle --annotations data/synth/annotations.csv --videos "
                  "data/synth/videos --out runs/score",
                  "bundles/qrnn --annotations egosdqes_all.csv --split val --videos /data/ego4d/v2/full_scale "
                  "--ray auto --shared-bundle"))
    score.add_argument("bundle", type=path_text, help="bundle directory made by `sdqes-edge export`")
    score.add_argument("--annotations", type=path_text,
                       required=True, help="EgoSDQES CSV, or the annotations.csv `synth` writes")
    score.add_argument("--videos", type=path_text, required=True, help="folder of the videos (searched recursively), "
                       "each named by its video_uid, or a folder of its frames of that name (--images-fps)")
    score.add_argument("--images-fps", type=frames_per_second, metavar="FPS",
                       help="where a video is kept as a folder of its frames, named by its video_uid (the authors' "
                            "code: <video_uid>/frame_*.jpg, at 2 fps), the rate they were extracted at; each is "
                            "sampled at the bundle's fps by time, as a video is")
    score.add_argument("--split", default="", help="only this annotation split (default: all)")
    score.add_argument("--source", help="only annotations from this source (moments, nlq, ...)")
    score.add_argument("--out", type=path_text, default="sdqes-score", help="folder for traces/, eval.json, eval.md "
                                                                            "(default %(default)s)")
    score.add_argument("--precision", choices=PRECISIONS, default=REFERENCE_PRECISION,
                       help="step graph to score with, to measure a deployment format's accuracy on the corpus; the "
                            "bundle must have it (default %(default)s; fp16 is a GPU format, slow on a CPU)")
    score.add_argument("--ort-device", choices=list(DEVICE_PROVIDERS),
                       help="ONNX Runtime execution provider (default cpu; cuda/tensorrt need onnxruntime-gpu and "
                            "score with one worker unless --workers says, the state kept on the GPU)")
    score.add_argument("--ort-ops", type=path_text, metavar="LIBRARY",
                       help="this project's ONNX Runtime kernels (sdqes-edge build-ort-ops; nvcc for cuda), in the "
                            "graphs with ONNX Runtime's operators (fp16 by default): each QRNN pooling step and "
                            "each RetNet retention step one kernel")
    score.add_argument("--workers", type=at_least(1), help="worker processes (default: one per core; one on a GPU)")
    score.add_argument("--threads", type=at_least(1), help="ONNX Runtime threads per worker (default: cores / workers)")
    score.add_argument("--threshold", type=finite_number,
                       help="alert threshold of the report, for every query (default: the bundle's, and its "
                       "threshold for a query's label where it has one)")
    score.add_argument("--ray", nargs="?", const=LOCAL_RAY, metavar="ADDRESS",
                       help="run on Ray: no ADDRESS starts a local instance (or joins RAY_ADDRESS), 'auto' joins "
                            "the running cluster, ray://HOST:10001 connects as a client; needs "
                            f"{install_command('ray')}")
    score.add_argument("--ray-actors", type=at_least(1),
                       help="with --ray: actors, each one loaded bundle (default: the cluster's CPUs / --threads)")
    score.add_argument("--shared-bundle", action="store_true",
                       help="with --ray: every node reads the bundle at this path instead of receiving it through "
                            "Ray's object store")
    score.add_argument("--bench", action="store_true",
                       help="instead: score the corpus with one process (all threads), the local pool and Ray "
                            "(when installed), side by side, and report videos per minute (OUT/bench.md)")
    score.add_argument("--truncate-queries", action="store_true",
                       help="cut annotation queries over the bundle's token limit (CLIP's 77; `sdqes-edge inspect` "
                            "says a bundle's); their traces keep the full text, so eval still matches them; "
                            "without it such a query is refused before any video")
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.set_defaults(func=cmd_score, output_dirs=("out",))
