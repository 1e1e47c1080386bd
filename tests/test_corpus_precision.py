"""``sdqes-edge score --precision``: a deployment format's accuracy on a whole corpus. Each stream's trace is the one
``sdqes-edge run --precision`` gives; an output folder holds one format's traces, never two mixed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_corpus import cli

from sdqes_edge.annotations import by_video, load_annotations
from sdqes_edge.contract import FP32, INT8
from sdqes_edge.corpus import SCORED_BY_NAME, claim_output
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.synthetic import write_dataset
from sdqes_edge.traces import load_scores


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    write_dataset(out, {"test": [0, 1]}, seconds=20.0, fps=2.0)
    return out


def score(corpus: Path, out: Path, *extra: str):
    return cli("score", str(DEMO_BUNDLE), "--annotations", str(corpus / "annotations.csv"), "--videos",
               str(corpus / "videos"), "--out", str(out), "--quiet", *extra)


def test_an_int8_score_gives_each_stream_the_trace_run_gives_with_the_int8_graph(corpus, tmp_path):
    done = score(corpus, tmp_path / "int8", "--precision", INT8, "--workers", "2", "--threads", "1")
    assert done.returncode == 0, done.stderr
    assert "the int8 step graph" in done.stderr
    report = json.loads((tmp_path / "int8" / "eval.json").read_text())
    assert "(int8, threshold" in next(iter(report["results"])) and report["precision"] == INT8
    for uid, group in by_video(load_annotations(str(corpus / "annotations.csv"))).items():
        queries = [arg for a in group for arg in ("--query", a.query, "--message", a.response)]
        reference = tmp_path / "run" / f"{uid}.npz"
        ran = cli("run", str(DEMO_BUNDLE), "--source", str(corpus / "videos" / f"{uid}.avi"), *queries,
                  "--scores", str(reference), "--threads", "1", "--quiet", "--precision", INT8)
        assert ran.returncode == 0, ran.stderr
        np.testing.assert_array_equal(load_scores(tmp_path / "int8" / "traces" / f"{uid}.npz").probs,
                                      load_scores(reference).probs, err_msg=uid)
    # The same folder scored again at fp32 would skip every stream and report int8's traces as fp32's.
    again = score(corpus, tmp_path / "int8", "--workers", "1")
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr
    assert "scored by another model, frame rate or precision" in again.stderr and "'precision': 'int8'" in again.stderr


def test_a_precision_the_bundle_lacks_is_refused_before_any_video_is_streamed(corpus, tmp_path):
    done = score(corpus, tmp_path / "out", "--precision", "fp16")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "has no fp16 step graph (it has fp32, int8); re-export with --precision fp16" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_output_folder_scored_before_precisions_were_recorded_is_an_fp32_one(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / SCORED_BY_NAME).write_text(json.dumps({"model_identity": "a" * 64, "fps": 2.0}))  # an earlier version's
    claim_output(out, "a" * 64, 2.0, FP32)  # resumed at fp32: what it was
    with pytest.raises(UserError, match="or precision"):
        claim_output(out, "a" * 64, 2.0, INT8)
