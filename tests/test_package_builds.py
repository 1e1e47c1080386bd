"""Two distributions of one import folder in one environment (sdqes_edge/package_builds.py).

onnxruntime and onnxruntime-gpu install the same `onnxruntime` folder; opencv-python and opencv-python-headless
the same `cv2`. Measured in Python 3.11 venvs: after `pip install onnxruntime-gpu==1.31.1 'sdqes-edge[runtime]'`
the CPU build's files ran and `run --ort-device cuda` said "install onnxruntime-gpu", already installed; after
`pip uninstall onnxruntime` every command ended in "module 'onnxruntime' has no attribute ..." (a traceback); after
`pip uninstall opencv-python` beside opencv-python-headless, cv2 was gone and every command advised
`pip install 'sdqes-edge[runtime]'`, which pip answers "already satisfied". Here a second distribution is
registered the way pip registers one (a .dist-info folder whose RECORD lists the shared files) in a folder put on
the path, and an emptied package is what Python imports for a folder without its __init__.py: a module with
nothing in it.
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
from sdqes_edge.package_builds import CUDA_PROVIDER, installed_builds
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

GPU_VERSION = "1.31.1"
CPU_VERSION = metadata.version("onnxruntime")
needs_cpu_build_alone = pytest.mark.skipif(
    CUDA_PROVIDER in onnxruntime.get_available_providers() or set(installed_builds()) != {"onnxruntime"},
    reason="this environment's onnxruntime is not the CPU build alone (these tests register a GPU build beside it)")


def register(site: Path, distribution: str = "onnxruntime-gpu", version: str = GPU_VERSION,
             package: str = "onnxruntime") -> Path:
    """A folder holding what pip leaves for ``distribution``: its metadata, and a RECORD of the files it shares
    in ``package`` (which are not there)."""
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{package}/__init__.py,,\n{package}/lib.so,,\n"
                                 f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return site


def cli(site: Path, module: str, module_as: str, *argv: str) -> subprocess.CompletedProcess:
    """The command line in a fresh process with ``site`` on the path; ``module_as``: "real", "empty" (the package
    another distribution's uninstall emptied) or "gone" (not importable at all)."""
    stand_in = {"real": "", "empty": f"sys.modules[{module!r}] = types.ModuleType({module!r})\n",
                "gone": f"sys.modules[{module!r}] = None\n"}[module_as]
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
    monkeypatch.syspath_prepend(str(register(tmp_path)))
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
    result = cli(register(tmp_path / "site"), "onnxruntime", "real", "run", str(DEMO_BUNDLE), "--source", str(video),
                 "--query", "the lamp turns on", "--ort-device", "cuda")
    assert result.returncode == 2
    assert result.stderr.startswith(f"sdqes-edge: error: onnxruntime {CPU_VERSION} and onnxruntime-gpu "
                                    f"{GPU_VERSION} are both installed")
    assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("onnxruntime_as", ["empty", "gone"])
def test_a_package_emptied_by_uninstalling_the_other_build_is_named_with_the_reinstall(onnxruntime_as, tmp_path):
    site = register(tmp_path / "site")
    result = cli(site, "onnxruntime", onnxruntime_as, "inspect", str(DEMO_BUNDLE), "--frames", "1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("sdqes-edge: error: ONNX Runtime is broken here: "), result.stderr
    assert result.stderr.rstrip().endswith(f"pip install --force-reinstall --no-deps onnxruntime-gpu=={GPU_VERSION}")
    assert len(result.stderr.splitlines()) == 1


def test_an_absent_onnxruntime_with_no_build_registered_is_still_the_runtime_extra(tmp_path):
    result = cli(tmp_path, "onnxruntime", "gone", "inspect", str(DEMO_BUNDLE), "--frames", "1")
    assert result.returncode == 2
    assert "needs onnxruntime, which is not installed here: pip install 'sdqes-edge[runtime]'" in result.stderr


@pytest.mark.parametrize("cv2_as", ["empty", "gone"])
def test_an_opencv_emptied_by_uninstalling_the_other_wheel_is_named_with_the_reinstall(cv2_as, tmp_path):
    headless = metadata.version("opencv-python-headless")
    site = register(tmp_path / "site", "opencv-python", headless, "cv2")
    result = cli(site, "cv2", cv2_as, "run", str(DEMO_BUNDLE), "--source", "x.mp4", "--query", "the lamp turns on")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"sdqes-edge: error: OpenCV (cv2) is broken here: opencv-python {headless} and "
                             f"opencv-python-headless {headless} are installed, but the files of the cv2 folder are "
                             "gone (uninstalling one of two distributions that share that folder removes them); "
                             "reinstall it: pip install --force-reinstall --no-deps "
                             f"opencv-python-headless=={headless}\n")


@needs_cpu_build_alone
def test_an_onnx_runtime_too_old_for_a_graph_is_updated_within_its_own_build(tmp_path, monkeypatch):
    """`pip install -U onnxruntime` where onnxruntime-gpu runs installs the CPU build beside it, whose files win."""
    from sdqes_edge.runtime.ort_sessions import load_refusal

    too_old = RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Foo(99)")
    assert "update it (pip install -U onnxruntime)" in str(load_refusal(too_old, tmp_path / "g.onnx", "a graph"))

    gpu_only = register(tmp_path / "gpu")
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {"onnxruntime": ["onnxruntime-gpu"]})
    monkeypatch.syspath_prepend(str(gpu_only))
    assert "update it (pip install -U onnxruntime-gpu)" in str(load_refusal(too_old, tmp_path / "g.onnx", "a graph"))

    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(register(tmp_path / "both")))
    assert ("update it (pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu)"
            in str(load_refusal(too_old, tmp_path / "g.onnx", "a graph")))


def test_a_provider_whose_library_will_not_load_is_named_with_the_library_it_lacks(tmp_path, monkeypatch):
    """ONNX Runtime names the missing library (libcublasLt.so.13) only in its own coloured log, which is kept off
    the terminal while a GPU session is made: the one-line refusal names it instead."""
    import sdqes_edge.runtime.ort_sessions as sessions

    (tmp_path / "libonnxruntime_providers_cuda.so").write_bytes(b"not a shared library")
    problem = sessions.provider_library_problem("CUDAExecutionProvider", capi=tmp_path)
    assert problem and "libonnxruntime_providers_cuda.so" in problem  # what the loader said, in one line
    assert sessions.provider_library_problem("TensorrtExecutionProvider", capi=tmp_path) is None  # not there
    assert sessions.provider_library_problem("CPUExecutionProvider", capi=tmp_path) is None  # built in
    missing = "libcublasLt.so.13: cannot open shared object file: No such file or directory"
    monkeypatch.setattr(sessions, "provider_library_problem", lambda provider: missing)
    with pytest.raises(UserError) as refused:
        sessions.check_providers("cuda", ["CPUExecutionProvider"])
    assert ("could not create the CUDA execution provider, CUDAExecutionProvider (its library will not load: "
            f"{missing})") in str(refused.value)


class RecordingOrt:
    """ONNX Runtime's module as far as its log level goes."""

    def __init__(self):
        self.severities = []

    def set_default_logger_severity(self, level: int) -> None:
        self.severities.append(level)


@pytest.mark.parametrize("device", ["cuda", "tensorrt"])
def test_onnx_runtimes_own_fallback_chatter_stays_off_the_terminal_while_a_gpu_session_is_made(device, capsys):
    from sdqes_edge.runtime.ort_sessions import quiet_provider_fallback

    ort = RecordingOrt()
    with quiet_provider_fallback(ort, device):
        print("*************** EP Error ***************")  # what ONNX Runtime prints on a provider it drops
    assert capsys.readouterr().out == ""
    assert ort.severities == [4, 2]  # its log: fatal only while the session is made, then its default again
    cpu = RecordingOrt()
    with quiet_provider_fallback(cpu, "cpu"):
        print("a CPU session's words are its own")
    assert capsys.readouterr().out == "a CPU session's words are its own\n" and cpu.severities == []
