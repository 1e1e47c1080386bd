"""``sdqes-edge score --ort-ops LIBRARY``: a corpus scored with this project's kernel library, as ``run --ort-ops``
steps a stream. The workers register it in their sessions; the traces are those of the same graph without it, to
the graph's own rounding; a library that cannot serve is refused, or one the graph has no node for ignored, once,
in the driver, before any worker starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import random_model
from test_corpus import cli

from sdqes_edge.corpus import SCORED_BY_NAME
from sdqes_edge.synthetic import write_dataset
from sdqes_edge.traces import load_scores

FPS = 2.0  # the synthetic corpus's sampling, which the bundle is exported at


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    write_dataset(out, {"test": [0, 1]}, seconds=20.0, fps=FPS)
    return out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """tiny + RetNet with fp32 and fp16 graphs: the fp16 graph holds a retention step per adapter."""
    from sdqes_edge.export import ExportOptions, export_bundle

    out = tmp_path_factory.mktemp("bundle") / "retnet"
    export_bundle(random_model("retnet", per_block=2), out,
                  ExportOptions(fps=FPS, precisions=("fp32", "fp16"), drift_frames=16, show_progress=False),
                  log=lambda m: None)
    return out


def score(bundle: Path, corpus: Path, out: Path, *extra: str):
    return cli("score", str(bundle), "--annotations", str(corpus / "annotations.csv"), "--videos",
               str(corpus / "videos"), "--out", str(out), "--quiet", "--workers", "2", "--threads", "1", *extra)


def test_a_corpus_scored_with_the_library_gives_the_traces_of_the_same_graph_without_it(bundle, corpus,
                                                                                        kernel_library, tmp_path):
    fused, inlined = tmp_path / "fused", tmp_path / "inlined"
    done = score(bundle, corpus, fused, "--precision", "fp16", "--ort-ops", str(kernel_library.path))
    assert done.returncode == 0, done.stderr
    assert "the fp16 step graph on the CPU with libsdqes_ort_ops.so's kernels" in done.stderr
    assert score(bundle, corpus, inlined, "--precision", "fp16").returncode == 0
    traces = sorted((inlined / "traces").glob("*.npz"))
    assert len(traces) == 2
    for trace in traces:  # the kernel rounds to fp16 once per element where the body rounds per operator
        np.testing.assert_allclose(load_scores(fused / "traces" / trace.name).probs, load_scores(trace).probs,
                                   atol=2e-3, err_msg=trace.name)
    # The library runs the same graph: a folder scored with it is resumed without it, and the other way round.
    assert json.loads((fused / SCORED_BY_NAME).read_text())["precision"] == "fp16"
    again = score(bundle, corpus, fused, "--precision", "fp16")
    assert again.returncode == 0 and "2 already scored" in again.stderr, again.stderr


def test_a_missing_library_is_refused_in_one_line_before_any_worker_starts(bundle, corpus, tmp_path):
    done = score(bundle, corpus, tmp_path / "out", "--precision", "fp16", "--ort-ops", str(tmp_path / "none.so"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no kernel library at" in done.stderr and "sdqes-edge build-ort-ops" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_plain_graph_is_scored_without_the_library_and_a_warning_says_why(bundle, corpus, kernel_library,
                                                                            tmp_path):
    done = score(bundle, corpus, tmp_path / "out", "--ort-ops", str(kernel_library.path))
    assert done.returncode == 0, done.stderr
    assert "step.fp32.onnx is plain ONNX, which holds none of the operators" in done.stderr
    assert "ignoring --ort-ops" in done.stderr and "kernels" not in done.stderr.split("to score with")[1]


def test_with_ray_the_library_is_ignored_with_a_warning_as_the_cluster_nodes_have_their_own(bundle, kernel_library,
                                                                                           tmp_path):
    """Said up front, before anything else is checked (here the annotations, missing, stop the run next)."""
    done = cli("score", str(bundle), "--annotations", str(tmp_path / "missing.csv"), "--videos", str(tmp_path),
               "--out", str(tmp_path / "out"), "--ray", "--ort-ops", str(kernel_library.path))
    assert done.returncode == 2, done.stderr
    warning, error = done.stderr.strip().splitlines()
    assert "Ray's actors on other nodes may not have: ignoring it with --ray" in warning
    assert "missing.csv" in error


def test_a_library_built_before_an_operator_the_graph_holds_is_named_once_by_the_driver_not_by_each_worker(
        bundle, corpus, kernel_library, tmp_path, monkeypatch, capsys):
    """A first build (QrnnPool and QrnnScan only) with the fp16 RetNet graph: its retention steps run as their
    bodies. The driver says so once, before scoring; the workers' sessions, which would each say it, keep quiet."""
    import dataclasses
    import warnings

    from sdqes_edge.cli import run
    from sdqes_edge.runtime import fused_ops, onnxruntime_backend
    from sdqes_edge.runtime.fused_ops import FIRST_OPERATORS

    first_build = dataclasses.replace(kernel_library, operators=FIRST_OPERATORS)
    for module in (fused_ops, onnxruntime_backend):  # the driver's check and each session's
        monkeypatch.setattr(module, "load_fused_ops", lambda path: first_build)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        code = run(["score", str(bundle), "--annotations", str(corpus / "annotations.csv"), "--videos",
                    str(corpus / "videos"), "--out", str(tmp_path / "out"), "--quiet", "--workers", "1",
                    "--threads", "1", "--precision", "fp16", "--ort-ops", str(kernel_library.path)])
    stderr = capsys.readouterr().err
    assert code == 0, stderr
    named = [line for line in stderr.splitlines() if "has no kernel for RetentionStep" in line]
    assert len(named) == 1 and "step.fp16.onnx holds" in named[0], stderr
    assert "rebuild it with sdqes-edge build-ort-ops" in named[0]
    assert not [w for w in said if "has no kernel for" in str(w.message)]
    assert len(list((tmp_path / "out" / "traces").glob("*.npz"))) == 2  # scored all the same, as the bodies
