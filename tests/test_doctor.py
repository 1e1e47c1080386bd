"""`sdqes-edge doctor`: what this machine can run, each missing piece with what installs it, each broken one marked
FIX with its fix and a non-zero exit (sdqes_edge/doctor.py).

The machine's own state is read as it is; the states a device gets into (the base install alone, two ONNX
Runtime builds in one folder, an emptied cv2, a kernel library that does not load) are made for real in a fresh
process, as tests/test_package_builds.py and tests/test_layers_and_cli.py make them for the other commands."""

from __future__ import annotations

import json

import cv2
import numpy
import onnxruntime
import pytest
from test_layers_and_cli import cli_on_the_base_install
from test_package_builds import GPU_VERSION, needs_cpu_build_alone, register
from test_package_builds import cli as cli_with_site

from sdqes_edge.cli import run
from sdqes_edge.package_builds import CUDA_PROVIDER, installed_builds
from sdqes_edge.runtime.tensorrt_backend import nvidia_gpu_present

CAN_RUN_ON_THE_CPU = "run bundles on the CPU"
HAS_CUDA = CUDA_PROVIDER in onnxruntime.get_available_providers() and nvidia_gpu_present()


def doctor(capsys, *argv: str) -> tuple[int, str, str]:
    code = run(["doctor", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def finding_line(out: str, topic: str) -> str:
    return next(line for line in out.splitlines() if line[6:].startswith(topic + " "))


def test_the_report_names_what_this_machine_has_and_what_it_can_do(capsys):
    code, out, err = doctor(capsys)
    assert finding_line(out, "numpy").split()[-1] == numpy.__version__
    assert cv2.__version__ in finding_line(out, "OpenCV")
    assert "videos: FFMPEG" in finding_line(out, "OpenCV")  # pip's wheels read files through FFmpeg
    # and streams, with this project's timeouts (tests/test_stream_timeouts.py)
    assert finding_line(out, "OpenCV").endswith("; stream URLs: FFMPEG, given up after 10 s without a frame "
                                                  "(run --stream-timeout)")
    runtime_line = finding_line(out, "ONNX Runtime")
    assert onnxruntime.__version__ in runtime_line and "CPUExecutionProvider" in runtime_line
    assert f"yes {CAN_RUN_ON_THE_CPU}" in out
    fixes = [line for line in out.splitlines() if line.startswith("  FIX")]
    assert code == (1 if fixes else 0)  # the exit status says whether anything here is broken
    assert (err.count("\n") == 1 and "each FIX line above says what to do" in err) if fixes else err == ""


@pytest.mark.skipif(installed_builds() != {"onnxruntime": onnxruntime.__version__} or HAS_CUDA,
                    reason="this machine's onnxruntime is not the CPU build alone, or it has an NVIDIA GPU")
def test_on_a_cpu_machine_the_gpu_rows_say_no_and_nothing_is_broken(capsys):
    code, out, _ = doctor(capsys)
    assert code == 0 and out.rstrip().endswith("next: sdqes-edge demo   (the shipped model on a synthetic stream)")
    assert "(onnxruntime, the CPU build)" in finding_line(out, "ONNX Runtime")
    assert "no  run bundles on the GPU (--ort-device cuda)" in out


def test_the_json_report_holds_the_same_findings(capsys):
    code, out, _ = doctor(capsys, "--json")
    report = json.loads(out)
    topics = [f["topic"] for f in report["findings"]]
    assert topics[:3] == ["numpy", "OpenCV", "ONNX Runtime"] and "export" in topics
    assert report["findings"][0]["detail"] == numpy.__version__
    assert report["can"][CAN_RUN_ON_THE_CPU] is True
    assert code == (1 if any(f["ok"] is False for f in report["findings"]) else 0)


def test_on_the_base_install_it_names_the_extras_and_is_not_an_error():
    """`pip install sdqes-edge` alone: no OpenCV, ONNX Runtime or torch. Missing is not broken: exit 0."""
    result = cli_on_the_base_install("sys.exit(run(['doctor']))")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for topic, extra in (("OpenCV", "runtime"), ("ONNX Runtime", "runtime"), ("export", "export")):
        row = lines.index(finding_line(result.stdout, topic))
        assert lines[row].startswith("  --") and lines[row + 1].endswith(f"-> pip install 'sdqes-edge[{extra}]'")
    assert "no  run bundles on the CPU" in result.stdout
    assert result.stdout.rstrip().endswith("next: pip install 'sdqes-edge[runtime]'   (then sdqes-edge demo)")


@needs_cpu_build_alone
def test_two_onnx_runtime_builds_where_the_cpu_one_runs_are_broken(tmp_path):
    """pip install onnxruntime-gpu 'sdqes-edge[runtime]': the CPU build's files won, so --ort-device cuda cannot."""
    result = cli_with_site(register(tmp_path), "onnxruntime", "real", "doctor")
    assert result.returncode == 1
    assert result.stderr.startswith("sdqes-edge: error: 1 thing(s) here will fail or run elsewhere than asked: "
                                    "ONNX Runtime;")
    assert finding_line(result.stdout, "ONNX Runtime").startswith("  FIX")
    assert (f"pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu=={GPU_VERSION}"
            in result.stdout)
    assert "yes run bundles on the CPU" in result.stdout  # the CPU build's files run there


def test_an_opencv_another_uninstall_emptied_is_reported_not_refused(tmp_path):
    """Every other command refuses to start with an empty cv2 folder; doctor is where the user learns why."""
    result = cli_with_site(tmp_path, "cv2", "empty", "doctor")
    assert result.returncode == 1
    assert finding_line(result.stdout, "OpenCV").startswith("  FIX") and "the cv2 folder is empty" in result.stdout
    assert "pip install --force-reinstall --no-deps opencv-python" in result.stdout
    assert finding_line(result.stdout, "ONNX Runtime").startswith("  ok")  # the rest is still reported
    assert "no  run bundles on the CPU" in result.stdout  # the runtime reads its sources with OpenCV


def test_the_kernel_library_is_checked_where_it_is_named(cpu_kernel_build, tmp_path, capsys):
    built, library = cpu_kernel_build
    if built.returncode != 0:
        pytest.skip(f"the kernel library did not build here: {built.stderr.strip().splitlines()[-3:]}")
    code, out, _ = doctor(capsys, "--ort-ops", str(library))
    assert finding_line(out, "kernel library").startswith("  ok") and "CPU kernels (built without nvcc)" in out

    garbage = tmp_path / "libsdqes_ort_ops.so"
    garbage.write_bytes(b"not a shared library")
    code, out, err = doctor(capsys, "--ort-ops", str(garbage))
    assert code == 1 and finding_line(out, "kernel library").startswith("  FIX")
    assert "-> cannot load the kernel library" in out and "kernel library" in err
    code, out, err = doctor(capsys, "--json", "--ort-ops", str(garbage))
    library_finding = next(f for f in json.loads(out)["findings"] if f["topic"] == "kernel library")
    assert code == 1 and library_finding["ok"] is False and "cannot load the kernel library" in library_finding["fix"]
    assert err.endswith('kernel library; its "fix" in each finding with "ok": false says what to do\n')

    code, out, _ = doctor(capsys, "--ort-ops", str(tmp_path / "none.so"))
    assert finding_line(out, "kernel library").startswith("  --") and "-> sdqes-edge build-ort-ops" in out


@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu with the CUDA execution provider and an NVIDIA GPU")
def test_on_a_gpu_machine_a_cuda_session_is_made_and_said_to_run(capsys):
    _, out, _ = doctor(capsys)
    assert finding_line(out, "NVIDIA GPU").startswith("  ok")
    assert finding_line(out, "ONNX Runtime on the GPU").startswith("  ok") and "a CUDA session runs" in out
    assert "yes run bundles on the GPU (--ort-device cuda)" in out
