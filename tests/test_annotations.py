"""EgoSDQES annotations: loading, grouping, and the oracle / random baselines on the real validation set."""

from __future__ import annotations

import time

import pytest

from sdqes_edge.annotations import by_video, load_annotations, oracle_traces, random_traces
from sdqes_edge.errors import UserError
from sdqes_edge.metrics import calibrate, evaluate


def test_validation_split_has_3029_queries_and_keeps_the_alert_message(egosdqes_csv):
    val = load_annotations(str(egosdqes_csv), split="val")
    assert len(val) == 3029
    assert all(a.response for a in val)
    assert len(load_annotations(str(egosdqes_csv))) == 12_767
    assert {a.source for a in load_annotations(str(egosdqes_csv), source="nlq")} == {"nlq"}
    assert sum(len(v) for v in by_video(val).values()) == 3029


def test_the_oracle_scores_100_and_0_on_all_validation_queries_quickly(egosdqes_csv):
    started = time.perf_counter()
    val = load_annotations(str(egosdqes_csv), split="val")
    result = evaluate(oracle_traces(val, fps=1.0), threshold=0.5)
    elapsed = time.perf_counter() - started
    print(f"\noracle on {result.queries} validation queries: {elapsed:.1f} s")
    assert result.queries == 3029
    assert all(v == 100.0 for by_k in result.recall.values() for v in by_k.values())
    assert all(v == 0.0 for v in result.min_distance.values())


def test_the_random_baseline_is_seeded_and_far_below_the_oracle(egosdqes_csv):
    val = load_annotations(str(egosdqes_csv), split="val")[:300]
    a, b = random_traces(val, seed=3), random_traces(val, seed=3)
    assert all((x.probs == y.probs).all() for x, y in zip(a, b))
    threshold, _ = calibrate(a)
    result = evaluate(a, threshold)
    print(f"\nrandom baseline (300 val queries): threshold {threshold:.3f}, SR@1[-5,+10] "
          f"{result.recall['[-5,+10]'][1]:.1f}, SMD@1 {result.min_distance[1]:.1f}")
    assert result.recall["[-5,+10]"][1] < 50.0


def test_a_missing_or_foreign_csv_is_refused(tmp_path):
    with pytest.raises(UserError, match="annotation file not found"):
        load_annotations(str(tmp_path / "none.csv"))
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="missing column"):
        load_annotations(str(other))
