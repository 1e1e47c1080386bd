"""Streaming Recall (SR@k) and Streaming Minimum Distance (SMD@k), numpy only.

Conventions of the paper and the reference code (DESIGN.md section 4):
- a prediction is a rising edge of ``p > threshold`` (strictly greater); a run
  already above threshold on the first frame is a start at frame 0;
- the ground-truth start frame is the first sampled frame at or after the
  annotated start time;
- SR@k[a, l]: recalled if any of the first k predictions lies in the tolerance
  window, the sampled frames whose time is in ``[t_s - a, t_s + l]`` (inclusive,
  and always holding the ground-truth start frame);
- SMD@k: the smallest ``|t_gt - t|`` over the first k predictions, in sampled
  frames; a query with no prediction counts the full trace length;
- calibrated, each metric at its own threshold among the same 20 candidates
  (``calibrate_per_metric``): a window's SR at that window's best SR@1, SMD at
  the smallest mean distance of the first frame with ``p >= threshold``.

A query may be asked during the stream (``asked_time``): frames before it have
no predictions, and a query asked after its event started is reported, not scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

RECALL_KS = (1, 2, 3)
# (seconds before, seconds after) the ground-truth start: the paper's two tolerance windows.
TOLERANCE_WINDOWS = ((5.0, 10.0), (2.0, 5.0))
THRESHOLD_CANDIDATES = 20  # the paper's sweep: evenly spaced between the lowest and highest probability
SMD_METRIC = "SMD"  # the key of SMD's threshold among the per-metric thresholds (beside the window names)
_TIME_EPS = 1e-9  # float slack when a time falls exactly on a sampled frame


@dataclass
class ScoreTrace:
    """One query's probabilities over one stream, sampled at ``fps`` from time 0."""

    probs: np.ndarray  # [T] probabilities (sigmoid of the cosine)
    start_time: float  # annotated event start, seconds from the trace's first frame
    fps: float = 1.0
    asked_time: float = 0.0  # when the query was issued, seconds from the first frame
    query_id: str = ""
    # [T] bool: the frames that were scored, where some were not (a runtime trace's NaN, given to ``probs`` as 0);
    # None: every frame. The threshold candidates span the probabilities observed, not the zeros standing in.
    scored: np.ndarray | None = None

    @property
    def length(self) -> int:
        return int(len(self.probs))


def above_threshold(probs, threshold: float):
    """``probs > threshold`` compared in float32, as the reference does (torch casts the threshold to the
    scores' float32): a probability of exactly float32(threshold) is not above it."""
    return np.asarray(probs, dtype=np.float32) > np.float32(threshold)


def rising_edge_mask(probs: np.ndarray, threshold: float) -> np.ndarray:
    """probs [T, ...] -> bool [T, ...]: True where ``probs > threshold`` starts a run along axis 0
    (frame 0 counts if already above)."""
    above = above_threshold(probs, threshold)
    previous = np.concatenate([np.zeros_like(above[:1]), above[:-1]], axis=0)
    return above & ~previous


def rising_edges(probs: np.ndarray, threshold: float) -> np.ndarray:
    """Frame indices where ``probs > threshold`` starts a run (frame 0 counts if already above)."""
    return np.flatnonzero(rising_edge_mask(probs, threshold))


def frame_at_or_after(time_s: float, fps: float) -> int:
    """The first sampled frame whose time is at or after ``time_s``."""
    return max(0, math.ceil(time_s * fps - _TIME_EPS))


def last_frame_at_or_before(time_s: float, fps: float) -> int:
    """The last sampled frame whose time is at or before ``time_s`` (a tolerance window's last frame)."""
    return math.floor(time_s * fps + _TIME_EPS)


def tolerance_mask(length: int, start_time: float, fps: float, before_s: float, after_s: float) -> np.ndarray:
    """Frames whose time lies in [start - before, start + after], plus the ground-truth start frame."""
    times = np.arange(length) / fps
    mask = (times >= start_time - before_s - _TIME_EPS) & (times <= start_time + after_s + _TIME_EPS)
    gt = frame_at_or_after(start_time, fps)
    if gt < length:
        mask[gt] = True
    return mask


def predictions(trace: ScoreTrace, threshold: float) -> np.ndarray:
    """Rising edges from the moment the query was asked (a query cannot fire before it exists)."""
    asked = frame_at_or_after(trace.asked_time, trace.fps)
    return asked + rising_edges(trace.probs[asked:], threshold)


def is_scorable(trace: ScoreTrace) -> bool:
    """False for a query asked after its event had started: there is nothing left to detect."""
    return frame_at_or_after(trace.asked_time, trace.fps) <= frame_at_or_after(trace.start_time, trace.fps)


def recalled_at(preds: np.ndarray, mask: np.ndarray, k: int) -> bool:
    first = preds[:k]
    return bool(mask[first].any()) if len(first) else False


def min_distance_at(preds: np.ndarray, gt_frame: int, k: int, length: int) -> int:
    first = preds[:k]
    return int(np.abs(first - gt_frame).min()) if len(first) else length


def window_name(window: tuple[float, float]) -> str:
    return f"[-{window[0]:g},+{window[1]:g}]"


@dataclass
class EvalResult:
    threshold: float
    queries: int  # scored
    without_prediction: int
    not_scorable: list[str] = field(default_factory=list)  # asked after their event started
    recall: dict[str, dict[int, float]] = field(default_factory=dict)  # window -> k -> SR@k in percent
    min_distance: dict[int, float] = field(default_factory=dict)  # k -> SMD@k in frames
    # Where each metric has its own threshold (``evaluate_per_metric``): window name or "SMD" -> threshold.
    # Empty: every number is at ``threshold``.
    metric_thresholds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {"threshold": self.threshold, "queries": self.queries, "without_prediction": self.without_prediction,
               "not_scorable": self.not_scorable,
               "recall": {w: {str(k): v for k, v in by_k.items()} for w, by_k in self.recall.items()},
               "min_distance": {str(k): v for k, v in self.min_distance.items()}}
        if self.metric_thresholds:
            out["metric_thresholds"] = self.metric_thresholds
        return out


def evaluate(traces: list[ScoreTrace], threshold: float, ks=RECALL_KS, windows=TOLERANCE_WINDOWS) -> EvalResult:
    scored = [t for t in traces if is_scorable(t)]
    result = EvalResult(threshold=float(threshold), queries=len(scored), without_prediction=0,
                        not_scorable=[t.query_id for t in traces if not is_scorable(t)])
    hits = {window_name(w): {k: 0 for k in ks} for w in windows}
    distances = {k: 0 for k in ks}
    for trace in scored:
        preds = predictions(trace, threshold)
        result.without_prediction += len(preds) == 0
        gt = frame_at_or_after(trace.start_time, trace.fps)
        for w in windows:
            mask = tolerance_mask(trace.length, trace.start_time, trace.fps, *w)
            for k in ks:
                hits[window_name(w)][k] += recalled_at(preds, mask, k)
        for k in ks:
            distances[k] += min_distance_at(preds, gt, k, trace.length)
    n = max(len(scored), 1)
    result.recall = {w: {k: 100.0 * v / n for k, v in by_k.items()} for w, by_k in hits.items()}
    result.min_distance = {k: v / n for k, v in distances.items()}
    return result


def threshold_candidates(traces: list[ScoreTrace], count: int = THRESHOLD_CANDIDATES) -> np.ndarray:
    """``count`` thresholds evenly spaced between the lowest and highest probability observed (unscored frames
    aside: their zeros had spread the sweep over [0, 0.27), where no sigmoid(cos) lies, halving its resolution)."""
    values = [np.asarray(t.probs if t.scored is None else t.probs[t.scored], dtype=np.float64) for t in traces]
    values = np.concatenate(values) if traces else np.zeros(1)
    values = values if len(values) else np.zeros(1)
    return np.linspace(values.min(), values.max(), count)


def calibrate(traces: list[ScoreTrace], count: int = THRESHOLD_CANDIDATES,
              window: tuple[float, float] = TOLERANCE_WINDOWS[0]) -> tuple[float, list[tuple[float, float]]]:
    """The candidate threshold with the best SR@1 (ties: the lowest), and the whole sweep (threshold, SR@1)."""
    sweep = []
    for threshold in threshold_candidates(traces, count):
        sr1 = evaluate(traces, float(threshold), ks=(1,), windows=(window,)).recall[window_name(window)][1]
        sweep.append((float(threshold), sr1))
    best = max(sweep, key=lambda item: (item[1], -item[0]))
    return best[0], sweep


def first_reach_distance(trace: ScoreTrace, threshold: float) -> int:
    """The reference's criterion for SMD's threshold (``abs_dist`` of ``get_distances``): how many frames the first
    frame with ``p >= threshold`` lies from the ground-truth start frame. Where no frame reaches the threshold the
    reference's argmax over an all-False row gives the first frame, and so does this (the frame the query was
    asked: none before it counts)."""
    asked = frame_at_or_after(trace.asked_time, trace.fps)
    reached = np.asarray(trace.probs[asked:], dtype=np.float32) >= np.float32(threshold)
    return abs(asked + int(np.argmax(reached)) - frame_at_or_after(trace.start_time, trace.fps))


def calibrate_per_metric(traces: list[ScoreTrace], count: int = THRESHOLD_CANDIDATES,
                         known: dict[str, float] | None = None) -> dict[str, float]:
    """The thresholds of the paper's protocol, each among the same candidates (ties: the lowest): per tolerance
    window, the best SR@1 in that window; for SMD, the smallest mean ``first_reach_distance``. Window name or
    ``SMD_METRIC`` -> threshold. ``known``: windows whose threshold the caller has already calibrated."""
    chosen = dict(known or {})
    for window in TOLERANCE_WINDOWS:
        if window_name(window) not in chosen:
            chosen[window_name(window)] = calibrate(traces, count, window)[0]
    scored = [t for t in traces if is_scorable(t)]
    candidates = [float(c) for c in threshold_candidates(traces, count)]
    mean_distance = [np.mean([first_reach_distance(t, c) for t in scored]) if scored else 0.0 for c in candidates]
    chosen[SMD_METRIC] = candidates[int(np.argmin(mean_distance))]  # argmin: the first of equals, the lowest
    return chosen


def evaluate_per_metric(traces: list[ScoreTrace], thresholds: dict[str, float]) -> EvalResult:
    """SR@k of each window at its own threshold and SMD@k at SMD's, as the reference reports them; the queries
    without a prediction are counted at the first window's threshold."""
    first = window_name(TOLERANCE_WINDOWS[0])
    result = evaluate(traces, thresholds[first], windows=TOLERANCE_WINDOWS[:1])
    for window in TOLERANCE_WINDOWS[1:]:
        result.recall.update(evaluate(traces, thresholds[window_name(window)], windows=(window,)).recall)
    result.min_distance = evaluate(traces, thresholds[SMD_METRIC], windows=()).min_distance
    result.metric_thresholds = dict(thresholds)
    return result
