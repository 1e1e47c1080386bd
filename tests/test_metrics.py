"""SR@k and SMD@k as the paper and the reference code define them: hand-worked cases and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdqes_edge.metrics import (
    ScoreTrace,
    calibrate,
    calibrate_per_metric,
    evaluate,
    evaluate_per_metric,
    first_reach_distance,
    frame_at_or_after,
    min_distance_at,
    predictions,
    rising_edges,
    tolerance_mask,
)

W = "[-5,+10]"


def trace(probs, start, **kw) -> ScoreTrace:
    return ScoreTrace(np.asarray(probs, dtype=float), start_time=start, **kw)


def test_a_run_above_threshold_on_frame_0_is_a_start_at_frame_0():
    assert rising_edges(np.array([0.9, 0.9, 0.1, 0.8]), 0.5).tolist() == [0, 3]


def test_equal_to_threshold_is_not_above_it():
    assert rising_edges(np.array([0.5, 0.5, 0.6]), 0.5).tolist() == [2]


def test_the_threshold_is_compared_in_float32_as_the_reference_does():
    """torch casts the threshold to the scores' float32: p == float32(0.3) is not above a 0.3 threshold."""
    probs = [0.1, 0.1, float(np.float32(0.3)), 0.1, 0.9, 0.1]
    assert rising_edges(np.array(probs), 0.3).tolist() == [4]
    assert evaluate([trace(probs, start=4.0)], threshold=0.3).min_distance[1] == 0.0  # the reference's SMD@1


def test_no_prediction_counts_the_full_length_and_no_recall():
    r = evaluate([trace([0.1] * 30, start=12.0)], threshold=0.5)
    assert r.recall[W] == {1: 0.0, 2: 0.0, 3: 0.0}
    assert r.min_distance == {1: 30.0, 2: 30.0, 3: 30.0}
    assert r.without_prediction == 1


def test_prediction_on_frame_0_far_from_the_start():
    probs = [0.9] + [0.1] * 29  # start at 0; ground truth at 20 -> 20 frames away, outside [-5, +10]
    r = evaluate([trace(probs, start=20.0)], threshold=0.5)
    assert r.recall[W][1] == 0.0 and r.min_distance[1] == 20.0


@pytest.mark.parametrize("frame, recalled", [(15, True), (14, False), (30, True), (31, False)])
def test_a_prediction_exactly_on_a_window_edge_counts(frame, recalled):
    """Ground truth at t=20 s, 1 fps: the window [-5, +10] is frames 15..30 inclusive."""
    probs = np.full(40, 0.1)
    probs[frame] = 0.9
    r = evaluate([trace(probs, start=20.0)], threshold=0.5)
    assert (r.recall[W][1] == 100.0) == recalled
    assert r.min_distance[1] == abs(frame - 20)


def test_only_the_first_k_predictions_count():
    """Starts at 2, 6, 10, 21: the fourth is the only one in the window."""
    probs = np.full(40, 0.1)
    probs[[2, 6, 10, 21]] = 0.9
    r = evaluate([trace(probs, start=21.0)], threshold=0.5, windows=((2.0, 5.0),))
    assert r.recall["[-2,+5]"] == {1: 0.0, 2: 0.0, 3: 0.0}
    assert r.min_distance == {1: 19.0, 2: 15.0, 3: 11.0}
    r4 = evaluate([trace(probs, start=21.0)], threshold=0.5, ks=(4,), windows=((2.0, 5.0),))
    assert r4.recall["[-2,+5]"][4] == 100.0 and r4.min_distance[4] == 0.0


def test_an_empty_trace_has_no_prediction_and_distance_zero_length():
    r = evaluate([trace([], start=0.0)], threshold=0.5)
    assert r.recall[W][1] == 0.0 and r.min_distance[1] == 0.0 and r.without_prediction == 1


def test_the_ground_truth_frame_is_the_first_sampled_frame_at_or_after_the_start():
    assert frame_at_or_after(20.0, 1.0) == 20
    assert frame_at_or_after(20.2, 1.0) == 21
    assert frame_at_or_after(10.1, 2.0) == 21  # 2 fps: frame 21 is t = 10.5 s
    mask = tolerance_mask(40, start_time=20.2, fps=1.0, before_s=0.0, after_s=0.5)
    assert np.flatnonzero(mask).tolist() == [21]  # no frame lies in [20.2, 20.7]; the start frame is kept


def test_windows_are_converted_from_seconds_at_the_traces_fps():
    mask = tolerance_mask(100, start_time=20.0, fps=2.0, before_s=5.0, after_s=10.0)
    assert np.flatnonzero(mask).tolist() == list(range(30, 61))


def test_predictions_before_the_query_was_asked_do_not_exist():
    probs = np.full(40, 0.1)
    probs[3:6] = 0.9
    probs[25:28] = 0.9
    t = trace(probs, start=25.0, asked_time=4.0)
    # at frame 4 the run is already above threshold: it counts as a start the moment the query exists
    assert predictions(t, 0.5).tolist() == [4, 25]


def test_a_query_asked_after_its_event_started_is_reported_not_scored():
    late = trace(np.full(40, 0.9), start=10.0, asked_time=15.0, query_id="late")
    ok = trace(np.full(40, 0.1), start=10.0, query_id="ok")
    r = evaluate([late, ok], threshold=0.5)
    assert r.queries == 1 and r.not_scorable == ["late"]


def test_calibration_finds_the_known_best_threshold():
    """Each trace peaks at the start (0.8) and has a decoy bump earlier (0.6): only thresholds in
    [0.6, 0.8) keep the decoy out and the true start in, and the lowest such candidate is chosen."""
    traces = []
    for start in (20, 25, 30):
        probs = np.full(50, 0.0)
        probs[start - 12] = 0.6
        probs[start:start + 3] = 0.8
        probs[0] = 1.0 if start == 20 else 0.0  # stretches the candidate range to [0, 1]
        traces.append(trace(probs, start=float(start)))
    best, sweep = calibrate(traces)
    assert len(sweep) == 20
    candidates = np.linspace(0.0, 1.0, 20)
    expected = candidates[(candidates >= 0.6) & (candidates < 0.8)].min()
    assert best == pytest.approx(expected)


probability_traces = st.lists(st.floats(0, 1), min_size=1, max_size=40).map(np.array)


@settings(max_examples=150, deadline=None)
@given(probs=probability_traces, start=st.integers(0, 45), threshold=st.floats(0.05, 0.95))
def test_recall_never_decreases_as_k_or_the_tolerances_grow(probs, start, threshold):
    t = trace(probs, start=float(start))
    small = evaluate([t], threshold, windows=((2.0, 5.0),)).recall["[-2,+5]"]
    large = evaluate([t], threshold, windows=((5.0, 10.0),)).recall[W]
    assert small[1] <= small[2] <= small[3]
    assert all(small[k] <= large[k] for k in (1, 2, 3))


@settings(max_examples=150, deadline=None)
@given(probs=probability_traces, start=st.integers(0, 45), threshold=st.floats(0.05, 0.95))
def test_min_distance_never_increases_as_k_grows(probs, start, threshold):
    d = evaluate([trace(probs, start=float(start))], threshold).min_distance
    assert d[1] >= d[2] >= d[3]


@settings(max_examples=150, deadline=None)
@given(probs=probability_traces, start=st.integers(0, 45), shift=st.integers(0, 10),
       threshold=st.floats(0.05, 0.95))
def test_shifting_a_trace_by_d_frames_moves_each_distance_by_at_most_d(probs, start, shift, threshold):
    """Delaying the scores by d frames (padding with sub-threshold values) changes the distance by <= d."""
    shifted = np.concatenate((np.zeros(shift), probs))  # zeros never exceed the threshold
    original_preds, shifted_preds = rising_edges(probs, threshold), rising_edges(shifted, threshold)
    assert (shifted_preds == original_preds + shift).all()
    for k in (1, 2, 3):
        a = min_distance_at(original_preds, start, k, len(shifted))
        b = min_distance_at(shifted_preds, start, k, len(shifted))
        assert abs(a - b) <= shift


def test_a_query_whose_scores_never_reach_the_threshold_is_as_far_as_its_start_frame_for_the_smd_choice():
    """The reference takes argmax over an all-False row: frame 0, so the distance is the start frame's."""
    assert first_reach_distance(trace([0.1] * 30, start=12.0), 0.5) == 12
    assert first_reach_distance(trace([0.1] * 5 + [0.5] + [0.1] * 24, start=12.0), 0.5) == 7  # >=, not >


def reference_protocol(probs: np.ndarray, starts: np.ndarray) -> tuple[dict, dict]:
    """The reference's validation protocol over a batch of equal-length traces at 1 fps, written the way its
    tensor code computes it (``on_validation_epoch_end``): -> (window -> SR@1..3 at that window's best-SR@1
    threshold, k -> SMD@k at the threshold of the smallest mean first-reach distance)."""
    length = probs.shape[1]
    frames = np.arange(length)
    candidates = np.linspace(probs.min(), probs.max(), 20)

    def starts_indexed(threshold):  # rising edges numbered 1, 2, ... along each row, 0 elsewhere
        above = probs.astype(np.float32) > np.float32(threshold)
        edges = above & ~np.concatenate([np.zeros((len(probs), 1), bool), above[:, :-1]], axis=1)
        return edges * np.cumsum(edges, axis=1), edges

    recall = {}
    for before, after in ((5.0, 10.0), (2.0, 5.0)):
        window = (frames[None] >= starts[:, None] - before) & (frames[None] <= starts[:, None] + after)
        def sr(threshold, k):
            numbered = starts_indexed(threshold)[0] * window
            return 100.0 * ((numbered <= k) & (numbered != 0)).any(axis=1).mean()
        best = max(candidates, key=lambda t: sr(t, 1))  # the first of equals: the lowest
        recall[f"[-{before:g},+{after:g}]"] = {k: sr(best, k) for k in (1, 2, 3)}
    gt = starts.astype(int)
    first_reach = lambda t: np.abs(np.argmax(probs.astype(np.float32) >= np.float32(t), axis=1) - gt).mean()  # noqa: E731
    best = min(candidates, key=first_reach)
    numbered, edges = starts_indexed(best)
    distance = np.abs(frames[None] - gt[:, None])
    smd = {}
    for k in (1, 2, 3):
        first_k = (numbered <= k) & edges
        smd[k] = float(np.where(first_k, distance, length).min(axis=1).mean())
    return recall, smd


@pytest.mark.parametrize("seed", range(12))
def test_per_metric_thresholds_give_the_numbers_the_reference_reports(seed):
    """The reference reports each window's SR at that window's own best-SR@1 threshold and SMD at the threshold
    of the smallest mean first-reach distance; a single calibrated threshold for every column gave other
    [-2,+5] and SMD numbers than the paper's protocol."""
    rng = np.random.default_rng(seed)
    probs = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9], size=(8, 40), p=[0.4, 0.25, 0.15, 0.1, 0.1])
    starts = rng.integers(0, 40, size=8).astype(float)
    traces = [trace(row, start=s) for row, s in zip(probs, starts)]
    result = evaluate_per_metric(traces, calibrate_per_metric(traces))
    recall, smd = reference_protocol(probs, starts)
    assert {w: result.recall[w] for w in recall} == recall  # sums of whole queries over 8: exact in floats
    assert result.min_distance == pytest.approx(smd)
