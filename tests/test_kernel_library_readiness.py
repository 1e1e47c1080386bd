"""Before a session on a GPU registers the kernel library, the library asks CUDA whether its kernels can run there
(``sdqes_ort_ops_cuda_ready``), and a library that cannot is refused in one line that says why and what to do:
a machine with no NVIDIA driver, a driver older than the CUDA the library was built with (a library built with
CUDA 13's nvcc on a machine whose driver stops at 12.4), a GPU the library has no kernels for (a V100 and a
CUDA 13 build). Without this each step's launch would fail, deep inside ONNX Runtime, every frame.

The real library is asked here, on a machine without a GPU; the other answers come from stand-in libraries that
answer as CUDA would on such machines (compiled here from a few lines of C)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sdqes_edge.runtime.fused_ops import FusedOps, cuda_problem, load_fused_ops

STAND_IN = """
int sdqes_ort_ops_cuda_ready(int* runtime, int* driver, int* arch) {
  *runtime = RUNTIME; *driver = DRIVER; *arch = ARCH; return ERROR;
}
const char* sdqes_ort_ops_cuda_error(int error) { return "an error CUDA names"; }
"""


def stand_in(tmp_path: Path, error: int, runtime: int, driver: int, arch: int) -> FusedOps:
    """A library that answers the readiness check as CUDA would: ``error`` (0: ready), versions, the device."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to make the stand-in library")
    source, library = tmp_path / "stand_in.c", tmp_path / f"stand_in-{error}-{driver}-{arch}.so"
    source.write_text(STAND_IN)
    defines = [f"-D{name}={value}" for name, value in
               (("ERROR", error), ("RUNTIME", runtime), ("DRIVER", driver), ("ARCH", arch))]
    subprocess.run(["gcc", "-shared", "-fPIC", *defines, str(source), "-o", str(library)], check=True)
    return FusedOps(library, with_cuda=True)


@pytest.mark.parametrize("answer, words", [
    ((35, 13000, 12040, 0), "was built with CUDA 13.0, newer than this machine's NVIDIA driver supports (CUDA 12.4): "
                            "rebuild it with the nvcc of a CUDA the driver supports (sdqes-edge build-ort-ops)"),
    ((209, 13000, 13000, 70), 'has no kernels for this GPU (sm_70): rebuild it with CUDA_ARCHS="70" sdqes-edge '
                              "build-ort-ops, with an nvcc that compiles for sm_70"),
    ((35, 13000, 0, 0), "CUDA kernels need an NVIDIA driver, which this machine lacks"),
    ((999, 13000, 13000, 90), "CUDA kernels cannot run here: an error CUDA names (CUDA error 999)"),
])
def test_a_library_that_cannot_run_on_the_gpu_is_refused_saying_why_and_what_to_do(tmp_path, answer, words):
    library = stand_in(tmp_path, *answer)
    why = library.usable_on("cuda")
    assert why is not None and words in why and "\n" not in why
    assert library.usable_on("tensorrt") == why  # its CUDA fallback would launch them
    assert library.usable_on("cpu") is None  # the CPU kernels need no GPU


def test_a_library_whose_kernels_can_run_is_taken(tmp_path):
    assert stand_in(tmp_path, 0, 12040, 12040, 87).usable_on("cuda") is None


def test_the_real_library_answers_on_a_machine_without_a_gpu(tmp_path_factory):
    """Built with its CUDA kernels (nvcc), loaded and asked where no GPU is: a sentence, not a crash."""
    out = tmp_path_factory.mktemp("cuda_ops")
    built = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "build-ort-ops", "--out", str(out)],
                           capture_output=True, text=True, env=os.environ | {"CUDA_ARCHS": "75"})  # one: quicker
    if built.returncode != 0:
        pytest.skip(f"the kernel library did not build here: {built.stderr.strip().splitlines()[-3:]}")
    library = load_fused_ops(out / "libsdqes_ort_ops.so")
    if not library.with_cuda:
        pytest.skip("no nvcc here: the library has no CUDA kernels to ask")
    why = cuda_problem(library.path)
    if why is None:
        pytest.skip("this machine has a GPU the library's kernels run on; tests/test_fused_ops.py runs them")
    assert str(library.path) in why and "\n" not in why
    assert "NVIDIA driver" in why or "CUDA error" in why
