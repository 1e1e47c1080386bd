"""Two ONNX Runtime builds in one environment (sdqes_edge/onnxruntime_builds.py).

onnxruntime and onnxruntime-gpu install the same `onnxruntime` folder. Measured in a Python 3.11 venv with
`pip install onnxruntime-gpu==1.31.1 'sdqes-edge[runtime]'`: both were installed, the CPU build's files ran, and
`run --ort-device cuda` said "install onnxruntime-gpu"; after `pip uninstall onnxruntime` every command ended in
"module 'onnxruntime' has no attribute ..." (a traceback). Here a second build is registered the way pip
registers one (a .dist-info folder whose RECORD lists the shared files) in a folder put on the path, and the
emptied package is what Python imports for a folder without its __init__.py: a module with nothing in it.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import onnxruntime
import pytest

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.onnxruntime_builds import CUDA_PROVIDER, installed_builds
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

GPU_VERSION = "1.31.1"
CPU_VERSION = metadata.version("onnxruntime")
needs_cpu_build_alone = pytest.mark.skipif(
    CUDA_PROVIDER in onnxruntime.get_available_providers() or set(installed_builds()) != {"onnxruntime"},
    reason="this environment's onnxruntime is not the CPU build alone (these tests register a GPU build beside it)")


def register_gpu_build(site: Path) -> Path:
    """A folder holding what pip leaves for onnxruntime-gpu: its metadata, and a RECORD of the shared files."""
    info = site / f"onnxruntime_gpu-{GPU_VERSION}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: {GPU_VERSION}\n")
    (info / "RECORD").write_text("onnxruntime/__init__.py,,\nonnxruntime/capi/onnxruntime_pybind11_state.so,,\n"
                                 f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return site


def cli(site: Path, onnxruntime_as: str, *argv: str) -> subprocess.CompletedProcess:
    """The command line in a fresh process with ``site`` on the path; ``onnxruntime_as``: "real", "empty" (the
    package another build's uninstall emptied) or "gone" (not importable at all)."""
    stand_in = {"real": "", "empty": "sys.modules['onnxruntime'] = types.ModuleType('onnxruntime')\n",
                "gone": "sys.modules['onnxruntime'] = None\n"}[onnxruntime_as]
    code = (f"import sys, types\nsys.path.insert(0, {str(site)!r})\n{stand_in}"
            f"from sdqes_edge.cli import run\nsys.exit(run({list(argv)!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@needs_cpu_build_alone
def test_asking_a_cpu_build_for_cuda_says_to_replace_it_with_the_gpu_build_not_to_add_one():
    with pytest.raises(UserError) as refused:
        OnnxRuntimeStep(DEMO_BUNDLE / "step.fp32.onnx", device="cuda")
    assert str(refused.value).startswith(f"this onnxruntime is the CPU build (onnxruntime {CPU_VERSION}): it has no "
                                         "CUDAExecutionProvider")
    assert "pip uninstall -y onnxruntime && pip install 'sdqes-edge[gpu]'" in str(refused.value)


@needs_cpu_build_alone
def test_two_builds_sharing_the_folder_are_named_with_the_commands_that_leave_one(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(register_gpu_build(tmp_path)))
    assert installed_builds() == {"onnxruntime": CPU_VERSION, "onnxruntime-gpu": GPU_VERSION}
    for device in ("cuda", "tensorrt"):
        with pytest.raises(UserError) as refused:
            OnnxRuntimeStep(DEMO_BUNDLE / "step.fp32.onnx", device=device)
        words = str(refused.value)
        assert words.startswith(f"onnxruntime {CPU_VERSION} and onnxruntime-gpu {GPU_VERSION} are both installed and "
                                "share one onnxruntime folder")
        assert f"pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu=={GPU_VERSION}" in words
        assert "install sdqes-edge[gpu], not [runtime]" in words


@needs_cpu_build_alone
def test_the_command_line_refuses_the_mixed_install_in_one_line(tmp_path):
    video = tmp_path / "none.mp4"  # never opened: the backend is made first
    result = cli(register_gpu_build(tmp_path / "site"), "real", "run", str(DEMO_BUNDLE), "--source", str(video),
                 "--query", "the lamp turns on", "--ort-device", "cuda")
    assert result.returncode == 2
    assert result.stderr.startswith(f"sdqes-edge: error: onnxruntime {CPU_VERSION} and onnxruntime-gpu "
                                    f"{GPU_VERSION} are both installed")
    assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("onnxruntime_as", ["empty", "gone"])
def test_a_package_emptied_by_uninstalling_the_other_build_is_named_with_the_reinstall(onnxruntime_as, tmp_path):
    result = cli(register_gpu_build(tmp_path / "site"), onnxruntime_as, "inspect", str(DEMO_BUNDLE), "--frames", "1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("sdqes-edge: error: ONNX Runtime is broken here: "), result.stderr
    assert result.stderr.rstrip().endswith(f"pip install --force-reinstall --no-deps onnxruntime-gpu=={GPU_VERSION}")
    assert len(result.stderr.splitlines()) == 1


def test_an_absent_onnxruntime_with_no_build_registered_is_still_the_runtime_extra(tmp_path):
    result = cli(tmp_path, "gone", "inspect", str(DEMO_BUNDLE), "--frames", "1")
    assert result.returncode == 2
    assert "needs onnxruntime, which is not installed here: pip install 'sdqes-edge[runtime]'" in result.stderr
