"""Evaluating score traces against annotations: matching, calibration, per-label thresholds, reports.

numpy only (plots live in ``eval_plots``). The metrics are ``metrics.py``'s.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .annotations import Annotation
from .errors import terminal_safe
from .files import make_folders, write_text_atomically
from .metrics import (
    RECALL_KS,
    SMD_METRIC,
    TOLERANCE_WINDOWS,
    EvalResult,
    ScoreTrace,
    calibrate,
    calibrate_per_metric,
    evaluate,
    frame_at_or_after,
    last_frame_at_or_before,
    min_distance_at,
    predictions,
    window_name,
)
from .traces import StreamScores, query_key

# A label needs this many calibration queries for a threshold of its own; fewer fall back to the global one.
MIN_QUERIES_PER_LABEL = 5
# How far a trace that ran its video to the end may be from the length its annotations give before it is taken for
# another cut of that video: a sample period, 2 s of a container's rounding, or 2% (a re-encode's trimmed frames).
LENGTH_SLACK_S = 2.0
LENGTH_SLACK_FRACTION = 0.02
# The latest an alert counts after an event's start: the end of the widest tolerance window.
LATEST_ALERT_AFTER_S = max(after for _, after in TOLERANCE_WINDOWS)


@dataclass
class Matched:
    annotations: list[Annotation]
    traces: list[ScoreTrace]  # one per annotation, same order
    missing: list[Annotation] = field(default_factory=list)  # annotations no trace scored
    unused_queries: int = 0  # trace columns no annotation asked for
    # Annotations whose trace holds no score at their event's start: it ended before (a run stopped early,
    # --max-frames, a killed run's chunks), the query was removed while the stream ran, or the scores of a stretch
    # were let go while the disk refused them. Nothing could alert on them, and scored as misses they lowered SR and,
    # counted with a short trace's length, lowered SMD too. Put aside and said (``unseen_words``), not scored.
    unseen: list[tuple[Annotation, str]] = field(default_factory=list)  # (annotation, where its scores are missing)
    # Annotations scored at their start whose tolerance window after it runs into frames never scored: a run that
    # stopped before its source's end (the trace says so), a query removed, scores let go. An alert there would have
    # counted; scored as misses, they lowered SR. Put aside too (``cut_short_words``).
    cut_short: list[tuple[Annotation, str]] = field(default_factory=list)

    def put_aside_rows(self) -> dict[str, list[int]]:
        """The annotations not scored, by their row in the annotation file (as ``EvalResult.not_scorable`` names
        them) and why: for a report that says which rows its numbers leave out."""
        return {"without_trace": [a.row for a in self.missing],
                "no_score_at_their_start": [a.row for a, _ in self.unseen],
                "unscored_in_their_window": [a.row for a, _ in self.cut_short]}

    def put_aside_notes(self) -> list[tuple[int, str]]:
        """(how many, why) for each reason annotations with a trace were put aside, not scored."""
        return [(len(found), words(self)) for found, words in ((self.unseen, unseen_words),
                                                                (self.cut_short, cut_short_words)) if found]


def match_traces(annotations: list[Annotation], streams: list[StreamScores]) -> Matched:
    """Pair each annotation with the trace column of its video (stream name) and query text: the columns of one
    text, where it was asked more than once (removed and asked again while the stream ran), as one."""
    columns: dict[tuple[str, str], tuple[StreamScores, list[int]]] = {}
    for s in streams:
        for q, text in enumerate(s.query_texts):
            key = (s.stream, query_key(text))
            if key not in columns or columns[key][0] is not s:  # of two traces of one stream, the later
                columns[key] = (s, [])
            columns[key][1].append(q)
    matched = Matched([], [])
    used = set()
    for a in annotations:
        key = (a.video_uid, query_key(a.query))
        if key not in columns:
            matched.missing.append(a)
            continue
        used.add(key)
        s, asked_as = columns[key]
        column = _one_column(s.probs, asked_as)
        finite = np.isfinite(column)  # NaN: before the query existed, or no score kept
        scored = np.flatnonzero(finite)
        first_scored = int(scored[0]) if len(scored) else len(column)
        start = a.start_frame(s.fps)
        if start >= first_scored and (start >= len(column) or np.isnan(column[start])):
            matched.unseen.append((a, _missing_scores_words(scored, start, s.fps)))
            continue
        # (an event before the first scored frame is put aside by metrics.is_scorable, as asked after it started)
        missing = _unscored_in_window(finite, start, a.start_time, s.fps, s.source_ended) \
            if start >= first_scored else None
        if missing is not None:
            matched.cut_short.append((a, _missing_scores_words(scored, missing, s.fps)))
            continue
        # A stopped run's trace stands for the whole video, the frames after it unscored: a query it never alerted on
        # counts the video's length in SMD, the reference's sequence length, not the shorter run's.
        if s.source_ended is False:
            finite = np.concatenate([finite, np.zeros(max(0, a.stream_frames(s.fps) - len(column)), bool)])
            column = np.concatenate([column, np.full(len(finite) - len(column), np.nan)])
        probs = np.nan_to_num(column, nan=0.0)
        # Scored from its first scored frame, where the trace begins later than the query was asked: a run resumed
        # (--resume) into a new --scores path holds NaN before it, and an event that started there was scored a miss.
        asked = max(a.asked_time, min(float(s.asked_time[q]) for q in asked_as), first_scored / s.fps)
        matched.annotations.append(a)
        matched.traces.append(ScoreTrace(probs, a.start_time, s.fps, asked, query_id=str(a.row),
                                         scored=None if finite.all() else finite))
    matched.unused_queries = len(columns) - len(used)
    return matched


def length_mismatches(annotations: list[Annotation], streams: list[StreamScores]) -> list[tuple[str, float, float]]:
    """(stream, its trace's seconds, its video's per the annotations: video_length / video_fps) for each trace that ran
    its source to the end (``source_ended``) at a length far from its video's: a clip named by the video's uid, or
    another cut of it. EgoSDQES times every event from the whole video's start, so each of its times is wrong."""
    video_seconds = {a.video_uid: a.video_seconds for a in annotations if a.video_seconds > 0}
    found = []
    for s in streams:
        video, traced = video_seconds.get(s.stream), len(s.probs) / s.fps
        if s.source_ended and video and abs(traced - video) > max(LENGTH_SLACK_S, 1.0 / s.fps,
                                                                   LENGTH_SLACK_FRACTION * video):
            found.append((s.stream, traced, video))
    return found


def length_mismatch_words(annotations: list[Annotation], streams: list[StreamScores]) -> str | None:
    """The warning on ``length_mismatches``, naming the first; None where there are none."""
    found = length_mismatches(annotations, streams)
    if not found:
        return None
    stream, traced, video = found[0]
    more = f"; {len(found) - 1} more" if len(found) > 1 else ""
    return (f"{len(found)} score trace(s) ran their video to its end at a length far from the one their annotations "
            f"give ({terminal_safe(stream)}: {traced:g} s, its annotations {video:g} s{more}): a clip or another cut "
            "of the video under its video_uid times every event wrong, since EgoSDQES counts them from the whole "
            "video's start; score the whole video")


def _one_column(probs: np.ndarray, asked_as: list[int]) -> np.ndarray:
    """The scores of one query text over its columns ``asked_as`` [T]: each frame's from the column that has one
    (a query removed at 30 s and asked again at 40 s scored the first 30 s in one column, the rest in another,
    and was matched to the later alone: an event in the first stretch was put aside as asked after it)."""
    column = probs[:, asked_as[0]]
    for q in asked_as[1:]:
        column = np.where(np.isnan(column), probs[:, q], column)
    return column


def _unscored_in_window(finite: np.ndarray, start: int, start_time: float, fps: float,
                        source_ended: bool | None) -> int | None:
    """The first frame after frame ``start`` (an event's, scored) within the widest tolerance window that holds no
    score where the video had one: NaN inside the trace, or past its end where the run stopped before its source's
    end. None if every such frame is scored, or the trace ends with its source (the reference scores a video's
    last seconds so) or does not say."""
    last = last_frame_at_or_before(start_time + LATEST_ALERT_AFTER_S, fps)
    unscored = np.flatnonzero(~finite[start:last + 1])
    if len(unscored):
        return start + int(unscored[0])
    return len(finite) if source_ended is False and last >= len(finite) else None


def _missing_scores_words(scored: np.ndarray, start: int, fps: float) -> str:
    """Where a trace column's scores are missing around frame ``start``: "its scores end at 30 s" or "no scores
    from 120 to 3720 s" (``scored``: the frames that have one, in order)."""
    before, after = scored[scored < start], scored[scored > start]
    end = (int(before[-1]) + 1 if len(before) else 0) / fps
    return f"no scores from {end:g} to {int(after[0]) / fps:g} s" if len(after) else f"its scores end at {end:g} s"


def _first_put_aside(found: list[tuple[Annotation, str]]) -> str:
    """The first of ``found`` (annotation, where its scores are missing) and how many more, as the notes name them."""
    first, where = found[0]
    more = f"; {len(found) - 1} more" if len(found) > 1 else ""
    return f"{terminal_safe(first.video_uid)}: its event at {first.start_time:g} s, {where}{more}"


def unseen_words(matched: Matched) -> str:
    """Why ``matched.unseen`` are not scored, naming the first of them."""
    return (f"their score trace holds no score at their event's start ({_first_put_aside(matched.unseen)}), so no "
            "frame could alert on it; a run stopped early (--max-frames, a stop, a killed run's chunks), a query "
            "removed while the stream ran, or scores let go while the disk refused them leave such frames: score the "
            "whole video for them to count")


def cut_short_words(matched: Matched) -> str:
    """Why ``matched.cut_short`` are not scored, naming the first of them."""
    return (f"their tolerance window runs past where their scores stop ({_first_put_aside(matched.cut_short)}): an "
            f"alert up to {LATEST_ALERT_AFTER_S:g} s after an event's start counts, and none could show after a run "
            "stopped (--max-frames, a stop, a killed run's chunks) or a query was removed; score the whole video for "
            "them to count")


def late_words(result: EvalResult) -> str | None:
    """The note on queries put aside as asked after their event started (``metrics.is_scorable``); None if none."""
    if not result.not_scorable:
        return None
    return (f"{len(result.not_scorable)} of {result.queries + len(result.not_scorable)} queries are not scored: their "
            "event had started before they were asked, or before their trace's first scored frame (a run resumed "
            "into a new --scores path scores from where it resumed)")


def combine(results: list[EvalResult], threshold: float) -> EvalResult:
    """Pool results computed on disjoint query sets (per-label thresholds) into one, weighted by queries."""
    total = sum(r.queries for r in results)
    out = EvalResult(threshold=threshold, queries=total, without_prediction=sum(r.without_prediction for r in results),
                     not_scorable=[q for r in results for q in r.not_scorable])
    weight = [r.queries / max(total, 1) for r in results]
    windows = results[0].recall.keys() if results else []
    out.recall = {w: {k: sum(wt * r.recall[w][k] for wt, r in zip(weight, results)) for k in results[0].recall[w]}
                  for w in windows}
    out.min_distance = {k: sum(wt * r.min_distance[k] for wt, r in zip(weight, results))
                        for k in (results[0].min_distance if results else [])}
    return out


@dataclass
class Calibration:
    threshold: float
    sweep: list[tuple[float, float]]  # (threshold, SR@1) over the candidates
    per_label: dict[str, float] = field(default_factory=dict)
    per_metric: dict[str, float] = field(default_factory=dict)  # the paper's protocol (calibrate_per_metric)

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, "sweep": [[t, sr] for t, sr in self.sweep], "per_label": self.per_label,
                "per_metric": self.per_metric}


def calibrate_thresholds(traces: list[ScoreTrace], labels: list[str], per_label: bool) -> Calibration:
    threshold, sweep = calibrate(traces)  # the first window's: the paper's protocol starts from it
    result = Calibration(threshold, sweep, per_metric=calibrate_per_metric(
        traces, known={window_name(TOLERANCE_WINDOWS[0]): threshold}))
    if per_label:
        groups: dict[str, list[ScoreTrace]] = defaultdict(list)
        for trace, label in zip(traces, labels):
            groups[label].append(trace)
        result.per_label = {label: calibrate(group)[0] for label, group in sorted(groups.items())
                            if len(group) >= MIN_QUERIES_PER_LABEL}
    return result


def evaluate_with(traces: list[ScoreTrace], labels: list[str], threshold: float,
                  per_label: dict[str, float] | None = None) -> EvalResult:
    """SR/SMD at one global threshold, or with a label's own threshold where it has one."""
    if not per_label:
        return evaluate(traces, threshold)
    groups: dict[float, list[ScoreTrace]] = defaultdict(list)
    for trace, label in zip(traces, labels):
        groups[per_label.get(label, threshold)].append(trace)
    return combine([evaluate(group, t) for t, group in groups.items()], threshold)


def per_query_distance(trace: ScoreTrace, threshold: float) -> int:
    """SMD@1 of one query: how far its first alert is from the event start (the trace length if none)."""
    return min_distance_at(predictions(trace, threshold), frame_at_or_after(trace.start_time, trace.fps), 1,
                           trace.length)


# --- reports ----------------------------------------------------------------------------

def _columns() -> list[str]:
    cols = [f"SR@{k} {window_name(w)}" for w in TOLERANCE_WINDOWS for k in RECALL_KS]
    return cols + [f"SMD@{k}" for k in RECALL_KS]


def _row(result: EvalResult) -> list[str]:
    values = [f"{result.recall[window_name(w)][k]:.1f}" for w in TOLERANCE_WINDOWS for k in RECALL_KS]
    return values + [f"{result.min_distance[k]:.1f}" for k in RECALL_KS]


def _threshold_cell(result: EvalResult) -> str:
    return "per metric" if result.metric_thresholds else f"{result.threshold:.4f}"


def metric_threshold_notes(rows: dict[str, EvalResult]) -> list[str]:
    """One line per row whose metrics have thresholds of their own, naming them."""
    return [f"{name}: " + ", ".join(f"{'' if metric == SMD_METRIC else 'SR '}{metric} at threshold {t:.4f}"
                                    for metric, t in r.metric_thresholds.items())
            for name, r in rows.items() if r.metric_thresholds]


def text_table(rows: dict[str, EvalResult]) -> str:
    """The rows for a terminal: a method's name (a folder of traces, someone else's) with its control characters
    shown, not obeyed."""
    head = ["method", "threshold", "queries", "no alert"] + _columns()
    body = [[terminal_safe(name), _threshold_cell(r), str(r.queries), str(r.without_prediction)] + _row(r)
            for name, r in rows.items()]
    widths = [max(len(head[i]), *(len(b[i]) for b in body)) for i in range(len(head))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths)))
              for b in body]
    return "\n".join(lines + [terminal_safe(note) for note in metric_threshold_notes(rows)])


def markdown_table(rows: dict[str, EvalResult]) -> str:
    head = ["method", "threshold", "queries", "no alert"] + _columns()
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows.items():
        lines.append("| " + " | ".join([name, _threshold_cell(r), str(r.queries), str(r.without_prediction)]
                                        + _row(r)) + " |")
    return "\n".join(lines)


REPORT_FILE = "eval.json"  # beside eval.md (and eval's plots/) in the results folder


def write_reports(out_dir: Path, rows: dict[str, EvalResult], extra: dict) -> tuple[Path, Path]:
    make_folders(out_dir)
    json_path, md_path = out_dir / REPORT_FILE, out_dir / "eval.md"
    write_text_atomically(json_path, json.dumps({"results": {n: r.to_dict() for n, r in rows.items()}, **extra},
                                                indent=2))
    notes = [f"- {note}" for note in metric_threshold_notes(rows)]
    notes += [f"- {k}: {v}" for k, v in extra.items() if not isinstance(v, (dict, list))]
    write_text_atomically(md_path, "# SDQES evaluation\n\n" + markdown_table(rows) + "\n\n"
                          "SR@k in percent of queries (tolerance windows in seconds around the event start); "
                          "SMD@k in sampled frames.\n\n" + "\n".join(notes) + "\n")
    return json_path, md_path
