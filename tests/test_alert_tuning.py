"""An alert policy chosen on validation traces: repeats held back, the event still alerted, recorded in the bundle."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sdqes_edge.alert_tuning import choose_policy, score_policy
from sdqes_edge.metrics import ScoreTrace
from sdqes_edge.runtime.alerts import AlertPolicy


def hovering(start: int, length: int = 120, seed: int = 0) -> np.ndarray:
    """Low, then a score that flickers around 0.6 for 30 s from the event start (many rising edges)."""
    rng = np.random.default_rng(seed)
    probs = np.full(length, 0.3)
    probs[start:start + 30] = 0.6 + rng.choice([-0.02, 0.02], 30)
    return probs


def test_hysteresis_or_a_cooldown_is_chosen_where_the_score_flickers_and_the_first_alert_stays():
    traces = [ScoreTrace(hovering(40 + i, seed=i), start_time=40.0 + i, fps=1.0) for i in range(8)]
    plain = score_policy(traces, AlertPolicy(0.6))
    best, sweep = choose_policy(traces, 0.6)
    assert plain.false_alerts > 8 * 5  # the flicker repeats the alert every other frame
    assert best.false_alerts == 0 and best.events_alerted == 100.0
    assert best.first_alert_accuracy == plain.first_alert_accuracy == 100.0
    assert best.exit_threshold is not None or best.cooldown_s > 0
    assert len(sweep) > 1 and best.f1 == max(s.f1 for s in sweep)


def test_a_cooldown_that_would_silence_the_true_alert_after_a_false_one_is_not_chosen():
    probs = np.full(120, 0.3)
    probs[20] = 0.9  # a false alert 30 s before the event
    probs[50:55] = 0.9
    best, _ = choose_policy([ScoreTrace(probs, start_time=50.0, fps=1.0)], 0.6)
    assert best.cooldown_s < 30 and best.events_alerted == 100.0


def test_a_policy_is_scored_on_the_queries_evals_table_scores_over_the_time_they_were_scored():
    """A query asked after its event started is not in eval's table; it had counted as an event never alerted.
    Frames never scored (rows let go while the disk refused them) had counted as minutes without a false alert."""
    probs = np.full(120, 0.3)
    probs[50:55] = 0.9
    alerted = ScoreTrace(probs, start_time=50.0, fps=1.0)
    asked_late = ScoreTrace(np.full(120, 0.3), start_time=50.0, fps=1.0, asked_time=60.0)
    plain = score_policy([alerted, asked_late], AlertPolicy(0.6))
    assert plain.events_alerted == 100.0 and plain.query_minutes == 2.0
    scored = np.ones(120, bool)
    scored[60:] = False  # the second minute never scored
    assert score_policy([ScoreTrace(probs, 50.0, 1.0, scored=scored)], AlertPolicy(0.6)).query_minutes == 1.0


def test_eval_writes_the_policy_into_the_bundle_and_the_runtime_uses_it(tmp_path):
    import subprocess
    import sys

    from conftest import random_model
    from test_evaluation import write_annotations

    from sdqes_edge.export import ExportOptions, export_bundle
    from sdqes_edge.runtime.detector import StreamingDetector
    from sdqes_edge.traces import StreamScores, save_scores

    bundle = tmp_path / "bundle"
    export_bundle(random_model("mlp"), bundle, ExportOptions(show_progress=False, threshold=0.6), log=lambda m: None)
    rows = [(f"v{i}", f"When I start task {i}, remind me.", "task", 40.0 + i) for i in range(6)]
    csv = write_annotations(tmp_path / "a.csv", rows)
    (tmp_path / "traces").mkdir()
    for i, (video, query, _, start) in enumerate(rows):
        probs = hovering(int(start), seed=i)[:, None]
        save_scores(tmp_path / "traces" / f"{video}.npz", StreamScores(video, 1.0, [query], ["0"], np.zeros(1), probs))
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "eval", "--annotations", str(csv), "--scores",
                           str(tmp_path / "traces"), "--calibrate-policy", "--write-threshold", str(bundle),
                           "--plots", "0", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["thresholds"]["default"] == 0.6  # the bundle's threshold is kept
    policy = manifest["thresholds"]["policy"]
    assert "alert policy for" in done.stdout and policy["chosen_on"]["annotations"] == str(csv)
    detector = StreamingDetector(bundle)
    chosen = detector.default_policy()
    assert chosen.cooldown_s == policy["cooldown_s"]
    assert chosen.exit_threshold == (pytest.approx(0.6 - policy["exit_margin"]) if policy["exit_margin"] else None)
    assert detector.default_policy(cooldown_s=0.0, exit_threshold=0.6).cooldown_s == 0.0  # the user's word wins
