"""The outputs a command locks for its whole run (the mechanics, and why: ``sdqes_edge.runtime.output_locks``): taken
before anything is loaded, so that a second run on the same files is refused at once, and each refusal names the
option that gave the file."""

from __future__ import annotations

from pathlib import Path

from sdqes_edge.runtime.output_locks import hold


def hold_run_outputs(args) -> None:
    """``run``'s files, each locked for the run: the alert log, the state snapshot (``--state`` or ``--save-state``,
    by the name it is saved under), the annotated video and a score trace given as one file. A folder of traces,
    and the files of several sources, are locked per source, once the sources are open (``hold_source_outputs``)."""
    from sdqes_edge.runtime.snapshots import snapshot_path
    from sdqes_edge.traces import TRACE_SUFFIX

    if args.events:
        hold(args.events, "--events")
    if args.state or args.save_state:
        hold(snapshot_path(args.state or args.save_state), "--state" if args.state else "--save-state")
    if args.annotate:
        hold(args.annotate, "--annotate")
    if args.scores and Path(args.scores).suffix == TRACE_SUFFIX:
        hold(args.scores, "--scores")


def hold_source_outputs(trace_paths: list[Path], video_paths: list[Path]) -> None:
    """Each source's own score trace and annotated video, locked for the run (see ``hold_run_outputs``): runs of
    other sources may share a folder of traces, each writing its own, but two runs of one source into it had
    written one trace between them."""
    for path in trace_paths:
        hold(path, "--scores")
    for path in video_paths:
        hold(path, "--annotate")
