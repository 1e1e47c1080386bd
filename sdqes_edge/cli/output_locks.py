"""The files a command writes, locked for its whole run (the mechanics, and why: ``sdqes_edge.runtime.output_locks``)
before anything is loaded, so that a second run on the same files is refused at once, each refusal naming the option
that gave the file. Refused too, since each destroyed what the user had:
- one file given to two outputs (``--events out.npz --scores out.npz``: the trace replaced the alert log);
- an output that is a file the run reads (``--source clip.mp4 --annotate clip.mp4`` wrote the annotated video over
  the user's own; ``--queries-file q.csv --events q.csv`` appended the alerts to the user's queries);
- an output inside the bundle (``--events bundle/queries.json`` appended the alerts to the bundle's own file).
"""

from __future__ import annotations

from pathlib import Path

from sdqes_edge.errors import UserError
from sdqes_edge.files import through_links
from sdqes_edge.runtime.output_locks import (
    ALERT_LOG,
    ANNOTATED_VIDEO,
    SCORE_TRACE,
    STATE_SNAPSHOT,
    hold,
    release_all,
)

# What each option writes (runtime.output_locks.hold's kind): the lock it shares with the library's sink for it.
KIND_OF_OUTPUT = {"--events": ALERT_LOG, "--scores": SCORE_TRACE, "--annotate": ANNOTATED_VIDEO,
                  "--state": STATE_SNAPSHOT, "--save-state": STATE_SNAPSHOT}
# This command's files: the file -> (the option that gave it, the path as given, what the command does with it).
_CLAIMED: dict[Path, tuple[str, str, str]] = {}
_BUNDLES: dict[Path, str] = {}  # the bundle folders the command reads -> as given: read, never written


def claim_bundle(bundle: str) -> None:
    """A bundle folder the command reads, inside which none of its outputs may be."""
    folder = through_links(bundle)
    if _is(folder, Path.is_dir):
        _BUNDLES[folder] = bundle


def claim_inputs(inputs: dict[str, list[str | None]]) -> None:
    """The files the command reads, by the option that gives them (a video given to --source, a --queries-file),
    which none of its outputs may be."""
    for option, paths in inputs.items():
        for path in filter(None, paths):
            target = through_links(path)
            if _is(target, Path.is_file):
                _CLAIMED.setdefault(target, (option, path, "reads"))


def _is(path: Path, kind) -> bool:
    """``kind(path)`` (Path.is_file, Path.is_dir), False for a path the system refuses to look at (a name past its
    file system's limit): the command refuses that, in its own words, as it opens the path."""
    try:
        return kind(path)
    except OSError:
        return False


def hold_output(output: str | Path, option: str) -> None:
    """Lock ``output`` for the command, refusing a path inside its bundle, a file it reads or a file another of its
    options writes (two links to one file are one file)."""
    target = through_links(output)
    for folder, bundle in _BUNDLES.items():
        if folder == target or folder in target.parents:
            raise UserError(f"{option} {output} is inside the bundle {bundle}, which is read, never written (a "
                            f"re-export replaces it whole); give {option} a path outside it")
    other, given, use = _CLAIMED.setdefault(target, (option, str(output), "writes too"))
    if other != option:
        why = "writing there would damage it" if use == "reads" else "each output needs a file of its own"
        raise UserError(f"{option} {output} is the file {other} {given} {use}: {why}; give {option} another name")
    hold(output, option, KIND_OF_OUTPUT[option])


def release_outputs() -> None:
    """Let go of every output the command held (as it ends, however it ends): free for the next command, in this
    process too."""
    _CLAIMED.clear()
    _BUNDLES.clear()
    release_all()


def hold_run_outputs(args) -> None:
    """``run``'s files, each locked for the run: the alert log, the state snapshot (``--state`` or ``--save-state``,
    by the name it is saved under), the annotated video and a score trace given as one file. A folder of traces,
    and the files of several sources, are locked per source, once the sources are open (``hold_source_outputs``)."""
    from sdqes_edge.runtime.snapshots import snapshot_path
    from sdqes_edge.traces import TRACE_SUFFIX

    claim_bundle(args.bundle)
    claim_inputs({"--source": args.source, "--queries-file": [args.queries_file], "--ort-ops": [args.ort_ops]})
    if args.events:
        hold_output(args.events, "--events")
    if args.state or args.save_state:
        hold_output(snapshot_path(args.state or args.save_state), "--state" if args.state else "--save-state")
    if args.annotate:
        hold_output(args.annotate, "--annotate")
    if args.scores and Path(args.scores).suffix == TRACE_SUFFIX:
        hold_output(args.scores, "--scores")


def hold_source_outputs(trace_paths: list[Path], video_paths: list[Path]) -> None:
    """Each source's own score trace and annotated video, locked for the run (see ``hold_run_outputs``): runs of
    other sources may share a folder of traces, each writing its own, but two runs of one source into it had
    written one trace between them."""
    for path in trace_paths:
        hold_output(path, "--scores")
    for path in video_paths:
        hold_output(path, "--annotate")
