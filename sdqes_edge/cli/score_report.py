"""``sdqes-edge score``'s report: SR/SMD of the corpus's finished traces against their annotations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sdqes_edge.cli.common import say, show, warn

if TYPE_CHECKING:  # the corpus module is loaded where the command runs, so that --help stays light
    from sdqes_edge.corpus import StepChoice


def report_scores(out: Path, tasks: list, annotations: list, thresholds: tuple[float, dict[str, float]],
                  step: StepChoice) -> int:
    """SR/SMD of every finished stream's trace against its annotations, at ``thresholds`` (the default, and one
    per label where chosen): printed, and eval.json / eval.md."""
    from sdqes_edge.corpus import trace_path
    from sdqes_edge.evaluation import (
        evaluate_with,
        late_words,
        length_mismatch_words,
        match_traces,
        text_table,
        write_reports,
    )
    from sdqes_edge.traces import load_scores

    traces = [load_scores(trace_path(out, t.stream)) for t in tasks if trace_path(out, t.stream).is_file()]
    matched = match_traces(annotations, traces)
    if mismatch := length_mismatch_words(annotations, traces):
        warn(mismatch)
    if not matched.traces:
        notes = "; and ".join(why for _, why in matched.put_aside_notes())
        say(f"none of the scored streams' annotations can be scored: {notes}" if notes
            else "no stream was scored, so there is nothing to evaluate")
        return 1
    scored = step.precision + ("" if step.ort_device == "cpu" else f" on {step.ort_device}")
    threshold, per_label = thresholds
    labels = [a.label for a in matched.annotations]
    own = sum(label in per_label for label in labels)
    at = f"threshold {threshold:.4f}" + (f", {own} queries at their label's" if own else "")
    rows = {f"{Path(str(out)).name} ({scored}, {at})": evaluate_with(matched.traces, labels, threshold, per_label)}
    print(f"\n{len(matched.annotations)} of {len(annotations)} annotations scored"
          + (f" ({len(matched.missing)} without a trace)" if matched.missing else "") + "\n")
    for count, why in matched.put_aside_notes():
        print(f"note: {count} are not scored: {why}\n")
    print(text_table(rows))
    if late := late_words(next(iter(rows.values()))):
        print(f"note: {late}")
    json_path, md_path = write_reports(out, rows, {"threshold": threshold, "per_label": per_label,
                                                   "precision": step.precision,
                                                   "ort_device": step.ort_device, "streams": len(traces),
                                                   "unscored_annotations": len(matched.missing),
                                                   "annotations_unscored_at_their_start": len(matched.unseen),
                                                   "annotations_unscored_in_their_window": len(matched.cut_short)})
    show(f"\nwrote {len(traces)} traces under {out / 'traces'}, {json_path} and {md_path}")
    return 0
