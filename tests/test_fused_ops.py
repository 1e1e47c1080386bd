"""Each QRNN adapter's pooling step is one node of the ONNX function ``sdqes_edge.QrnnPool`` in the graphs for
ONNX Runtime (export/fused_ops.py). ONNX Runtime runs the function's body where no kernel claims the node: the
same kernels and numbers as before. This project's kernel library (runtime/ort_ops, sdqes-edge build-ort-ops,
runtime/fused_ops.py) runs it as one kernel: on the CPU here, on the CUDA provider in tests/test_device_step.py."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tomllib
from conftest import assert_same_stream, random_model, step_graph_forms
from onnx import TensorProto, helper, numpy_helper

from sdqes_edge.contract import FUSED_OPS_DOMAIN, ONNX_RUNTIME_OPERATORS
from sdqes_edge.errors import UserError
from sdqes_edge.export.fused_ops import QRNN_POOL, QRNN_SCAN, fuse_qrnn_pools, inline_fused_functions
from sdqes_edge.export.graphs import export_step_graph, export_window_graph
from sdqes_edge.export.tensorrt_ops import as_tensorrt_reads_it, unsupported_ops
from sdqes_edge.runtime.fused_ops import DEFAULT_LIBRARY, FusedOps, load_fused_ops
from sdqes_edge.runtime.kernels import count_kernels

ROOT = Path(__file__).resolve().parents[1]
BLOCKS, PER_BLOCK = 2, 2  # the tiny preset's image tower, two adapters a block
WINDOW = 4  # frames of the sliding window
ADAPTERS = BLOCKS * PER_BLOCK
POOL_BODY_KERNELS = 6  # Split, QuickGelu (fused by ONNX Runtime), Sigmoid, Sub, Mul, Add


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    """tiny + QRNN, two adapters a block: the plain fp32 graph, fp32 with ONNX Runtime's operators, and fp16."""
    return step_graph_forms(random_model("qrnn", per_block=PER_BLOCK), tmp_path_factory.mktemp("graphs"))


def pool_nodes(path: Path) -> list:
    return [n for n in onnx.load(str(path)).graph.node if n.domain == FUSED_OPS_DOMAIN and n.op_type == QRNN_POOL]


def frame_shape(path: Path) -> tuple:
    size = random_model("qrnn").cfg.vision.image_size
    return (2, 3, size, size)


def test_each_pooling_step_is_one_function_node_in_the_graphs_for_onnx_runtime_and_none_in_the_plain_graph(graphs):
    for form in ("fp32", "fp16"):
        graph = onnx.load(str(graphs[form]))
        assert len(pool_nodes(graphs[form])) == ADAPTERS, form
        assert [(f.domain, f.name) for f in graph.functions] == [(FUSED_OPS_DOMAIN, QRNN_POOL)]
        assert not any(n.op_type in ("Split", "Sub") for n in graph.graph.node), form  # all inside the function
        onnx.checker.check_model(graph, full_check=True)
    assert not pool_nodes(graphs["plain"]) and not onnx.load(str(graphs["plain"])).functions


def test_without_the_library_onnx_runtime_runs_the_functions_body_with_the_same_numbers(graphs):
    assert_same_stream((graphs["plain"], graphs["fp32"]), frame_shape(graphs["plain"]), frames=16, atol=2e-6)
    by_op = count_kernels(graphs["fp32"]).by_op
    assert by_op.get("Split", 0) == ADAPTERS and QRNN_POOL not in by_op


def test_with_the_library_each_pooling_step_is_one_kernel_and_the_numbers_are_the_same(graphs, kernel_library):
    inlined, fused = count_kernels(graphs["fp32"]), count_kernels(graphs["fp32"], fused_ops=kernel_library)
    assert fused.by_op[QRNN_POOL] == ADAPTERS and "Split" not in fused.by_op
    assert inlined.per_step - fused.per_step == ADAPTERS * (POOL_BODY_KERNELS - 1)
    assert_same_stream((graphs["plain"], graphs["fp32"]), frame_shape(graphs["plain"]), frames=16, atol=2e-6,
                       second_options={"fused_ops": kernel_library.path})


def test_a_longer_lookback_and_stacked_qrnn_layers_are_fused_step_and_window_with_the_same_numbers(
        kernel_library, tmp_path):
    """Lookback 2 (the history shifts) and two QRNN layers an adapter (one pooling feeding the next)."""
    model = random_model("qrnn", lookback=2, qrnn_layers=2)
    plain, ort_ops, window = tmp_path / "plain.onnx", tmp_path / "ort.onnx", tmp_path / "window.onnx"
    export_step_graph(model, plain, batch=2)
    export_step_graph(model, ort_ops, batch=2, operators=ONNX_RUNTIME_OPERATORS)
    export_window_graph(model, window, window=WINDOW, operators=ONNX_RUNTIME_OPERATORS)
    layers = BLOCKS * model.cfg.adapter.per_block * 2  # two layers an adapter
    assert len(pool_nodes(ort_ops)) == layers
    assert sum(n.op_type == QRNN_SCAN for n in onnx.load(str(window)).graph.node) == layers
    assert_same_stream((plain, ort_ops), frame_shape(plain), frames=12, atol=2e-6,
                       second_options={"fused_ops": kernel_library.path})


def test_the_fp16_kernel_follows_the_fp16_body_over_a_stream(graphs, kernel_library):
    """One rounding to fp16 instead of one per operator: within fp16's tolerance of the body, state carried."""
    assert_same_stream((graphs["fp16"], graphs["fp16"]), frame_shape(graphs["fp16"]), frames=16, atol=2e-3,
                       second_options={"fused_ops": kernel_library.path})


def test_tensorrt_gets_the_functions_body_in_its_place_with_the_same_numbers(graphs, tmp_path):
    readable = as_tensorrt_reads_it(onnx.load(str(graphs["fp32"])))
    assert not readable.functions and all(n.domain != FUSED_OPS_DOMAIN for n in readable.graph.node)
    assert FUSED_OPS_DOMAIN not in {o.domain for o in readable.opset_import}
    onnx.save(readable, str(tmp_path / "tensorrt.onnx"))
    assert_same_stream((graphs["plain"], tmp_path / "tensorrt.onnx"), frame_shape(graphs["plain"]), frames=8,
                       atol=2e-6)


@pytest.fixture(scope="module")
def windows(tmp_path_factory) -> dict[str, Path]:
    """The 4-frame sliding window of the same model: plain fp32, fp32 with ONNX Runtime's operators, fp16."""
    model, folder = random_model("qrnn", per_block=PER_BLOCK), tmp_path_factory.mktemp("windows")
    paths = {form: folder / f"{form}.onnx" for form in ("plain", "fp32", "fp16")}
    export_window_graph(model, paths["plain"], window=WINDOW)
    export_window_graph(model, paths["fp32"], window=WINDOW, operators=ONNX_RUNTIME_OPERATORS)
    export_window_graph(model, paths["fp16"], window=WINDOW, precision="fp16")
    return paths


def window_outputs(path: Path, fused_ops: FusedOps | None = None) -> np.ndarray:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if fused_ops is not None:
        options.register_custom_ops_library(str(fused_ops.path))
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    frames = session.get_inputs()[0]
    x = np.random.default_rng(7).standard_normal(frames.shape).astype(np.float32)
    return session.run(None, {frames.name: x})[0].astype(np.float32)


def test_the_windows_pooling_over_its_frames_is_one_function_node_with_the_same_numbers(windows):
    """The sliding window the step is measured against gets the same treatment: its scan over the frames (the
    activations once, then per frame two Gathers, Sub, Mul, Add; the frames stacked) is one node."""
    for form in ("fp32", "fp16"):
        scans = [n for n in onnx.load(str(windows[form])).graph.node if n.op_type == QRNN_SCAN]
        assert len(scans) == ADAPTERS and {helper.get_attribute_value(a) for n in scans for a in n.attribute
                                           if a.name == "axis"} == {1}, form
    np.testing.assert_allclose(window_outputs(windows["fp32"]), window_outputs(windows["plain"]), atol=2e-6)


def test_with_the_library_each_windows_scan_is_one_kernel_and_the_numbers_are_the_same(windows, kernel_library):
    inlined, fused = count_kernels(windows["fp32"]), count_kernels(windows["fp32"], fused_ops=kernel_library)
    assert fused.by_op[QRNN_SCAN] == ADAPTERS and "Sub" not in fused.by_op  # the scans' own arithmetic is gone
    # per adapter at least each frame's Mul and each later frame's Sub and Add, and the activations' three (ONNX
    # Runtime writes the frames' Gathers as a Split and views, so their count is its own)
    assert inlined.computing - fused.computing >= ADAPTERS * (3 + WINDOW + 2 * (WINDOW - 1) - 1)
    np.testing.assert_allclose(window_outputs(windows["fp32"], kernel_library), window_outputs(windows["plain"]),
                               atol=2e-6)
    np.testing.assert_allclose(window_outputs(windows["fp16"], kernel_library), window_outputs(windows["fp16"]),
                               atol=2e-3)


def test_tensorrt_reads_the_windows_scan_as_operators_it_parses(windows):
    readable = as_tensorrt_reads_it(onnx.load(str(windows["fp16"])))
    assert not readable.functions
    assert unsupported_ops({n.op_type for n in readable.graph.node}, (8, 6)) == {}  # opset 17: LayerNormalization


def pool_graph(z_read_elsewhere: bool) -> onnx.ModelProto:
    """h' = h + sigmoid(f) * (z sigmoid(1.702 z) - h) over the halves of gates [3, 8]; optionally z also an output."""
    alpha = numpy_helper.from_array(np.array(1.702, np.float32), "alpha")
    nodes = [helper.make_node("Split", ["gates"], ["z", "f"], axis=-1),
             helper.make_node("Mul", ["z", "alpha"], ["az"]), helper.make_node("Sigmoid", ["az"], ["sz"]),
             helper.make_node("Mul", ["z", "sz"], ["c"]), helper.make_node("Sigmoid", ["f"], ["sf"]),
             helper.make_node("Sub", ["c", "h"], ["d"]), helper.make_node("Mul", ["sf", "d"], ["m"]),
             helper.make_node("Add", ["h", "m"], ["h_next"], name="pool_add")]
    value = helper.make_tensor_value_info
    outputs = [value("h_next", TensorProto.FLOAT, [3, 4])] + ([value("z", TensorProto.FLOAT, [3, 4])]
                                                             if z_read_elsewhere else [])
    graph = helper.make_graph(nodes, "g", [value("gates", TensorProto.FLOAT, [3, 8]), value("h", TensorProto.FLOAT,
                                                                                           [3, 4])], outputs, [alpha])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    import onnxruntime

    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["h_next"], feeds)[0]


def test_a_hand_made_pooling_step_is_fused_and_inlined_back_to_the_same_numbers():
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in (("gates", (3, 8)), ("h", (3, 4)))}
    model = pool_graph(z_read_elsewhere=False)
    expected = run(model, feeds)
    assert fuse_qrnn_pools(model) == 1
    assert [n.op_type for n in model.graph.node] == [QRNN_POOL]
    np.testing.assert_allclose(run(model, feeds), expected, atol=1e-6)
    assert inline_fused_functions(model) == 1 and not model.functions
    np.testing.assert_allclose(run(model, feeds), expected, atol=1e-6)


def test_a_pooling_step_whose_tensors_are_read_elsewhere_is_left_alone():
    model = pool_graph(z_read_elsewhere=True)
    assert fuse_qrnn_pools(model) == 0 and not model.functions


def test_a_missing_or_foreign_library_and_a_cpu_build_on_a_gpu_are_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="sdqes-edge build-ort-ops") as missing:
        load_fused_ops(tmp_path / "libsdqes_ort_ops.so")
    (tmp_path / "junk.so").write_bytes(b"not a library")
    with pytest.raises(UserError, match="rebuild it on this machine") as junk:
        load_fused_ops(tmp_path / "junk.so")
    cpu_build = FusedOps(tmp_path / "lib.so", with_cuda=False)
    assert cpu_build.usable_on("cpu") is None
    assert "without CUDA kernels" in cpu_build.usable_on("cuda")
    assert all("\n" not in str(e.value) for e in (missing, junk))


def oldest_onnxruntime() -> tuple[int, int]:
    """The oldest ONNX Runtime the project accepts (pyproject.toml's runtime extra: "onnxruntime>=1.17")."""
    runtime = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["runtime"]
    version = next(r.split(">=")[1] for r in runtime if r.startswith("onnxruntime>="))
    return tuple(int(part) for part in version.split(".")[:2])


def test_the_library_asks_for_the_c_api_of_the_oldest_onnxruntime_the_project_supports(kernel_library):
    """ONNX Runtime 1.N serves C API version N and every one before it. The library asks for the oldest supported
    release's (1.17: Jetson's wheels lag), not its headers' (1.21), and an older ONNX Runtime gets a status that
    says what to install. Driven here through a stand-in for an ONNX Runtime that serves only version 1."""
    asked, said = [], []
    create_status = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)(
        lambda code, message: said.append(message.decode()) or 1)
    version_one = (ctypes.c_void_p * 1)(ctypes.cast(create_status, ctypes.c_void_p))  # OrtApi begins: CreateStatus

    def get_api(version):
        asked.append(version)
        return ctypes.addressof(version_one) if version == 1 else None

    class OrtApiBase(ctypes.Structure):
        _fields_ = [("GetApi", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)),
                    ("GetVersionString", ctypes.CFUNCTYPE(ctypes.c_char_p))]

    api_base = OrtApiBase(OrtApiBase._fields_[0][1](get_api), OrtApiBase._fields_[1][1](lambda: b"1.16.3"))
    register = ctypes.CDLL(str(kernel_library.path)).RegisterCustomOps
    register.restype, register.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(OrtApiBase)]
    assert register(None, ctypes.byref(api_base)) == 1  # the status made, handed back to ONNX Runtime
    oldest = oldest_onnxruntime()
    assert asked == [oldest[1], 1]
    assert said == [f"libsdqes_ort_ops needs onnxruntime {oldest[0]}.{oldest[1]} or newer (its C API version "
                    f"{oldest[1]}), which this onnxruntime is not; upgrade onnxruntime or run without the library"]


def test_run_takes_the_library_and_says_so_the_scores_unchanged_and_a_plain_graph_is_warned_about(kernel_library,
                                                                                                 tmp_path):
    """``sdqes-edge run --ort-ops`` as a user runs it: the fp16 graph's pooling steps on the library's kernel, the
    scores those of the graph without it (fp16's tolerance), and the fp32 graph, which has none, named in a
    warning rather than run as if the library did something."""

    from runtime_fixtures import FPS, QUERY, write_video

    from sdqes_edge.export import ExportOptions, export_bundle
    from sdqes_edge.sample import sample_frames
    from sdqes_edge.traces import load_scores

    bundle = tmp_path / "bundle"
    export_bundle(random_model("qrnn", per_block=PER_BLOCK), bundle,
                  ExportOptions(fps=FPS, precisions=("fp32", "fp16"), drift_frames=16, show_progress=False),
                  log=lambda m: None)
    video = write_video(tmp_path / "clip.mp4", sample_frames(40, 120, 160))

    def run_cli(precision: str, *extra: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video),
                               "--query", QUERY, "--precision", precision, "--scores",
                               str(tmp_path / f"{precision}{len(extra)}.npz"), *extra], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done

    library = ("--ort-ops", str(kernel_library.path))
    fused, inlined = run_cli("fp16", *library), run_cli("fp16")
    assert "sdqes_edge kernels from libsdqes_ort_ops.so" in fused.stderr
    assert "sdqes_edge kernels" not in inlined.stderr
    np.testing.assert_allclose(load_scores(tmp_path / "fp162.npz").probs, load_scores(tmp_path / "fp160.npz").probs,
                               atol=2e-3)
    assert "plain ONNX, which holds none of the operators" in run_cli("fp32", *library).stderr


CUDA_LIBRARY = ROOT / DEFAULT_LIBRARY  # where build-ort-ops writes it; the GPU kit carries it there


def cuda_kernel_library() -> FusedOps:
    """The library with its CUDA kernels, where a CUDA provider is; else the test is skipped with the reason."""
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("needs onnxruntime-gpu with the CUDA execution provider (an NVIDIA GPU); the CPU kernels are "
                    "tested here")
    if not CUDA_LIBRARY.is_file():
        pytest.skip(f"no kernel library at {CUDA_LIBRARY}: build it with sdqes-edge build-ort-ops where nvcc is")
    library = load_fused_ops(CUDA_LIBRARY)
    if not library.with_cuda:
        pytest.skip(f"{CUDA_LIBRARY} was built without nvcc: no CUDA kernels to test")
    return library


def test_on_the_gpu_each_pooling_step_is_one_kernel_in_a_cuda_graph_and_follows_the_cpu_fp32_step(graphs):
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
    from sdqes_edge.tolerances import VARIANT_TOLERANCES

    library = cuda_kernel_library()
    counted = count_kernels(graphs["fp16"], providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                            fused_ops=library)
    assert counted.by_op[QRNN_POOL] == ADAPTERS and "Split" not in counted.by_op
    gpu, cpu = OnnxRuntimeStep(graphs["fp16"], device="cuda", fused_ops=library.path), OnnxRuntimeStep(graphs["plain"])
    assert gpu.cuda_graph, "CUDA graph capture was refused with the library's kernels in the graph"
    rng, tolerance = np.random.default_rng(5), VARIANT_TOLERANCES["fp16"]
    state_gpu, state_cpu = gpu.initial_state(), cpu.initial_state()
    for _ in range(40):  # both bindings replayed many times over, the state carried on the device
        frame = rng.standard_normal(frame_shape(graphs["fp16"])).astype(np.float32)
        got, want = gpu.step(frame, state_gpu), cpu.step(frame, state_cpu)
        cosine = (got.embedding * want.embedding).sum(-1) / (np.linalg.norm(got.embedding, axis=-1)
                                                            * np.linalg.norm(want.embedding, axis=-1))
        assert cosine.min() >= tolerance["min_cosine"]
        assert np.abs(got.embedding - want.embedding).max() <= tolerance["max_abs_embedding"]
        state_gpu, state_cpu = got.state, want.state


def test_the_bench_times_the_steps_with_the_library_beside_the_same_graphs_without(kernel_library, tmp_path):
    """``bench --device ... --ort-ops``: rows and ratios of their own, the window with the library too (its scan
    one kernel, as the step's pooling is). Here on the CPU, as --device cpu runs."""
    import dataclasses

    from sdqes_edge.benchmarks.config import QUICK, BenchConfig
    from sdqes_edge.benchmarks.suite import check_config, run

    with pytest.raises(UserError, match="add --device cuda"):
        check_config(dataclasses.replace(BenchConfig(**QUICK), ort_ops=str(kernel_library.path)))
    with pytest.raises(UserError, match="build-ort-ops"):
        check_config(dataclasses.replace(BenchConfig(**QUICK), device="cpu", ort_ops=str(tmp_path / "none.so")))
    cfg = dataclasses.replace(BenchConfig(**QUICK), repetitions=3, device="cpu", device_only=True, int8=False,
                              device_batches=(2,), device_scaling_frames=10, scaling_probe=5, e2e_frames=4,
                              device_e2e_frames=4, out=str(tmp_path), ort_ops=str(kernel_library.path))
    section = run(cfg, log=lambda m: None)[0]["device"]
    assert section["latency"]["qrnn/ort_fp16_sdqes_kernels"]["p50_ms"] > 0
    assert section["latency"]["window4/ort_fp16_sdqes_kernels"]["p50_ms"] > 0
    assert {"window4 / streaming qrnn (ort_fp16 with sdqes_edge kernels, same treatment)",
            "qrnn: ort_fp16 / with sdqes_edge kernels"} <= set(section["ratios"])
    with_kernels, without = (section["kernels_on_device"][k]["ort_nodes"] for k in ("qrnn/ort_fp16_sdqes_kernels",
                                                                                  "qrnn"))
    assert without - with_kernels >= BLOCKS * (POOL_BODY_KERNELS - 1)  # at least one QRNN adapter a block
    assert section["batches"]["rows"]["qrnn/fp16 with sdqes_edge kernels/2"]["frames_per_s"] > 0


def test_on_the_gpu_each_windows_scan_is_one_kernel_in_a_cuda_graph_and_follows_the_cpu_fp32_window(windows):
    from sdqes_edge.runtime.ort_sessions import create_session
    from sdqes_edge.tolerances import VARIANT_TOLERANCES

    library = cuda_kernel_library()
    counted = count_kernels(windows["fp16"], providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                            fused_ops=library)
    assert counted.by_op[QRNN_SCAN] == ADAPTERS and "Sub" not in counted.by_op
    session, captured = create_session(windows["fp16"], "cuda", cuda_graph=False, fused_ops=library)
    frames = session.get_inputs()[0]
    x = np.random.default_rng(7).standard_normal(frames.shape).astype(np.float32)
    got = session.run(None, {frames.name: x})[0].astype(np.float32)
    assert np.abs(got - window_outputs(windows["plain"])).max() <= VARIANT_TOLERANCES["fp16"]["max_abs_embedding"]


def test_inspect_counts_a_steps_kernels_with_the_library_too(kernel_library, tmp_path):

    from sdqes_edge.export import ExportOptions, export_bundle

    bundle = tmp_path / "bundle"
    export_bundle(random_model("qrnn", per_block=PER_BLOCK), bundle,
                  ExportOptions(precisions=("fp32", "fp16"), drift_frames=16, show_progress=False), log=lambda m: None)
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "inspect", str(bundle), "--precision", "fp16",
                           "--frames", "2", "--ort-ops", str(kernel_library.path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "with libsdqes_ort_ops.so: " in done.stdout and f"QrnnPool {ADAPTERS})" in done.stdout
