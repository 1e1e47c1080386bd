"""The outputs a command locks for its whole run (the mechanics, and why: ``sdqes_edge.runtime.output_locks``): taken
before anything is loaded, so that a second run on the same files is refused at once, and each refusal names the
option that gave the file. One file given to two options of one run (``--events out.npz --scores out.npz``) is
refused too: the two outputs had written it in turn, the trace replacing the alert log."""

from __future__ import annotations

from pathlib import Path

from sdqes_edge.errors import UserError
from sdqes_edge.files import through_links
from sdqes_edge.runtime.output_locks import hold, release_all

_CLAIMED: dict[Path, tuple[str, str]] = {}  # this command's output files: the file -> (option, the path as given)


def hold_output(output: str | Path, option: str) -> None:
    """Lock ``output`` for the command, refusing a file another option of it writes (two links to one file are one
    file)."""
    target = through_links(output)
    other, given = _CLAIMED.setdefault(target, (option, str(output)))
    if other != option:
        raise UserError(f"{option} {output} is the file {other} {given} writes too: each output needs a file of its "
                        f"own; give {option} another name")
    hold(output, option)


def release_outputs() -> None:
    """Let go of every output the command held (as it ends, however it ends): free for the next command, in this
    process too."""
    _CLAIMED.clear()
    release_all()


def hold_run_outputs(args) -> None:
    """``run``'s files, each locked for the run: the alert log, the state snapshot (``--state`` or ``--save-state``,
    by the name it is saved under), the annotated video and a score trace given as one file. A folder of traces,
    and the files of several sources, are locked per source, once the sources are open (``hold_source_outputs``)."""
    from sdqes_edge.runtime.snapshots import snapshot_path
    from sdqes_edge.traces import TRACE_SUFFIX

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
