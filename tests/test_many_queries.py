"""A run asked thousands of queries at once (a queries file of a dataset's: EgoSDQES has 11,828 distinct ones) encodes
them a batch to a run of the text graph, each embedding exactly what the query gets alone, and shows its progress
meanwhile: one run of the text graph a query, and three of ftfy's cleaning, had taken 12 s of the demo's start in
silence, minutes of a ViT-B/16 text tower on a CPU."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

import sdqes_edge.progress
from sdqes_edge.cli import run
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.runtime import StreamingDetector
from sdqes_edge.runtime.queries import TEXT_BATCH

EGOSDQES = Path(__file__).resolve().parents[2] / "shared" / "data" / "egosdqes_all.csv"


def dataset_queries(count: int) -> list[str]:
    """The first ``count`` distinct EgoSDQES queries, real ones of every length."""
    if not EGOSDQES.is_file():
        pytest.skip(f"{EGOSDQES} is not here (../shared beside the checkout)")
    with EGOSDQES.open(newline="") as f:
        return list(dict.fromkeys(row["query"] for row in csv.DictReader(f)))[:count]


def test_queries_encoded_a_batch_at_a_time_are_each_what_the_query_gets_alone():
    texts = dataset_queries(2 * TEXT_BATCH + 5)
    batched, alone = StreamingDetector(DEMO_BUNDLE).queries.encoder, StreamingDetector(DEMO_BUNDLE).queries.encoder
    batched.encode_many(texts + texts[:3])  # a text given twice is encoded once
    assert len(batched._cache) == len(texts)
    for text in texts:
        assert np.array_equal(batched.encode(text), alone.encode(text)), text
    assert len(batched._cache) == len(texts)  # each read back, none encoded again


def test_no_more_are_encoded_ahead_than_the_encoder_keeps():
    encoder = StreamingDetector(DEMO_BUNDLE).queries.encoder
    encoder.cache_size = 10
    texts = dataset_queries(25)
    encoder.encode_many(texts)
    assert list(encoder._cache) == texts[:10]


@pytest.mark.parametrize("quiet", [False, True])
def test_a_run_asked_many_queries_shows_their_encoding_unless_quiet(quiet, tmp_path, monkeypatch, capsys):
    from runtime_fixtures import write_video

    texts = dataset_queries(3 * TEXT_BATCH)
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join(texts) + "\n")
    video = write_video(tmp_path / "clip.avi", np.zeros((4, 48, 64, 3), np.uint8), fps=1.0)
    monkeypatch.setattr(sdqes_edge.progress, "stderr_is_a_terminal", lambda: True)  # tqdm's bar, as a user sees it
    assert run(["run", str(DEMO_BUNDLE), "--source", str(video), "--queries-file", str(queries), "--max-frames", "1",
                "--events", str(tmp_path / "alerts.jsonl"), *(["--quiet"] if quiet else [])]) == 0
    err = capsys.readouterr().err
    assert ("encoding queries" in err) != quiet
    if not quiet:
        assert f"with {len(texts)} queries" in err
