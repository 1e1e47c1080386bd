"""This project's own ONNX Runtime kernels (runtime/ort_ops): loading the library and registering it in a session.

The graphs for ONNX Runtime write each QRNN adapter's pooling step as the model-local ONNX function
``sdqes_edge.QrnnPool``, a sliding window's pooling over its frames as ``sdqes_edge.QrnnScan``
(export/fused_ops.py), and each RetNet adapter's retention step as ``sdqes_edge.RetentionStep``
(export/fused_retention.py). ONNX Runtime runs a function by its body (six kernels for a pooling step, twelve for a
retention step) unless a registered kernel claims it; ``libsdqes_ort_ops.so`` has one kernel for each on the CPU
and, where built with CUDA, on the CUDA provider. The library is built from source on the machine that runs it
(sdqes-edge build-ort-ops) and used only where the user names it (``--ort-ops PATH``,
``OnnxRuntimeStep(fused_ops=PATH)``): a bundle never makes us load code, and nothing is picked up from the
environment.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

from sdqes_edge.contract import FUSED_OPS, ONNX_RUNTIME_OPERATORS, QRNN_POOL, QRNN_SCAN
from sdqes_edge.errors import SetupWarning, UserError

BUILD_COMMAND = "sdqes-edge build-ort-ops"
DEFAULT_LIBRARY = Path("build/ort_ops/libsdqes_ort_ops.so")  # where BUILD_COMMAND writes it (current folder)
SOURCES = Path(__file__).with_name("ort_ops")  # the kernels' sources and build.sh, in the package as in a checkout


# What a library built before it said which operators it has kernels for has: the QRNN pooling's two.
FIRST_OPERATORS = (QRNN_POOL, QRNN_SCAN)


@dataclass(frozen=True)
class FusedOps:
    """A loadable kernel library: its path, whether its kernels include the CUDA provider's, and the operators it
    has kernels for (a library built before an operator existed runs that operator's nodes as their bodies)."""

    path: Path
    with_cuda: bool
    operators: tuple[str, ...] = FUSED_OPS

    def usable_on(self, device: str) -> str | None:
        """Why the library cannot serve a session on ``device`` ("cpu", "cuda", "tensorrt"), or None."""
        if device == "cpu":
            return None
        if not self.with_cuda:
            return (f"{self.path} was built without CUDA kernels: on {device} its CPU kernels would take each fused "
                    f"step off the GPU (copies around it, no CUDA graph); rebuild it where nvcc is "
                    f"({BUILD_COMMAND}) or run without --ort-ops")
        return cuda_problem(self.path)


# CUDA's error codes that this check words itself (cuda_runtime_api.h's cudaError_t).
CUDA_INSUFFICIENT_DRIVER = 35
CUDA_NO_KERNEL_IMAGE = (98, 209)  # cudaErrorInvalidDeviceFunction, cudaErrorNoKernelImageForDevice


def cuda_version_words(version: int) -> str:
    """CUDA's version number in words: 12040 -> '12.4'."""
    return f"{version // 1000}.{version % 1000 // 10}"


@functools.lru_cache(maxsize=None)
def cuda_problem(path: Path) -> str | None:
    """Why the library's CUDA kernels cannot run on this machine's GPU (the library asks CUDA itself), or None:
    asked once per library, before a session registers it, so that the user reads why instead of a failed
    launch in every step."""
    library = ctypes.CDLL(str(path))
    library.sdqes_ort_ops_cuda_error.restype = ctypes.c_char_p
    runtime, driver, arch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    error = library.sdqes_ort_ops_cuda_ready(ctypes.byref(runtime), ctypes.byref(driver), ctypes.byref(arch))
    if error == 0:
        return None
    if error == CUDA_INSUFFICIENT_DRIVER and driver.value == 0:
        return (f"{path}'s CUDA kernels need an NVIDIA driver, which this machine lacks; run without --ort-ops, or "
                "on an NVIDIA GPU")
    if error == CUDA_INSUFFICIENT_DRIVER:
        return (f"{path} was built with CUDA {cuda_version_words(runtime.value)}, newer than this machine's NVIDIA "
                f"driver supports (CUDA {cuda_version_words(driver.value)}): rebuild it with the nvcc of a CUDA the "
                f"driver supports ({BUILD_COMMAND}), or update the driver")
    if error in CUDA_NO_KERNEL_IMAGE:
        return (f"{path} has no kernels for this GPU (sm_{arch.value}): rebuild it with CUDA_ARCHS=\"{arch.value}\" "
                f"{BUILD_COMMAND}, with an nvcc that compiles for sm_{arch.value}")
    words = library.sdqes_ort_ops_cuda_error(error).decode(errors="replace")
    return f"{path}'s CUDA kernels cannot run here: {words} (CUDA error {error}); run without --ort-ops"


def load_fused_ops(path: str | Path) -> FusedOps:
    """The library at ``path``, loaded once to ask what it was built with; a one-line UserError if it is missing
    or does not load (built for another machine, or with CUDA where no CUDA runtime is)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no kernel library at {path}: build it with {BUILD_COMMAND} (a C++ compiler; nvcc for the "
                        "CUDA kernels), or run without --ort-ops")
    try:
        library = ctypes.CDLL(str(path.resolve()))
        with_cuda = bool(library.sdqes_ort_ops_with_cuda())
    except (OSError, AttributeError) as exc:
        raise UserError(f"cannot load the kernel library {path} ({exc}): rebuild it on this machine with "
                        f"{BUILD_COMMAND}, or run without --ort-ops") from None
    return FusedOps(path.resolve(), with_cuda, _operators_of(library))


def _operators_of(library: ctypes.CDLL) -> tuple[str, ...]:
    """The operators ``library`` has kernels for, as it says; FIRST_OPERATORS where it is too old to say."""
    try:
        listed = library.sdqes_ort_ops_operators
    except AttributeError:
        return FIRST_OPERATORS
    listed.restype = ctypes.c_char_p
    return tuple(name for name in listed().decode().split(",") if name)


class MissingKernelsWarning(SetupWarning):
    """The library registered has no kernel for some of the graph's fused operators (it was built before them), so
    ONNX Runtime runs those nodes as their bodies. A program scoring with many sessions says it once and filters
    it in the rest (``sdqes-edge score``)."""


def missing_kernels_words(fused: FusedOps | None, graph_operators: list[str] | None, graph_name: str) -> str | None:
    """What to say where the graph holds fused operators (``description["fused_ops"]``) that the library has no
    kernel for, built before them: ONNX Runtime runs those nodes as their bodies, as without the library, and
    nothing else would say so. None where there is nothing to say."""
    missing = sorted(set(graph_operators or ()) - set(fused.operators)) if fused is not None else []
    if not missing:
        return None
    return (f"{fused.path.name} has no kernel for {', '.join(missing)}, which {graph_name} holds (it was built "
            f"before {'they were' if len(missing) > 1 else 'it was'} added): those nodes run as their ONNX "
            f"bodies, as without the library; rebuild it with {BUILD_COMMAND}")


def register_fused_ops(options, fused: FusedOps, device: str) -> None:
    """Register ``fused`` in ``options`` (an ``onnxruntime.SessionOptions``) for a session on ``device``."""
    if why := fused.usable_on(device):
        raise UserError(why)
    try:
        options.register_custom_ops_library(str(fused.path))
    except Exception as exc:  # ONNX Runtime raises its own types; the library says why (an old ONNX Runtime)
        raise UserError(f"ONNX Runtime refused the kernel library {fused.path}: {str(exc).strip().splitlines()[-1]}"
                        ) from None


def idle_library_words(fused: FusedOps | None, operators: str | None, graph_name: str) -> str | None:
    """What to say where the library is registered for a graph that cannot use it: only the graphs written with
    ONNX Runtime's operators (``description["operators"]``; the fp16 graph by default) hold the functions it
    runs. None where there is nothing to say."""
    if fused is None or operators == ONNX_RUNTIME_OPERATORS:
        return None
    return (f"{graph_name} is plain ONNX, which holds none of the operators {fused.path.name} runs; they are in the "
            "graphs with ONNX Runtime's operators (the fp16 graph by default: --precision fp16; an fp32 one where "
            "the bundle was exported with --fp32-operators onnxruntime)")
