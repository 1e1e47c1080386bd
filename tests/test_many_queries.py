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
from sdqes_edge.errors import UserError
from sdqes_edge.runtime import Sink, StreamingDetector
from sdqes_edge.runtime.queries import TEXT_BATCH, DuplicateQueryWarning

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


# --- the Python API: StreamingDetector.add_queries ---------------------------------------------------------------
class CountedRuns:
    """The text graph's session, its runs counted: how many times the graph ran, whatever it computed."""

    def __init__(self, session):
        self.session, self.runs = session, 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return self.session.run(*args, **kwargs)


def counted(detector: StreamingDetector) -> CountedRuns:
    encoder = detector.queries.encoder
    encoder.session = CountedRuns(encoder.session)  # cached_property: the instance attribute is what encode reads
    return encoder.session


def test_add_queries_adds_what_add_query_adds_one_by_one_encoding_a_batch_to_a_run():
    texts = dataset_queries(2 * TEXT_BATCH + 5)
    messages = [f"alert {i}" if i % 3 else None for i in range(len(texts))]
    many, one_by_one = StreamingDetector(DEMO_BUNDLE), StreamingDetector(DEMO_BUNDLE)
    runs = counted(many)
    added = many.add_queries(texts, messages, threshold=0.7, cooldown_s=5)
    assert runs.runs == 3  # 64 + 64 + 5 texts, where add_query ran the graph once a text
    expected = [one_by_one.add_query(text, message, threshold=0.7, cooldown_s=5)
                for text, message in zip(texts, messages)]
    assert added == expected  # ids q1, q2, ... in order; texts, messages (the text where None) and policy
    assert np.array_equal(many.queries.matrix, one_by_one.queries.matrix)  # each row bit-equal to its text's alone
    assert all(many.streams[0].alerts[q.id].policy == q.policy for q in added)


def test_add_queries_encodes_a_list_longer_than_the_encoders_cache_once():
    texts = dataset_queries(3 * TEXT_BATCH)
    detector = StreamingDetector(DEMO_BUNDLE)
    detector.queries.encoder.cache_size = TEXT_BATCH  # a third of the list
    runs = counted(detector)
    detector.add_queries(texts)
    assert runs.runs == 3
    assert len(detector.queries.queries) == len(texts)


class Told(Sink):
    def __init__(self):
        self.added = []

    def on_query_added(self, query_id, text, added_at):
        self.added.append(query_id)


@pytest.mark.parametrize("texts, messages, refusal", [
    ("Tell me when the lamp turns on.", None, "^add_queries takes a list of query texts, not one string; for one "
                                              "query call add_query$"),
    (["Tell me when the lamp turns on.", "Tell me when the door opens."], ["The lamp is on."],
     "^add_queries was given 2 texts and 1 messages; give one message per text"),
    (["Tell me when the lamp turns on.", "Tell me when the door opens."], ["The lamp is on.", 7],
     "^a query's message is text"),
    (["Tell me when the lamp turns on.", "lamp " * 80], None, "token"),
    (["Tell me when the lamp turns on.", "  "], None, "empty"),
], ids=["one-string", "messages-of-another-count", "a-message-not-text", "a-text-too-long", "an-empty-text"])
def test_add_queries_refuses_the_whole_list_before_adding_any(texts, messages, refusal):
    detector = StreamingDetector(DEMO_BUNDLE)
    sink = detector.add_sink(Told())
    with pytest.raises(UserError, match=refusal):
        detector.add_queries(texts, messages)
    assert detector.queries.queries == {} and detector.streams[0].alerts == {} and sink.added == []
    assert [q.id for q in detector.add_queries(["Tell me when the door opens."])] == ["q1"]


def test_a_warning_of_add_queries_points_at_its_caller():
    detector = StreamingDetector(DEMO_BUNDLE)
    with pytest.warns(DuplicateQueryWarning) as said:
        detector.add_queries(["Tell me when the lamp turns on.", "tell me when the lamp turns ON."])
    assert [Path(w.filename).name for w in said] == [Path(__file__).name]
