"""``sdqes-edge build-ort-ops`` (runtime/ort_ops/build.sh) finds nvcc where CUDA installs put it and compiles the
kernel library for the GPUs this project deploys to (V100, Jetson Xavier and Orin, Turing to Hopper) as far as
that nvcc can; what it cannot build for is said, not skipped silently. Checked with stand-ins for the nvcc of
CUDA 11.4 (JetPack 5) and CUDA 13, through ``--print-archs``, which stops before compiling anything. The sources
travel in the package, so an installed sdqes-edge builds the library as a checkout does."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "sdqes_edge.cli", "build-ort-ops"]
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
    return subprocess.run([*COMMAND, "--print-archs"], capture_output=True, text=True, env=clean | {"PATH": path} | env)


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


def test_the_package_carries_the_kernels_sources_and_builds_them_where_it_is_installed(tmp_path):
    """The wheel a device installs holds the sources and the build script; built from there, with no checkout."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "wheel"), str(ROOT)], check=True, capture_output=True)
    wheel = zipfile.ZipFile(next((tmp_path / "wheel").glob("sdqes_edge-*.whl")))
    sources = sorted(n for n in wheel.namelist() if n.startswith("sdqes_edge/runtime/ort_ops/"))
    # Every file of the checkout's folder (the CUDA kernels' headers too, which a CPU build does not read).
    assert [n.rsplit("/", 1)[1] for n in sources] == sorted(p.name for p in (ROOT / "runtime/ort_ops").iterdir())
    assert {"qrnn_pool_kernels.cuh", "retention_step_kernels.cuh", "cuda_kernels.cuh"} < {
        n.rsplit("/", 1)[1] for n in sources}
    wheel.extractall(tmp_path / "site", members=sources)
    built = subprocess.run(["bash", str(tmp_path / "site/sdqes_edge/runtime/ort_ops/build.sh"), "--cpu", "--out",
                            str(tmp_path / "lib")], capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "lib/libsdqes_ort_ops.so").is_file()


def test_the_command_ends_with_the_run_that_uses_what_it_built(cpu_kernel_build):
    done, library = cpu_kernel_build  # build-ort-ops --cpu --out DIR
    assert done.returncode == 0, done.stderr
    assert f"--ort-device cpu --ort-ops {library}" in done.stdout  # built without CUDA kernels: the CPU's run


def test_an_output_folder_that_cannot_be_written_is_refused_before_anything_is_built(tmp_path):
    (tmp_path / "file").write_text("")
    done = subprocess.run([*COMMAND, "--out", str(tmp_path / "file")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is a file; give a folder" in done.stderr
