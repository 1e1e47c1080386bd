"""Each RetNet adapter's retention step, ``R' = R * keep + R[swap] * cross + k^T v`` and ``out = q R'``, is one node
of the ONNX function ``sdqes_edge.RetentionStep`` in the graphs for ONNX Runtime (export/fused_retention.py).
Without the kernel library ONNX Runtime runs the function's body: the same kernels and numbers as before. With it
(runtime/ort_ops), the step is one kernel that passes over the state once: on the CPU here, on the CUDA provider
where one is (skipped here with the reason)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import assert_same_stream, random_model, step_graph_forms
from onnx import TensorProto, helper, numpy_helper

from sdqes_edge.contract import FUSED_OPS_DOMAIN, ONNX_RUNTIME_OPERATORS
from sdqes_edge.export.fused_ops import inline_fused_functions
from sdqes_edge.export.fused_retention import RETENTION_STEP, fuse_retention_steps, retention_step_function
from sdqes_edge.runtime.fused_ops import FusedOps, load_fused_ops
from sdqes_edge.runtime.kernels import count_kernels

BLOCKS, PER_BLOCK = 2, 2  # the tiny preset's image tower, two adapters a block
ADAPTERS = BLOCKS * PER_BLOCK
# The traced step's kernels on ONNX Runtime's CPU, each run as it is: Split, Gather, three Muls, two Adds, three
# Unsqueezes, MatMul, Squeeze.
BODY_KERNELS = 12


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    """tiny + RetNet, two adapters a block, two streams: plain fp32, fp32 with ONNX Runtime's operators, fp16."""
    return step_graph_forms(random_model("retnet", per_block=PER_BLOCK), tmp_path_factory.mktemp("graphs"))


def frame_shape() -> tuple:
    size = random_model("retnet").cfg.vision.image_size
    return (2, 3, size, size)


def retention_nodes(path: Path) -> list:
    return [n for n in onnx.load(str(path)).graph.node if n.domain == FUSED_OPS_DOMAIN and n.op_type == RETENTION_STEP]


def test_each_retention_step_is_one_function_node_in_the_graphs_for_onnx_runtime_and_none_in_the_plain_graph(graphs):
    for form in ("fp32", "fp16"):
        graph = onnx.load(str(graphs[form]))
        nodes = retention_nodes(graphs[form])
        assert len(nodes) == ADAPTERS, form
        assert {o for n in nodes for o in n.output if o.startswith("state_out.")} == {
            o.name for o in graph.graph.output if o.name.startswith("state_out.")}  # each writes its adapter's state
        assert [(f.domain, f.name) for f in graph.functions] == [(FUSED_OPS_DOMAIN, RETENTION_STEP)]
        assert not any(n.op_type in ("Gather", "Squeeze") for n in graph.graph.node), form  # inside the function
        onnx.checker.check_model(graph, full_check=True)
    assert not retention_nodes(graphs["plain"]) and not onnx.load(str(graphs["plain"])).functions


def test_without_the_library_onnx_runtime_runs_the_functions_body_with_the_same_numbers(graphs):
    assert_same_stream((graphs["plain"], graphs["fp32"]), frame_shape(), frames=16, atol=2e-6)
    by_op = count_kernels(graphs["fp32"]).by_op
    assert by_op["Gather"] == ADAPTERS and RETENTION_STEP not in by_op


def test_with_the_library_each_retention_step_is_one_kernel_and_the_numbers_are_the_same(graphs, kernel_library):
    inlined, fused = count_kernels(graphs["fp32"]), count_kernels(graphs["fp32"], fused_ops=kernel_library)
    assert fused.by_op[RETENTION_STEP] == ADAPTERS and not {"Gather", "Squeeze", "Unsqueeze"} & set(fused.by_op)
    assert inlined.per_step - fused.per_step == ADAPTERS * (BODY_KERNELS - 1)
    assert_same_stream((graphs["plain"], graphs["fp32"]), frame_shape(), frames=16, atol=2e-6,
                       second_options={"fused_ops": kernel_library.path})


def test_the_fp16_kernel_follows_the_fp16_body_over_a_stream(graphs, kernel_library):
    """One rounding to fp16 per element instead of one per operator: within fp16's tolerance, state carried."""
    assert_same_stream((graphs["fp16"], graphs["fp16"]), frame_shape(), frames=16, atol=2e-3,
                       second_options={"fused_ops": kernel_library.path})


def test_tensorrt_gets_the_functions_body_in_its_place_with_the_same_numbers(graphs, tmp_path):
    from sdqes_edge.export.tensorrt_ops import as_tensorrt_reads_it

    readable = as_tensorrt_reads_it(onnx.load(str(graphs["fp32"])))
    assert not readable.functions and all(n.domain != FUSED_OPS_DOMAIN for n in readable.graph.node)
    onnx.save(readable, str(tmp_path / "tensorrt.onnx"))
    assert_same_stream((graphs["plain"], tmp_path / "tensorrt.onnx"), frame_shape(), frames=8, atol=2e-6)


def test_an_fp32_graph_exported_with_onnx_runtimes_operators_takes_the_kernel_on_a_cpu(graphs, kernel_library,
                                                                                      tmp_path, capsys):
    """``export --fp32-operators onnxruntime``: the CPU's graph holds the fused steps too, verified against PyTorch
    as the plain one is; int8 is still quantized from the plain graph."""
    from sdqes_edge.export import ExportOptions, export_bundle

    bundle = tmp_path / "bundle"
    result = export_bundle(random_model("retnet", per_block=PER_BLOCK), bundle,
                           ExportOptions(batch=2, precisions=("fp32", "int8"), fp32_operators=ONNX_RUNTIME_OPERATORS,
                                         drift_frames=16, calibration_frames=8, show_progress=False),
                           log=lambda m: None)
    step = result.manifest["graphs"]["step"]
    assert {p: entry["operators"] for p, entry in step.items()} == {"fp32": "onnxruntime", "int8": "onnx"}
    assert step["fp32"]["verification"]["passed"] and result.verification.passed
    assert len(retention_nodes(bundle / "step.fp32.onnx")) == ADAPTERS
    assert not retention_nodes(bundle / "step.int8.onnx")
    assert_same_stream((graphs["plain"], bundle / "step.fp32.onnx"), frame_shape(), frames=12, atol=2e-6,
                       second_options={"fused_ops": kernel_library.path})
    # The kernels the manifest records (and `inspect` prints) are those of the graph the bundle holds, against the
    # image tower alone written the same way, not those of the plain graph it replaced.
    kernels = result.manifest["complexity"]["kernels"]
    assert kernels["operators"] == ONNX_RUNTIME_OPERATORS
    assert kernels["step_graph"]["per_step"] == count_kernels(bundle / "step.fp32.onnx").per_step
    assert kernels["step_graph"]["per_step"] != count_kernels(graphs["plain"]).per_step
    assert kernels["per_adapter"]["kernels"] == (kernels["step_graph"]["per_step"]
                                                 - kernels["image_tower"]["per_step"]) / ADAPTERS
    from sdqes_edge.cli import run

    assert run(["inspect", str(bundle), "--ort-ops", str(kernel_library.path)]) == 0
    said = capsys.readouterr().out
    assert (f"fp32 with ONNX Runtime's fused operators at export: image tower alone "
            f"{kernels['image_tower']['per_step']} kernels") in said
    with_library = count_kernels(bundle / "step.fp32.onnx", fused_ops=kernel_library).per_step
    per_adapter = (with_library - kernels["image_tower"]["per_step"]) / ADAPTERS
    assert f"with libsdqes_ort_ops.so: {with_library} per step" in said
    assert f"; {per_adapter:.1f} per adapter over the image tower alone" in said
    assert per_adapter < kernels["per_adapter"]["kernels"]  # the retention step's twelve kernels are one


def test_a_library_built_before_the_retention_kernel_is_named_with_what_to_do_not_run_as_if_it_had_it(
        graphs, kernel_library, tmp_path, monkeypatch):
    """The graph's description lists its fused operators and the library says which it has kernels for. One built
    before RetentionStep (which cannot say: the first builds had QrnnPool and QrnnScan) would leave ONNX Runtime
    to run the retention steps as their bodies while ``run`` named the library: a warning says so instead."""
    import dataclasses
    import shutil
    import subprocess
    import warnings

    from sdqes_edge.contract import FUSED_OPS
    from sdqes_edge.export.graphs import read_metadata
    from sdqes_edge.runtime import onnxruntime_backend
    from sdqes_edge.runtime.fused_ops import FIRST_OPERATORS
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

    assert read_metadata(graphs["fp16"])["fused_ops"] == [RETENTION_STEP]
    assert "fused_ops" not in read_metadata(graphs["plain"])
    assert kernel_library.operators == FUSED_OPS
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to make the stand-in of a first build")
    source, first_build = tmp_path / "first_build.c", tmp_path / "libfirst_build.so"
    source.write_text("int sdqes_ort_ops_with_cuda(void) { return 0; }\n")  # no sdqes_ort_ops_operators
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(first_build)], check=True)
    assert load_fused_ops(first_build).operators == FIRST_OPERATORS
    # The real library registered, said to be a first build: the retention steps it would lack are named.
    old = dataclasses.replace(kernel_library, operators=FIRST_OPERATORS)
    monkeypatch.setattr(onnxruntime_backend, "load_fused_ops", lambda path: old)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        OnnxRuntimeStep(graphs["fp16"], fused_ops=kernel_library.path)
    assert [str(w.message) for w in said] == [
        f"libsdqes_ort_ops.so has no kernel for {RETENTION_STEP}, which fp16.onnx holds (it was built before it was "
        "added): those nodes run as their ONNX bodies, as without the library; rebuild it with sdqes-edge "
        "build-ort-ops"]


TOKENS, WIDTH = 3, 6  # a hand-made step: three tokens, d = 6 (three channel pairs)


def step_model(swap: np.ndarray) -> onnx.ModelProto:
    """One RetentionStep node over qkv [3, 18] and state [3, 6, 6], its constants from the RetNet adapter's form."""
    rng = np.random.default_rng(1)
    keep, cross = rng.uniform(0.2, 0.5, (WIDTH, 1)), rng.uniform(-0.5, 0.5, (WIDTH, 1))
    initializers = [numpy_helper.from_array(swap.astype(np.int64), "swap"),
                    numpy_helper.from_array(keep.astype(np.float32), "keep"),
                    numpy_helper.from_array(cross.astype(np.float32), "cross")]
    value = helper.make_tensor_value_info
    node = helper.make_node(RETENTION_STEP, ["qkv", "state", "swap", "keep", "cross"], ["out", "state_next"],
                            domain=FUSED_OPS_DOMAIN)
    graph = helper.make_graph([node], "step", [value("qkv", TensorProto.FLOAT, [TOKENS, 3 * WIDTH]),
                                               value("state", TensorProto.FLOAT, [TOKENS, WIDTH, WIDTH])],
                              [value("out", TensorProto.FLOAT, [TOKENS, WIDTH]),
                               value("state_next", TensorProto.FLOAT, [TOKENS, WIDTH, WIDTH])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(
        FUSED_OPS_DOMAIN, 1)], functions=[retention_step_function(17)])
    return model


def run_step(model: onnx.ModelProto, feeds: dict, library: FusedOps | None = None) -> list:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if library is not None:
        options.register_custom_ops_library(str(library.path))
    return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"]).run(None, feeds)


PAIRS = np.arange(WIDTH) ^ 1  # [1, 0, 3, 2, 5, 4]


def test_a_step_computes_the_rotation_and_decay_the_outer_product_and_the_query_product(kernel_library):
    rng = np.random.default_rng(2)
    feeds = {"qkv": rng.standard_normal((TOKENS, 3 * WIDTH)).astype(np.float32),
             "state": rng.standard_normal((TOKENS, WIDTH, WIDTH)).astype(np.float32)}
    model = step_model(PAIRS)
    keep, cross = (numpy_helper.to_array(i) for i in model.graph.initializer[1:])
    q, k, v = np.split(feeds["qkv"].astype(np.float64), 3, axis=-1)
    state = feeds["state"].astype(np.float64)
    want_state = state * keep + state[:, PAIRS] * cross + k[:, :, None] * v[:, None, :]
    want_out = np.einsum("ti,tij->tj", q, want_state)
    results = [run_step(model, feeds, library) for library in (None, kernel_library)]  # the body, the kernel
    for out, state_next in results:
        np.testing.assert_allclose(state_next, want_state, atol=1e-5)
        np.testing.assert_allclose(out, want_out, atol=1e-5)
    # The kernel rounds each operator as the body does (no fused multiply-add): the same state bit for bit. Only
    # out's sum runs in another order than the MatMul's (so over a stream, later adapters see inputs 1e-7 apart).
    np.testing.assert_array_equal(results[1][1], results[0][1])
    assert inline_fused_functions(model) == 1 and not model.functions  # TensorRT's view: the body in its place
    np.testing.assert_allclose(run_step(model, feeds)[1], want_state, atol=1e-5)


def test_the_kernel_refuses_an_index_that_does_not_exchange_each_pair_in_one_line(kernel_library):
    """The kernel reads each row's partner as the pair's other channel: any other index is refused, not misread."""
    rng = np.random.default_rng(3)
    feeds = {"qkv": rng.standard_normal((TOKENS, 3 * WIDTH)).astype(np.float32),
             "state": rng.standard_normal((TOKENS, WIDTH, WIDTH)).astype(np.float32)}
    with pytest.raises(Exception, match="swap must exchange the two channels of each pair") as refused:
        run_step(step_model(np.roll(PAIRS, 2)), feeds, kernel_library)
    assert "RetentionStep" in str(refused.value)


def test_the_inlined_body_is_found_again_and_not_where_a_tensor_inside_it_is_read_elsewhere():
    model = step_model(PAIRS)
    inline_fused_functions(model)
    assert fuse_retention_steps(model) == 1 and [n.op_type for n in model.graph.node] == [RETENTION_STEP]
    model = step_model(PAIRS)
    inline_fused_functions(model)
    partners = next(n.output[0] for n in model.graph.node if n.op_type == "Gather")
    model.graph.output.append(helper.make_tensor_value_info(partners, TensorProto.FLOAT, None))  # read outside
    assert fuse_retention_steps(model) == 0


def test_the_bench_times_the_retnet_step_with_the_retention_kernel_beside_the_same_graph_without(kernel_library,
                                                                                                  tmp_path):
    """``bench --device ... --ort-ops``: a section of its own, last, at one stream and at a few; here on the CPU,
    as --device cpu runs."""
    import dataclasses

    from sdqes_edge.benchmarks.config import QUICK, BenchConfig
    from sdqes_edge.benchmarks.report import markdown
    from sdqes_edge.benchmarks.suite import run

    cfg = dataclasses.replace(BenchConfig(**QUICK), repetitions=3, device="cpu", device_only=True, int8=False,
                              device_batches=(2,), device_scaling_frames=10, scaling_probe=5, e2e_frames=4,
                              device_e2e_frames=4, out=str(tmp_path), ort_ops=str(kernel_library.path))
    results = run(cfg, log=lambda m: None)[0]
    section = results["device"]["retention"]
    assert set(section["rows"]) == {f"retnet/{label}/{b}" for label in ("fp16", "fp16 with sdqes_edge kernels")
                                    for b in (1, 2)}
    assert all(row["step_ms"] > 0 for row in section["rows"].values())
    assert set(section["ratios"]) == {"retnet fp16 at 1 stream: without / with sdqes_edge kernels",
                                      "retnet fp16 at 2 streams: without / with sdqes_edge kernels"}
    on_device = section["kernels_on_device"]
    assert on_device["retnet/fp16"]["ort_nodes"] - on_device["retnet/fp16 with sdqes_edge kernels"]["ort_nodes"] \
        >= ADAPTERS * (BODY_KERNELS - 1)
    assert "| retnet/fp16 with sdqes_edge kernels/1 |" in markdown(results)


CUDA_LIBRARY = Path(__file__).resolve().parents[1] / "build/ort_ops/libsdqes_ort_ops.so"


def test_on_the_gpu_each_retention_step_is_one_kernel_in_a_cuda_graph_and_follows_the_cpu_fp32_step(graphs):
    import onnxruntime

    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
    from sdqes_edge.tolerances import VARIANT_TOLERANCES

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("needs onnxruntime-gpu with the CUDA execution provider (an NVIDIA GPU); the CPU kernel is "
                    "tested here")
    if not CUDA_LIBRARY.is_file() or not load_fused_ops(CUDA_LIBRARY).with_cuda:
        pytest.skip(f"no kernel library with CUDA kernels at {CUDA_LIBRARY}: sdqes-edge build-ort-ops where nvcc is")
    library = load_fused_ops(CUDA_LIBRARY)
    counted = count_kernels(graphs["fp16"], providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                            fused_ops=library)
    assert counted.by_op[RETENTION_STEP] == ADAPTERS and "Gather" not in counted.by_op
    for form in ("fp32", "fp16"):
        gpu, cpu = OnnxRuntimeStep(graphs[form], device="cuda", fused_ops=library.path), OnnxRuntimeStep(
            graphs["plain"])
        assert gpu.cuda_graph, "CUDA graph capture was refused with the retention kernel in the graph"
        rng, tolerance = np.random.default_rng(5), VARIANT_TOLERANCES["fp16"]
        state_gpu, state_cpu = gpu.initial_state(), cpu.initial_state()
        for _ in range(40):  # both bindings replayed many times over, the state carried on the device
            frame = rng.standard_normal(frame_shape()).astype(np.float32)
            got, want = gpu.step(frame, state_gpu), cpu.step(frame, state_cpu)
            assert np.abs(got.embedding - want.embedding).max() <= tolerance["max_abs_embedding"], form
            state_gpu, state_cpu = got.state, want.state
        final_gpu, final_cpu = gpu.state_to_numpy(state_gpu), cpu.state_to_numpy(state_cpu)
        for name, value in final_cpu.items():
            scale = max(1.0, float(np.abs(value).max()))
            assert np.abs(final_gpu[name].astype(np.float32) - value).max() <= 1e-2 * scale, (form, name)
