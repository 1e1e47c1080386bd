"""The kernel library's CUDA kernels (runtime/ort_ops/*_kernels.cuh) run here, on the host, as written: compiled
with tests/cuda_emulation, in which one thread walks the launch's grid. Each is checked against what ONNX Runtime
computes for the same node: the library's CPU kernel (bit for bit: the same arithmetic header, no fused
multiply-add on either side) and the fused operator's ONNX body. This is what a machine without a GPU can show of
those kernels: their indexing (rows and halves, a window's frames on its time axis, a token's state rows and their
partners), their grid-stride loops (run again on a grid of 2 x 3 threads, which each stride several times) and
their float16 rounding. The device itself (nvcc's code, the launch, CUDA graphs) is checked by the GPU tests in
test_fused_ops.py and test_fused_retention.py, skipped where there is no GPU."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from sdqes_edge.contract import FUSED_OPS_DOMAIN, QRNN_POOL, QRNN_SCAN, RETENTION_STEP
from sdqes_edge.export.fused_ops import qrnn_pool_function, qrnn_scan_function
from sdqes_edge.export.fused_retention import retention_step_function
from sdqes_edge.runtime.fused_ops import SOURCES, FusedOps

EMULATION = Path(__file__).with_name("cuda_emulation")
OPSET = 17
ALPHA = 1.702  # QuickGELU's
STRIDING_GRID = (2, 3)  # blocks, threads: fewer lanes than any tensor here, so every thread strides
LAUNCH_GRID = (0, 0)  # the launchers' own geometry (blocks_for, kThreads)
ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> ctypes.CDLL:
    """The kernels built for the host; skipped, with the reason, where no g++ with _Float16 (GCC 12 on x86-64 and
    arm64) is at hand."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the CUDA kernels for the host")
    folder = tmp_path_factory.mktemp("emulated")
    probe = folder / "probe.cc"
    probe.write_text("int main() { _Float16 h = static_cast<_Float16>(1.5f); return static_cast<float>(h) != 1.5f; }\n")
    if subprocess.run(["g++", str(probe), "-o", str(folder / "probe")], capture_output=True).returncode != 0:
        pytest.skip("this g++ has no _Float16 (GCC 12 or newer on x86-64 or arm64 has), which stands in for __half")
    library = folder / "libemulated_kernels.so"
    built = subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-Wall", "-Wextra",
                            "-Werror", f"-I{SOURCES}", str(EMULATION / "emulated_kernels.cc"), "-o", str(library)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr  # the kernels' headers must build against the emulation as written
    return ctypes.CDLL(str(library))


def pointer(array: np.ndarray) -> ctypes.c_void_p:
    assert array.flags.c_contiguous
    return ctypes.c_void_p(array.ctypes.data)


def one_node(op: str, function, inputs: dict[str, np.ndarray], outputs: dict[str, tuple], constants=(), **attributes):
    """A model of one ``op`` node (its function's body beside it), over ``inputs`` fed at run time and ``constants``
    held as initializers; its outputs of the inputs' float type."""
    dtype = ONNX_TYPE[next(iter(inputs.values())).dtype.type]
    value = helper.make_tensor_value_info
    node = helper.make_node(op, [*inputs, *(c.name for c in constants)], list(outputs), domain=FUSED_OPS_DOMAIN,
                            **attributes)
    graph = helper.make_graph([node], op, [value(n, dtype, a.shape) for n, a in inputs.items()],
                              [value(n, dtype, shape) for n, shape in outputs.items()], list(constants))
    return helper.make_model(graph, functions=[function], opset_imports=[
        helper.make_opsetid("", OPSET), helper.make_opsetid(FUSED_OPS_DOMAIN, 1)])


def on_onnx_runtime(model, feeds: dict, library: FusedOps | None = None) -> list[np.ndarray]:
    """The model's outputs on ONNX Runtime's CPU: the body's operators, or the library's CPU kernel."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if library is not None:
        options.register_custom_ops_library(str(library.path))
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_kernels_agree(emulated_outputs: list, kernel_outputs: list, body_outputs: list, body_atol: float) -> None:
    """The emulated CUDA kernel computes what the CPU kernel does, bit for bit, and the body to its rounding."""
    for mine, kernel, body in zip(emulated_outputs, kernel_outputs, body_outputs):
        np.testing.assert_array_equal(mine, kernel)
        np.testing.assert_allclose(mine.astype(np.float32), body.astype(np.float32), atol=body_atol)


BODY_ATOL = {np.float32: 2e-6, np.float16: 2e-3}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("grid", [LAUNCH_GRID, STRIDING_GRID], ids=["launch", "striding"])
def test_the_pooling_kernel_reads_each_rows_two_halves_and_computes_what_the_cpu_kernel_does(
        emulated, kernel_library, dtype, grid):
    rng = np.random.default_rng(0)
    width = 5  # r: odd, so that a row's halves are not aligned to anything
    gates = rng.standard_normal((2, 3, 2 * width)).astype(dtype)  # two leading axes, flattened by the kernel
    h = rng.standard_normal((2, 3, width)).astype(dtype)
    out = np.full(h.shape, np.nan, dtype)
    emulated.emulated_qrnn_pool(int(dtype is np.float16), pointer(gates), pointer(h), pointer(out),
                                ctypes.c_int64(h.size), ctypes.c_int64(width), ctypes.c_float(ALPHA), *grid)
    model = one_node(QRNN_POOL, qrnn_pool_function(OPSET, ONNX_TYPE[dtype]), {"gates": gates, "h": h},
                     {"h_next": h.shape}, alpha=ALPHA)
    feeds = {"gates": gates, "h": h}
    assert_kernels_agree([out], on_onnx_runtime(model, feeds, kernel_library), on_onnx_runtime(model, feeds),
                         BODY_ATOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("grid", [LAUNCH_GRID, STRIDING_GRID], ids=["launch", "striding"])
def test_the_scan_kernel_walks_each_lanes_frames_on_the_time_axis_and_computes_what_the_cpu_kernel_does(
        emulated, kernel_library, dtype, grid):
    """gates [outer, T, inner, 2r] with the time axis between the others, as the window graph has it."""
    rng = np.random.default_rng(1)
    outer, frames, inner, width = 2, 4, 3, 5
    gates = rng.standard_normal((outer, frames, inner, 2 * width)).astype(dtype)
    out = np.full((outer, frames, inner, width), np.nan, dtype)
    emulated.emulated_qrnn_scan(int(dtype is np.float16), pointer(gates), pointer(out), ctypes.c_int64(outer),
                                ctypes.c_int64(frames), ctypes.c_int64(inner), ctypes.c_int64(width),
                                ctypes.c_float(ALPHA), *grid)
    model = one_node(QRNN_SCAN, qrnn_scan_function(OPSET, ONNX_TYPE[dtype], frames, axis=1), {"gates": gates},
                     {"h": out.shape}, alpha=ALPHA, axis=1)
    assert_kernels_agree([out], on_onnx_runtime(model, {"gates": gates}, kernel_library),
                         on_onnx_runtime(model, {"gates": gates}), BODY_ATOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("grid", [LAUNCH_GRID, STRIDING_GRID], ids=["launch", "striding"])
def test_the_retention_kernel_walks_each_tokens_state_rows_with_their_partners_as_the_cpu_kernel_does(
        emulated, kernel_library, dtype, grid):
    """qkv [2, 3, 3d] and state [2, 3, d, d], d = 6 (three channel pairs): six tokens, each d lanes."""
    rng = np.random.default_rng(2)
    d = 6
    qkv = rng.standard_normal((2, 3, 3 * d)).astype(dtype)
    state = rng.standard_normal((2, 3, d, d)).astype(dtype)
    keep, cross = rng.uniform(0.2, 0.5, (d, 1)).astype(dtype), rng.uniform(-0.5, 0.5, (d, 1)).astype(dtype)
    out, state_next = np.full((2, 3, d), np.nan, dtype), np.full(state.shape, np.nan, dtype)
    emulated.emulated_retention_step(int(dtype is np.float16), pointer(qkv), pointer(state), pointer(keep),
                                     pointer(cross), pointer(out), pointer(state_next), ctypes.c_int64(6),
                                     ctypes.c_int64(d), *grid)
    constants = [numpy_helper.from_array(np.arange(d, dtype=np.int64) ^ 1, "swap"),
                 numpy_helper.from_array(keep, "keep"), numpy_helper.from_array(cross, "cross")]
    model = one_node(RETENTION_STEP, retention_step_function(OPSET), {"qkv": qkv, "state": state},
                     {"out": out.shape, "state_next": state.shape}, constants)
    feeds = {"qkv": qkv, "state": state}
    kernel, body = on_onnx_runtime(model, feeds, kernel_library), on_onnx_runtime(model, feeds)
    # out sums q R' row by row where the body's MatMul may sum in another order: to its rounding, not bit for bit
    assert_kernels_agree([state_next], kernel[1:], body[1:], BODY_ATOL[dtype])
    np.testing.assert_allclose(out.astype(np.float32), kernel[0].astype(np.float32), rtol=1e-3 if dtype is np.float16
                               else 1e-6, atol=BODY_ATOL[dtype])
    np.testing.assert_allclose(out.astype(np.float32), body[0].astype(np.float32), atol=4 * BODY_ATOL[dtype])
