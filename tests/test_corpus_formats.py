"""``sdqes-edge score --precision --ort-device``: a deployment format's accuracy on a whole corpus. Each stream's
trace is the one ``sdqes-edge run`` gives with the same step graph on the same device; an output folder holds one
format's traces, never two mixed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_corpus import cli, score
from test_provider_checks import GPU_RUNS_HERE, needs_a_gpu

from sdqes_edge.annotations import by_video, load_annotations
from sdqes_edge.contract import FP32, INT8
from sdqes_edge.corpus import SCORED_BY_NAME, StepChoice, claim_output
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.synthetic import write_dataset
from sdqes_edge.traces import load_scores


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    write_dataset(out, {"test": [0, 1]}, seconds=20.0, fps=2.0)
    return out


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
    assert "scored by another model, frame rate, precision or device" in again.stderr
    assert "'precision': 'int8'" in again.stderr


def test_a_precision_the_bundle_lacks_is_refused_before_any_video_is_streamed(corpus, tmp_path):
    done = score(corpus, tmp_path / "out", "--precision", "fp16")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "has no fp16 step graph (it has fp32, int8); re-export with --precision fp16" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_output_folder_scored_before_formats_were_recorded_is_an_fp32_one_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / SCORED_BY_NAME).write_text(json.dumps({"model_identity": "a" * 64, "fps": 2.0}))  # an earlier version's
    claim_output(out, "a" * 64, 2.0, StepChoice(FP32, "cpu"))  # resumed as what it was
    for other in (StepChoice(INT8, "cpu"), StepChoice(FP32, "cuda")):
        with pytest.raises(UserError, match="precision or device"):
            claim_output(out, "a" * 64, 2.0, other)


@pytest.mark.skipif(GPU_RUNS_HERE, reason="this machine's onnxruntime has the CUDA provider and a GPU to run it")
def test_the_gpu_asked_of_an_onnx_runtime_without_it_is_refused_before_any_video(corpus, tmp_path):
    done = score(corpus, tmp_path / "out", "--ort-device", "cuda")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no CUDAExecutionProvider" in done.stderr and "or use --ort-device cpu" in done.stderr
    assert not (tmp_path / "out").exists()


def test_ray_with_the_gpu_is_refused_in_one_line_since_ray_hides_gpus_from_actors_that_ask_for_none(corpus,
                                                                                                   tmp_path):
    done = score(corpus, tmp_path / "out", "--ort-device", "cuda", "--ray")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--ray scores on the cluster's CPUs" in done.stderr and "leave out one of them" in done.stderr


@needs_a_gpu
def test_on_a_gpu_a_corpus_scored_there_gives_the_cpus_traces_to_fp32s_rounding(corpus, tmp_path):
    from test_device_step import FP32_ON_A_GPU

    on_gpu, on_cpu = tmp_path / "cuda", tmp_path / "cpu"
    done = score(corpus, on_gpu, "--ort-device", "cuda")
    assert done.returncode == 0, done.stderr
    assert "1 worker process(es)" in done.stderr and "the fp32 step graph on cuda" in done.stderr
    assert "(fp32 on cuda, threshold" in done.stdout
    assert score(corpus, on_cpu, "--workers", "1").returncode == 0
    for trace in sorted((on_cpu / "traces").glob("*.npz")):
        np.testing.assert_allclose(load_scores(on_gpu / "traces" / trace.name).probs, load_scores(trace).probs,
                                   atol=FP32_ON_A_GPU, err_msg=trace.name)


def test_a_step_graph_the_workers_cannot_load_stops_the_run_in_one_line_naming_why(corpus, tmp_path):
    """The bundle checks out in the driver (its files match the manifest), but ONNX Runtime cannot make a session of
    its step graph (here an operator it does not know; on a GPU, a CUDA provider that will not start): every worker
    had printed a traceback and each stream had failed as 'its worker process died (out of memory?)'."""
    import hashlib
    import shutil

    import onnx
    from onnx import helper

    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO_BUNDLE, bundle)
    graph_path = bundle / "step.fp32.onnx"
    graph = onnx.load(str(graph_path))
    graph.graph.node.append(helper.make_node("NoSuchOp", [graph.graph.input[0].name], ["unused"],
                                             domain="org.example"))
    graph.opset_import.append(helper.make_opsetid("org.example", 1))
    onnx.save(graph, str(graph_path))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["step.fp32.onnx"]["sha256"] = hashlib.sha256(graph_path.read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    done = cli("score", str(bundle), "--annotations", str(corpus / "annotations.csv"), "--videos",
               str(corpus / "videos"), "--out", str(tmp_path / "out"), "--quiet", "--workers", "2", "--threads", "1")
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("sdqes-edge: ")]
    assert len(errors) == 1 and "a worker process could not load the bundle" in errors[0] and "NoSuchOp" in errors[0]
    assert "Traceback" not in done.stderr
