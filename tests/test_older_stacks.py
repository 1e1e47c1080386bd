"""Devices carry older libraries than a workstation (a Jetson's ONNX Runtime build, an OpenCV made for its numpy):
bundles and the runtime must work with the oldest releases pyproject.toml accepts (ONNX Runtime 1.17, OpenCV 4.8).

What those releases lacked was found by running the demo, `run` and `inspect` on Python 3.10 with numpy 1.24.4,
onnxruntime 1.17.0-1.18.0 and opencv-python-headless 4.8.0.76. These tests hold what can be checked on this
machine's newer releases: the graphs use nothing the old ones lack, and the runtime's workarounds switch on for
them and only for them.
"""

from __future__ import annotations

import enum

import numpy as np
import onnx
import pytest
from conftest import random_model

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import SetupWarning, UserError
from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.runtime.ort_releases import cuda_options, onnxruntime_release
from sdqes_edge.runtime.ort_sessions import create_session, load_refusal, session_options


@pytest.fixture(scope="module")
def every_graph(tmp_path_factory) -> list:
    """Every graph of a fresh export in every precision, and of the shipped demo bundle."""
    out = tmp_path_factory.mktemp("older") / "bundle"
    export_bundle(random_model("qrnn"), out, ExportOptions(precisions=("fp32", "fp16", "int8"), drift_frames=16,
                                                           calibration_frames=8, show_progress=False),
                  log=lambda m: None)
    return sorted(out.glob("*.onnx")) + sorted(DEMO_BUNDLE.glob("*.onnx"))


def test_graphs_declare_only_the_operator_sets_their_nodes_use(every_graph):
    """ONNX Runtime 1.17 refused the demo's int8 graph whole for an operator set no node used (ai.onnx.ml 5,
    which ONNX Runtime 1.32's quantizer declares with a dozen others)."""
    for path in every_graph:
        graph = onnx.load(str(path), load_external_data=False)
        declared = {opset.domain for opset in graph.opset_import}
        used = {node.domain for node in graph.graph.node} | {""}
        assert declared == used, f"{path}: declares {sorted(declared - used)} that no node uses"


def test_no_graph_takes_an_argmax_over_int64(every_graph):
    """ONNX Runtime before 1.20 has no int64 ArgMax: the text encoder's end-token lookup failed to load there."""
    for path in every_graph:
        graph = onnx.shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False))
        types = {v.name: v.type.tensor_type.elem_type for v in [*graph.graph.value_info, *graph.graph.input]}
        for node in graph.graph.node:
            if node.op_type in ("ArgMax", "ArgMin"):
                assert types[node.input[0]] != onnx.TensorProto.INT64, f"{path}: {node.name} takes int64"


@pytest.mark.parametrize("version, release", [("1.17.0", (1, 17)), ("1.18.1+cu118", (1, 18)), ("1.19.0", (1, 19)),
                                              ("1.20.0rc1", (1, 20)), ("2.0", (2, 0))])
def test_onnxruntime_releases_are_read_from_their_version_strings(version, release):
    assert onnxruntime_release(version) == release


@pytest.mark.parametrize("version, memory_plan", [("1.17.0", False), ("1.18.1", False), ("1.19.0", True),
                                                  ("1.32.0", True)])
def test_the_memory_plan_is_off_only_where_it_breaks_fp16_graphs(version, memory_plan, monkeypatch):
    """ONNX Runtime 1.17-1.18 returned NaN from every fp16 step after the first with the plan on."""
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "__version__", version)
    assert session_options().enable_mem_pattern is memory_plan


@pytest.mark.parametrize("version, options", [("1.17.0", {}), ("1.17.3", {}), ("1.18.0", {"use_tf32": "0"}),
                                              ("1.31.1", {"use_tf32": "0"})])
def test_float32_stays_float32_on_a_gpu_where_onnx_runtime_can_be_told(version, options):
    """TF32 products are on by default in ONNX Runtime's CUDA provider; ``use_tf32`` turns them off from 1.18, and
    an option a release does not know fails its session, so older ones are not given it."""
    assert cuda_options(version) == options


@pytest.mark.parametrize("version", ["1.17.0", "1.17.3"])
def test_onnx_runtime_before_graph_ids_steps_uncaptured_rather_than_replay_one_binding_for_both(version, monkeypatch):
    """Before 1.18 ONNX Runtime ignored ``gpu_graph_id`` and replayed its one captured graph for every run: the
    bound step's second binding would have replayed the first's, reading and writing the same state sets forever."""
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "__version__", version)
    with pytest.warns(SetupWarning, match="one CUDA graph per session") as caught:
        session, captured = create_session(DEMO_BUNDLE / "step.fp32.onnx", "cpu", cuda_graph=True)
    assert captured is False and session.get_providers() == ["CPUExecutionProvider"]
    warning = str(caught[0].message)
    assert len(caught) == 1 and "\n" not in warning and "1.18" in warning and "pip install" in warning


def test_a_graph_newer_than_this_onnx_runtime_is_named_so_not_called_damaged(tmp_path):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = tmp_path / "future.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 99)]), str(path))
    with pytest.raises(Exception) as refused:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    words = str(load_refusal(refused.value, path, "a step graph"))
    assert f"ONNX Runtime {ort.__version__} cannot run {path}" in words and "needs a newer ONNX Runtime" in words
    assert "damaged" not in words
    (tmp_path / "damaged.onnx").write_bytes(b"\x08\x07garbage")
    with pytest.raises(Exception) as refused:
        ort.InferenceSession(str(tmp_path / "damaged.onnx"), providers=["CPUExecutionProvider"])
    assert "the file is damaged or not a step graph" in str(load_refusal(refused.value, path, "a step graph"))


def test_opencv_logs_are_quieted_where_opencv_has_no_logging_module(monkeypatch):
    """OpenCV 4.8 has cv2.setLogLevel and no cv2.utils.logging; every command stopped at start there."""
    import cv2

    from sdqes_edge.runtime import sources

    levels = []
    monkeypatch.delattr(cv2.utils, "logging", raising=False)
    monkeypatch.setattr(cv2, "setLogLevel", levels.append, raising=False)
    sources.quiet_opencv_logs()
    assert levels == [sources.OPENCV_LOG_LEVEL_SILENT] == [0]


def test_the_fp16_workaround_keeps_the_steps_finite_and_equal_to_the_planned_ones(every_graph):
    """Without the memory plan ONNX Runtime gives the same steps (here, on a release that plans correctly)."""
    import onnxruntime as ort

    (fp16,) = [p for p in every_graph if p.name == "step.fp16.onnx"]
    outputs = []
    for plan in (True, False):
        options = session_options()
        options.enable_mem_pattern = plan
        session = ort.InferenceSession(str(fp16), options, providers=["CPUExecutionProvider"])
        feeds = {i.name: np.full([d for d in i.shape], 0.1, np.float16 if "16" in i.type else np.float32)
                 for i in session.get_inputs()}
        outputs.append([session.run(None, feeds)[0] for _ in range(3)])
    assert np.isfinite(outputs[1]).all()
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_inspect_fails_on_a_non_finite_embedding_instead_of_printing_its_norm(monkeypatch, capsys):
    """What ONNX Runtime 1.17-1.18 did to fp16 graphs: inspect printed 'embedding norm nan' and exit 0."""
    from sdqes_edge.cli import run
    from sdqes_edge.runtime.backend import StepResult
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

    real_step, calls = OnnxRuntimeStep.step, []

    def poisoned(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        calls.append(1)
        return StepResult(result.embedding * (np.nan if len(calls) == 3 else 1.0), result.state)

    monkeypatch.setattr(OnnxRuntimeStep, "step", poisoned)
    assert run(["inspect", str(DEMO_BUNDLE), "--frames", "4"]) == 2
    err = capsys.readouterr().err
    assert "the fp32 graph gave a non-finite embedding at sample frame 2 on ONNX Runtime" in err
    assert err.count("\n") == 1


def test_tensorrt_types_are_read_without_trt_nptype_which_fails_on_tensorrt_8_5_with_numpy_1_24():
    """TensorRT 8.5's nptype (JetPack 5's) builds its table with np.bool, gone from numpy 1.24: every engine load
    raised AttributeError there. The runtime reads a DataType by its name instead."""
    from sdqes_edge.runtime.tensorrt_backend import numpy_dtype

    DataType = enum.Enum("DataType", "FLOAT HALF INT8 INT32 BOOL BF16")  # the names TensorRT's enum has
    assert [numpy_dtype(t) for t in list(DataType)[:5]] == [np.float32, np.float16, np.int8, np.int32, np.bool_]
    assert numpy_dtype("DataType.HALF") == np.float16  # an enum without .name is read from its text
    with pytest.raises(UserError, match="TensorRT type BF16, which numpy cannot hold; rebuild"):
        numpy_dtype(DataType.BF16)
