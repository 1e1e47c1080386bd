"""``sdqes-edge score``: the annotations' queries are checked against the model's context length before any video
is streamed; a query over it failed its whole video, after loading it, and failed it again on every re-run."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_corpus import cli

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.synthetic import write_dataset
from sdqes_edge.traces import load_scores

LONG_QUERY = "Tell me when " + "the very " * 40 + "red ball starts rolling."  # 90 tokens of the 77 a query may take


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two synthetic streams; the first is also asked one query too long for the model."""
    out = tmp_path_factory.mktemp("corpus")
    write_dataset(out, {"test": [0, 1]}, seconds=20.0, fps=2.0)
    path = out / "annotations.csv"
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows.append({**rows[0], "ann_idx": "99", "query": LONG_QUERY})
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return out


def score(corpus: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli("score", str(DEMO_BUNDLE), "--annotations", str(corpus / "annotations.csv"), "--videos",
               str(corpus / "videos"), "--out", str(out), "--workers", "1", "--quiet", *extra)


def test_a_query_over_the_context_length_is_refused_before_any_video_naming_it_and_the_fix(corpus, tmp_path):
    done = score(corpus, tmp_path / "scored")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"sdqes-edge: error: 1 annotation query is over the model's limit of 77 tokens (e.g. synthetic-000000: "
        f"{LONG_QUERY[:60]!r}... is 90); shorten it in {corpus / 'annotations.csv'}, or pass --truncate-queries to "
        "cut it to 77"]
    assert not (tmp_path / "scored").exists()  # not a trace, not a record of the model


def test_truncate_queries_scores_the_cut_query_as_run_does_under_its_full_text(corpus, tmp_path):
    done = score(corpus, tmp_path / "scored", "--truncate-queries")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [f"sdqes-edge: warning: 1 annotation query is over the model's limit of 77 tokens (e.g. "
                        f"synthetic-000000: {LONG_QUERY[:60]!r}... is 90): cut to 77 tokens (--truncate-queries), "
                        "so its end is not scored"]  # said once by the driver, not again by the worker
    assert "failed" not in done.stderr and "annotations scored" in done.stdout
    trace = load_scores(tmp_path / "scored" / "traces" / "synthetic-000000.npz")
    assert trace.query_texts[-1] == LONG_QUERY  # the annotation's text, so eval matches it

    reference = tmp_path / "run.npz"
    ran = cli("run", str(DEMO_BUNDLE), "--source", str(corpus / "videos" / "synthetic-000000.avi"), "--query",
              LONG_QUERY, "--truncate-queries", "--scores", str(reference), "--threads", "1", "--quiet")
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_allclose(trace.probs[:, -1], load_scores(reference).probs[:, 0], atol=1e-6)
