"""What the exported graphs cost and where they can run: MACs/parameters, TensorRT operators, engines."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import random_model

from sdqes_edge.config import preset
from sdqes_edge.errors import UserError
from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.export.complexity import count_graph
from sdqes_edge.export.graphs import export_step_graph
from sdqes_edge.export.tensorrt_engine import nvidia_gpu_present
from sdqes_edge.export.tensorrt_ops import as_tensorrt_reads_it, check_opset_readable, unsupported_ops
from sdqes_edge.model import SDQESModel

# Published figures for CLIP ViT-B/16's image tower at 224px (DESIGN.md section 3).
B16_PARAMETERS = 86.2e6
B16_MACS = 17.6e9


def within(value: float, target: float, fraction: float) -> bool:
    return abs(value - target) <= fraction * target


def test_clip_b16_image_tower_counts_within_2_percent_of_the_published_figures(tmp_path):
    path = tmp_path / "b16.onnx"
    export_step_graph(SDQESModel(preset("clip-vit-b16")).eval(), path)
    counted = count_graph(path)
    assert within(counted.parameters, B16_PARAMETERS, 0.02), counted.parameters
    assert within(counted.macs, B16_MACS, 0.02), counted.macs
    assert counted.flops == 2 * counted.macs
    patch_embedding = 196 * 768 * (3 * 16 * 16)  # one product of each patch's pixels with the kernel
    per_block = 197 * (3 + 1 + 4 + 4) * 768 * 768  # in_proj, out_proj, c_fc, c_proj over the 197 rows
    assert counted.macs_by_category["matmul_weight"] == patch_embedding + 12 * per_block + 768 * 512  # + proj
    assert counted.macs_by_category["matmul_activations"] == 12 * 2 * 12 * 197 * 197 * 64  # q.k^T and p.v


@pytest.mark.parametrize("kind", ["mlp", "st", "qrnn", "retnet"])
def test_adapters_are_counted_apart_from_the_tower(kind, tmp_path):
    model = random_model(kind)
    result = export_bundle(model, tmp_path / kind, ExportOptions(show_progress=False), log=lambda m: None)
    complexity = result.manifest["complexity"]["per_frame"]
    adapter_params = sum(p.numel() for n, p in model.visual.named_parameters() if ".adapter" in n)
    tower_params = sum(p.numel() for n, p in model.visual.named_parameters() if ".adapter" not in n)
    assert complexity["adapters"]["parameters"] == adapter_params
    assert complexity["image_tower"]["parameters"] == tower_params
    assert complexity["adapters"]["macs"] > 0


@pytest.mark.parametrize("opset, tensorrt", [(17, (8, 6)), (16, (8, 5))])
def test_every_operator_of_every_graph_is_one_tensorrt_parses(opset, tensorrt, tmp_path):
    """Step graphs for every adapter kind and precision, and the text graph, on TensorRT 8.6 / 8.5."""
    seen = set()
    for kind in ("none", "mlp", "st", "qrnn", "retnet"):
        out = tmp_path / f"{kind}-{opset}"
        # (16 frames to calibrate and check: the operators are the point here, not the scales)
        export_bundle(random_model(kind), out, ExportOptions(opset=opset, precisions=("fp32", "fp16", "int8"),
                                                             drift_frames=16, calibration_frames=16,
                                                             show_progress=False),
                      log=lambda m: None)
        for graph in out.glob("*.onnx"):  # as build-engine hands them to the parser
            ops = {n.op_type for n in as_tensorrt_reads_it(onnx.load(str(graph))).graph.node}
            assert unsupported_ops(ops, tensorrt) == {}, graph.name
            seen |= ops
    assert {"QuantizeLinear", "DequantizeLinear", "MatMul", "Transpose"} <= seen
    assert ("LayerNormalization" in seen) == (opset == 17)


def test_an_operator_tensorrt_lacks_is_reported_with_the_fix():
    assert "not supported" in unsupported_ops({"NonZero"})["NonZero"]
    assert "--opset 16" in unsupported_ops({"LayerNormalization"}, (8, 5))["LayerNormalization"]
    # build-engine says it of an opset-17 bundle before parsing, on TensorRT 8.5 (JetPack 5, a Xavier's last)
    with pytest.raises(UserError, match=r"^TensorRT 8\.5\.2\.2 cannot read LayerNormalization.*--opset 16"):
        check_opset_readable(17, "8.5.2.2", "bundles/qrnn")
    for opset, tensorrt in ((16, "8.5.2.2"), (17, "8.6.1.6"), (17, "10.3.0")):
        check_opset_readable(opset, tensorrt)


def tensorrt_available() -> bool:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return nvidia_gpu_present()


@pytest.mark.skipif(tensorrt_available(), reason="this machine has an NVIDIA GPU with TensorRT")
def test_build_engine_without_a_gpu_says_what_is_missing(tmp_path):
    bundle = tmp_path / "b"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(show_progress=False), log=lambda m: None)
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "build-engine", str(bundle)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert ("no NVIDIA GPU" in done.stderr or "TensorRT is not installed" in done.stderr), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (bundle / "engines").exists()


@pytest.mark.skipif(not tensorrt_available(), reason="needs an NVIDIA GPU with TensorRT and pycuda installed")
def test_build_engine_on_an_nvidia_gpu_writes_the_engine_and_its_sidecar(tmp_path):
    import json

    from sdqes_edge.export.tensorrt_engine import build_engine

    bundle = tmp_path / "b"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(show_progress=False), log=lambda m: None)
    engine = build_engine(bundle, precision="fp16")
    sidecar = json.loads(engine.with_suffix(".json").read_text())
    assert engine.stat().st_size > 0 and sidecar["precision"] == "fp16"
    assert (engine.parent / "timing.cache").is_file()
    assert engine.parent.name.endswith(f"trt{sidecar['tensorrt_version']}")


# --- the check every engine passes before it is kept (TensorRT's own step is needed only to open the file;
# an ONNX Runtime step of a chosen graph stands in for it, so the decision and the files are tested here) -----

@pytest.fixture(scope="module")
def fp16_bundle(tmp_path_factory):
    from sdqes_edge.runtime.bundle import load_bundle

    root = tmp_path_factory.mktemp("engine-check") / "bundle"
    export_bundle(random_model("qrnn"), root, ExportOptions(precisions=("fp32", "fp16"), show_progress=False,
                                                             drift_frames=64), log=lambda m: None)
    # A graph of the same shape from other weights: what a broken engine computes.
    other = root.parent / "other.onnx"
    export_step_graph(random_model("qrnn", seed=1), other)
    return load_bundle(root), other


def _device():
    from sdqes_edge.runtime.tensorrt_backend import DeviceInfo

    return DeviceInfo("Test GPU", (8, 7), "10.3.0")


def _keep(bundle, serialized: bytes, graph, verify_frames: int = 40):
    from sdqes_edge.export.tensorrt_engine import keep_checked_engine
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

    return keep_checked_engine(bundle, serialized, "fp16", _device(), {"source_graph": "step.fp32.onnx"},
                               verify_frames, log=lambda m: None, open_engine=lambda path, b: OnnxRuntimeStep(graph))


def test_an_engine_that_follows_the_fp32_graph_is_kept_with_its_check_in_the_sidecar(fp16_bundle):
    import json

    bundle, _ = fp16_bundle
    engine = _keep(bundle, b"engine bytes", bundle.step_graph("fp16"))
    assert engine.read_bytes() == b"engine bytes" and not list(engine.parent.glob("*.tmp"))
    check = json.loads(engine.with_suffix(".json").read_text())["verification"]
    assert check["passed"] and check["frames"] == 40 and check["precision"] == "fp16"
    assert check["min_cosine"] >= 0.99 and check["final_state_scale"] > 0  # the state was carried and compared


def test_an_engine_that_drifts_is_refused_in_one_line_and_the_earlier_engine_stays(fp16_bundle):
    import json

    from sdqes_edge.export.drift import VariantDriftError

    bundle, other = fp16_bundle
    good = _keep(bundle, b"good engine", bundle.step_graph("fp16"))
    sidecar = good.with_suffix(".json").read_text()
    with pytest.raises(VariantDriftError) as refused:
        _keep(bundle, b"broken engine", other)
    message = str(refused.value)
    assert "drifts from the bundle's fp32 graph" in message and "min cosine" in message
    assert "the earlier engine is unchanged" in message and "--precision fp32" in message
    assert "\n" not in message
    assert good.read_bytes() == b"good engine" and good.with_suffix(".json").read_text() == sidecar
    assert not list(good.parent.glob("*.tmp"))
    assert json.loads(sidecar)["verification"]["passed"]


def test_verify_frames_0_keeps_the_engine_unchecked_and_says_so(fp16_bundle):
    import json

    from sdqes_edge.export.tensorrt_engine import keep_checked_engine

    bundle, _ = fp16_bundle
    messages = []
    engine = keep_checked_engine(bundle, b"unchecked", "fp16", _device(), {}, 0, log=messages.append,
                                 open_engine=lambda path, b: pytest.fail("nothing is opened when unchecked"))
    assert json.loads(engine.with_suffix(".json").read_text())["verification"] is None
    assert any("without a check" in m for m in messages)


def _planted_engine(bundle, tmp_path) -> tuple:
    """A copy of ``bundle`` with an fp16 engine file for ``_device()`` planted in it -> (copy, engine, device, a
    sidecar as build-engine writes it, to which each test adds what it checks)."""
    import shutil

    from sdqes_edge.contract import ENGINES_FOLDER, engine_name

    copy = tmp_path / "bundle"
    shutil.copytree(bundle.root, copy, ignore=shutil.ignore_patterns(ENGINES_FOLDER))
    here = _device()
    engine = copy / ENGINES_FOLDER / here.folder / engine_name("fp16")
    engine.parent.mkdir(parents=True)
    engine.write_bytes(b"engine")
    return copy, engine, here, {"gpu": here.name, "compute_capability": [8, 7], "tensorrt_version": "10.3.0"}


def test_an_engine_never_checked_against_the_fp32_graph_is_used_with_a_one_line_warning(fp16_bundle, tmp_path):
    import json
    import warnings

    from sdqes_edge.errors import SetupWarning
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.tensorrt_backend import find_engine

    copy, engine, here, sidecar = _planted_engine(fp16_bundle[0], tmp_path)
    engine.with_suffix(".json").write_text(json.dumps(dict(sidecar, verification=None)))
    with pytest.warns(SetupWarning) as caught:
        assert find_engine(load_bundle(copy), "fp16", here)[0] == engine
    warning = str(caught[0].message)
    assert len(caught) == 1 and "\n" not in warning and "never checked" in warning and "build-engine" in warning
    engine.with_suffix(".json").write_text(json.dumps(dict(sidecar, verification={"passed": True})))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SetupWarning)  # a checked engine is used silently
        find_engine(load_bundle(copy), "fp16", here)


def test_an_engine_built_from_another_exports_step_graph_is_refused_not_run_with_the_other_weights(fp16_bundle,
                                                                                                     tmp_path):
    import json

    from sdqes_edge.errors import UserError
    from sdqes_edge.files import file_sha256
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.tensorrt_backend import find_engine

    bundle, other_graph = fp16_bundle
    copy, engine, here, sidecar = _planted_engine(bundle, tmp_path)
    built = dict(sidecar, verification={"passed": True}, source_graph="step.fp16.onnx")
    engine.with_suffix(".json").write_text(json.dumps(dict(built, source_graph_sha256=file_sha256(other_graph))))
    with pytest.raises(UserError, match="not this bundle's.*build-engine") as refused:
        find_engine(load_bundle(copy), "fp16", here)
    assert "\n" not in str(refused.value)
    own = file_sha256(copy / "step.fp16.onnx")
    engine.with_suffix(".json").write_text(json.dumps(dict(built, source_graph_sha256=own)))
    assert find_engine(load_bundle(copy), "fp16", here)[0] == engine


def test_an_engine_whose_sidecar_is_missing_garbled_or_a_symlink_out_is_refused_in_one_line(fp16_bundle, tmp_path):
    """The sidecar says what the engine was built for and from: without it find_engine raised FileNotFoundError
    or a JSON traceback, and a symlink in its place was followed out of the bundle."""
    from sdqes_edge.errors import UserError
    from sdqes_edge.runtime.bundle import BundleError, load_bundle
    from sdqes_edge.runtime.tensorrt_backend import find_engine

    copy, engine, here, _ = _planted_engine(fp16_bundle[0], tmp_path)
    sidecar = engine.with_suffix(".json")
    for state, words in (("missing", "is missing or unreadable; rebuild the engine: sdqes-edge build-engine"),
                         ("garbled", "is missing or unreadable; rebuild the engine"),
                         ("a list", "is not the record build-engine writes"),
                         ("a symlink out", "leads outside the bundle through a symlink")):
        if state == "garbled":
            sidecar.write_text("{not json")
        elif state == "a list":
            sidecar.write_text("[]")
        elif state == "a symlink out":
            sidecar.unlink()
            (tmp_path / "elsewhere.json").write_text("{}")
            sidecar.symlink_to(tmp_path / "elsewhere.json")
        with pytest.raises(BundleError if state == "a symlink out" else UserError, match=words) as refused:
            find_engine(load_bundle(copy), "fp16", here)
        assert "\n" not in str(refused.value), state


def test_build_engine_is_torch_free_so_a_jetson_with_the_runtime_and_tensorrt_can_run_it():
    code = "import sys, sdqes_edge.export.tensorrt_engine; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- which graph each engine precision is built from, by the TensorRT's typing (plan_engine) -------------------

def _demo_bundle():
    from sdqes_edge.demo import DEMO_BUNDLE
    from sdqes_edge.runtime.bundle import load_bundle

    return load_bundle(DEMO_BUNDLE)  # fp32 and int8 graphs, no fp16


@pytest.mark.parametrize("precision, graph, flags", [("fp32", "fp32", ()), ("fp16", "fp32", ("FP16",)),
                                                     ("int8", "int8", ("FP16", "INT8"))])
def test_weak_typing_tensorrt_picks_reduced_precision_kernels_in_the_fp32_or_qdq_graph(precision, graph, flags):
    from sdqes_edge.export.tensorrt_engine import plan_engine

    plan = plan_engine(precision, _demo_bundle().precisions, weak_typing=True, tensorrt_version="10.3.0")
    assert (plan.graph_precision, plan.builder_flags, plan.typing) == (graph, flags, "weak")
    assert plan.state_dtype == "float32"  # the network's I/O keeps the parsed graph's types


def test_strong_typing_builds_each_precision_from_its_own_graph_with_no_precision_flags(fp16_bundle):
    from sdqes_edge.export.tensorrt_engine import plan_engine

    bundle, _ = fp16_bundle
    fp16 = plan_engine("fp16", bundle.precisions, weak_typing=False, tensorrt_version="11.4.0")
    assert (fp16.graph_precision, fp16.builder_flags, fp16.typing) == ("fp16", (), "strong")
    assert fp16.state_dtype == "float16"  # the engine's state bindings are fp16: the backends read them so
    int8 = plan_engine("int8", _demo_bundle().precisions, weak_typing=False, tensorrt_version="11.4.0")
    assert (int8.graph_precision, int8.builder_flags) == ("int8", ())


def test_an_fp16_engine_under_strong_typing_needs_the_bundles_fp16_graph_and_says_how_to_export_it():
    from sdqes_edge.errors import UserError
    from sdqes_edge.export.tensorrt_engine import plan_engine

    demo = _demo_bundle()
    with pytest.raises(UserError) as refused:
        plan_engine("fp16", demo.precisions, weak_typing=False, tensorrt_version="11.4.0", bundle_root=demo.root)
    message = str(refused.value)
    assert message.startswith(f"{demo.root} has no fp16 graph") and "TensorRT 11.4.0" in message
    assert "--precision fp16" in message
    assert "\n" not in message


def test_an_int8_engine_needs_the_int8_graph_whatever_the_typing(fp16_bundle):
    from sdqes_edge.errors import UserError
    from sdqes_edge.export.tensorrt_engine import plan_engine

    for weak_typing in (True, False):
        with pytest.raises(UserError, match="no int8 graph.*--precision int8"):
            plan_engine("int8", fp16_bundle[0].precisions, weak_typing=weak_typing, tensorrt_version="10.3.0")


# --- an engine's bindings are checked against the bundle before any buffer is made (check_bindings); an engine
# binds the I/O of the graph it was parsed from, so the graphs' own I/O stand in for the engine's description ----

def _graph_bindings(graph) -> dict:
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
    from sdqes_edge.runtime.tensorrt_backend import Binding

    session = OnnxRuntimeStep(graph).session
    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    return {t.name: Binding(tuple(t.shape), np.dtype(dtypes[t.type]))
            for t in [*session.get_inputs(), *session.get_outputs()]}


def _expected(bundle) -> dict:
    from sdqes_edge.runtime.tensorrt_backend import expected_bindings

    return expected_bindings(bundle.state_spec, int(bundle.manifest["embed_dim"]), bundle.image_size,
                             int(bundle.manifest["batch"]))


@pytest.mark.parametrize("precision, state_dtype", [("fp32", np.float32), ("fp16", np.float16)])
def test_engines_from_the_fp32_and_the_fp16_graph_both_fit_the_bundle(fp16_bundle, precision, state_dtype):
    from sdqes_edge.runtime.tensorrt_backend import check_bindings

    bundle, _ = fp16_bundle
    bindings = _graph_bindings(bundle.step_graph(precision))
    check_bindings(bindings, _expected(bundle), "step.fp16.engine", "rebuild it")
    assert {b.dtype for name, b in bindings.items() if name.startswith("state_")} == {np.dtype(state_dtype)}


def test_an_engine_of_another_graph_is_refused_in_one_line_before_anything_is_bound(fp16_bundle):
    from sdqes_edge.errors import UserError
    from sdqes_edge.runtime.tensorrt_backend import Binding, check_bindings

    bundle, _ = fp16_bundle
    good = _graph_bindings(bundle.step_graph("fp32"))
    state_in = next(name for name in good if name.startswith("state_in."))
    state_out = state_in.replace("state_in.", "state_out.")
    wrong = {
        "a state tensor missing": {n: b for n, b in good.items() if n != state_in},
        "another batch": dict(good, frame=Binding((2, *good["frame"].shape[1:]), good["frame"].dtype)),
        "state in and out disagree": dict(good, **{state_out: Binding(good[state_out].shape, np.dtype(np.float16))}),
        "an integer embedding": dict(good, embedding=Binding(good["embedding"].shape, np.dtype(np.int32))),
    }
    for case, bindings in wrong.items():
        with pytest.raises(UserError) as refused:
            check_bindings(bindings, _expected(bundle), "step.fp16.engine", "rebuild it: sdqes-edge build-engine b")
        message = str(refused.value)
        assert message.startswith("step.fp16.engine does not fit the bundle's step graph"), case
        assert message.endswith("rebuild it: sdqes-edge build-engine b") and "\n" not in message, case


def test_a_bundle_where_engines_cannot_be_stored_is_refused_before_any_build(fp16_bundle, tmp_path):
    import shutil

    bundle, _ = fp16_bundle
    copy = tmp_path / "bundle"
    shutil.copytree(bundle.root, copy, ignore=shutil.ignore_patterns("engines"))
    (copy / "engines").write_text("a file where the engines folder goes")
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "build-engine", str(copy)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert f"cannot store engines in {copy / 'engines'} (a file is in its place)" in done.stderr
    assert "copy it to a folder you can write to" in done.stderr
    assert (copy / "engines").read_text() == "a file where the engines folder goes"

