"""scripts/build_ort_ops.sh finds nvcc where CUDA installs put it and compiles the kernel library for the GPUs
this project deploys to (V100, Jetson Xavier and Orin, Turing to Hopper) as far as that nvcc can; what it
cannot build for is said, not skipped silently. Checked with stand-ins for the nvcc of CUDA 11.4 (JetPack 5)
and CUDA 13, through ``--print-archs``, which stops before compiling anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "scripts/build_ort_ops.sh"
SYSTEM_PATH = "/usr/bin:/bin"  # the tools the script uses, and no nvcc
# What `nvcc --list-gpu-code` prints, by release.
CUDA_11_4 = "sm_35 sm_37 sm_50 sm_52 sm_53 sm_60 sm_61 sm_62 sm_70 sm_72 sm_75 sm_80 sm_86 sm_87"
CUDA_13_0 = "sm_75 sm_80 sm_86 sm_87 sm_88 sm_89 sm_90 sm_100 sm_110 sm_103 sm_120 sm_121"


def fake_nvcc(folder: Path, codes: str | None) -> Path:
    """An nvcc that answers ``--list-gpu-code`` with ``codes`` (None: an nvcc too old to know the flag)."""
    folder.mkdir(parents=True, exist_ok=True)
    nvcc = folder / "nvcc"
    answer = f'printf "%s\\n" {codes}; exit 0' if codes else 'echo "nvcc fatal: Unknown option" >&2; exit 1'
    nvcc.write_text(f'#!/bin/sh\n[ "$1" = --list-gpu-code ] && {{ {answer}; }}\nexit 2\n')
    nvcc.chmod(0o755)
    return nvcc


def print_archs(path: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_ARCHS")}
    return subprocess.run([str(BUILD), "--print-archs"], capture_output=True, text=True,
                          env=clean | {"PATH": path} | env)


def plan(done: subprocess.CompletedProcess) -> dict[str, str]:
    assert done.returncode == 0, done.stderr
    return dict(line.split(": ", 1) for line in done.stdout.splitlines())


@pytest.mark.parametrize("codes, archs, left_out", [
    (CUDA_11_4, "70 72 75 80 86 87", "sm_89 sm_90"),  # JetPack 5: Xavier and Orin, no Ada or Hopper yet
    (CUDA_13_0, "75 80 86 87 89 90", "sm_70 sm_72"),  # V100 and Xavier dropped
    (None, "70 72 75 80 86 87 89 90", None),  # an nvcc that cannot list them is given them all
])
def test_the_default_architectures_are_those_of_the_deployment_gpus_that_the_nvcc_at_hand_compiles_for(
        tmp_path, codes, archs, left_out):
    nvcc = fake_nvcc(tmp_path / "bin", codes)
    done = print_archs(f"{nvcc.parent}:{SYSTEM_PATH}")
    assert plan(done) == {"nvcc": str(nvcc), "archs": archs}
    if left_out:  # said, with what to do
        assert f"cannot compile for {left_out}" in done.stderr and "CUDA_ARCHS" in done.stderr
    else:
        assert "cannot compile" not in done.stderr


def test_cuda_archs_names_the_architectures_whatever_the_nvcc_lists(tmp_path):
    nvcc = fake_nvcc(tmp_path / "bin", CUDA_13_0)
    assert plan(print_archs(f"{nvcc.parent}:{SYSTEM_PATH}", CUDA_ARCHS="72 87"))["archs"] == "72 87"


def test_an_nvcc_off_the_path_is_found_in_cuda_home_as_jetpack_installs_it(tmp_path):
    nvcc = fake_nvcc(tmp_path / "cuda" / "bin", CUDA_11_4)
    assert plan(print_archs(SYSTEM_PATH, CUDA_HOME=str(tmp_path / "cuda")))["nvcc"] == str(nvcc)


def test_without_any_nvcc_the_build_is_of_the_cpu_kernels_and_says_so(tmp_path):
    if Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("this machine has /usr/local/cuda/bin/nvcc, which the script finds whatever PATH says")
    assert plan(print_archs(SYSTEM_PATH)) == {"nvcc": "none (CPU kernels only)"}
