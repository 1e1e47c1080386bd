"""A 24/7 camera runs in constant memory: latency statistics and score traces do not grow with the stream."""

from __future__ import annotations

import numpy as np
import pytest

from sdqes_edge.runtime.run_stats import LatencyHistogram
from sdqes_edge.runtime.sinks import ScoreTraceRecorder
from sdqes_edge.traces import chunks_of, load_score_dir, load_scores


def test_latency_percentiles_come_from_a_fixed_size_histogram_within_one_percent():
    latencies = np.random.default_rng(0).lognormal(mean=1.0, sigma=0.8, size=200_000)  # ms, long tail
    histogram = LatencyHistogram()
    size = histogram.counts.nbytes
    for value in latencies:
        histogram.add(float(value))
    assert histogram.counts.nbytes == size  # nothing grows with the number of steps
    assert histogram.count == len(latencies)
    assert histogram.mean_ms == pytest.approx(latencies.mean())
    assert histogram.percentile(0) == latencies.min() and histogram.percentile(100) == latencies.max()
    for q in (50, 90, 99, 99.9):
        assert histogram.percentile(q) == pytest.approx(np.percentile(latencies, q), rel=0.01), q


def feed(recorder: ScoreTraceRecorder, frames: range, probs: np.ndarray, late_query_from: int) -> None:
    for t in frames:
        row = {"early": float(probs[t, 0])}
        if t == late_query_from:
            recorder.on_query_added("late", "when the late thing starts", t / 5.0)
        if t >= late_query_from:
            row["late"] = float(probs[t, 1])
        recorder.on_frame(0, None, t / 5.0, row, [])
        assert len(recorder._rows) < recorder.CHUNK_ROWS  # at most one chunk in memory


def test_a_score_trace_is_flushed_in_chunks_readable_when_the_run_is_killed_and_merged_when_it_ends(tmp_path):
    probs = np.random.default_rng(1).random((2_345, 2)).astype(np.float32)
    path = tmp_path / "scores" / "cam.npz"
    recorder = ScoreTraceRecorder(path, "cam", fps=5.0)
    recorder.CHUNK_ROWS = 100
    recorder.on_query_added("early", "when the early thing starts", 0.0)
    feed(recorder, range(2_345), probs, late_query_from=1_000)

    # Killed here (no close): what eval reads is every flushed chunk, merged.
    assert len(chunks_of(path)) == 23 and not path.exists()
    killed, = load_score_dir(tmp_path / "scores")
    assert killed.probs.shape == (2_300, 2) and killed.query_ids == ["early", "late"]
    np.testing.assert_array_equal(killed.probs[:, 0], probs[:2_300, 0])
    assert np.isnan(killed.probs[:1_000, 1]).all()
    np.testing.assert_array_equal(killed.probs[1_000:, 1], probs[1_000:2_300, 1])

    recorder.close()  # the stream ends: one trace, no chunks left
    assert chunks_of(path) == []
    whole = load_scores(path)
    assert whole.probs.shape == (2_345, 2) and whole.asked_time.tolist() == [0.0, 200.0]
    np.testing.assert_array_equal(whole.probs[:, 0], probs[:, 0])
    np.testing.assert_array_equal(whole.probs[1_000:, 1], probs[1_000:, 1])
    assert [t.stream for t in load_score_dir(tmp_path / "scores")] == ["cam"]


def test_a_missing_chunk_is_named_rather_than_read_as_a_shorter_stream(tmp_path):
    recorder = ScoreTraceRecorder(tmp_path / "cam.npz", "cam", fps=5.0)
    recorder.CHUNK_ROWS = 10
    recorder.on_query_added("q", "when it starts", 0.0)
    feed(recorder, range(35), np.zeros((35, 2), np.float32), late_query_from=99)
    chunks_of(tmp_path / "cam.npz")[1].unlink()
    with pytest.raises(Exception, match="part-000003.npz starts at frame 20.*a chunk of this trace is missing"):
        load_score_dir(tmp_path)
