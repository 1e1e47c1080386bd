"""What runs is what was asked: ONNX Runtime drops a provider it cannot create (TensorRT without libnvinfer,
CUDA without its libraries) and runs the next; the runtime names that, and keeps the TensorRT provider's engines
where a later run finds them."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import onnxruntime
import pytest

from sdqes_edge.errors import SetupWarning, UserError
from sdqes_edge.package_builds import CUDA_PROVIDER
from sdqes_edge.runtime.ort_sessions import check_providers
from sdqes_edge.runtime.tensorrt_backend import nvidia_gpu_present

GPU_RUNS_HERE = CUDA_PROVIDER in onnxruntime.get_available_providers() and nvidia_gpu_present()
needs_a_gpu = pytest.mark.skipif(not GPU_RUNS_HERE, reason="needs onnxruntime-gpu with the CUDA execution provider "
                                                           "and an NVIDIA GPU")


@pytest.mark.parametrize("library_problem", [None, "libnvinfer.so.10: cannot open shared object file"])
def test_a_provider_onnx_runtime_could_not_create_is_named_never_silently_replaced(library_problem, monkeypatch):
    """Whether the provider's own library is absent (a CPU build) or will not load its dependencies (a GPU
    build without TensorRT), the refusal names the provider in words."""
    import sdqes_edge.runtime.ort_sessions as sessions

    monkeypatch.setattr(sessions, "provider_library_problem", lambda provider: library_problem)
    cpu_only = ["CPUExecutionProvider"]
    with pytest.raises(UserError, match="could not create the CUDA execution provider, CUDAExecutionProvider.*"
                                        "--ort-device cpu"):
        check_providers("cuda", cpu_only)
    with pytest.warns(SetupWarning) as caught:
        check_providers("tensorrt", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    warning = str(caught[0].message)
    assert "TensorRT execution provider" in warning and "libnvinfer" in warning and "CUDA" in warning
    assert len(caught) == 1 and "\n" not in warning
    with pytest.raises(UserError, match="the TensorRT execution provider, TensorrtExecutionProvider"):
        check_providers("tensorrt", cpu_only)
    check_providers("cpu", cpu_only)  # what was asked is what runs: silent


# --- ONNX Runtime's TensorRT provider keeps its engines on disk, keyed by the graph's bytes ------------------------

def test_tensorrt_provider_engines_are_cached_per_graph_content_and_the_first_build_is_announced(
        tmp_path, monkeypatch, capsys):
    import sdqes_edge.runtime.ort_sessions as sessions
    from sdqes_edge.runtime.ort_sessions import tensorrt_cache_options

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(sessions, "provider_library_problem", lambda provider: None)  # as where TensorRT loads
    graph, same, other = tmp_path / "a.onnx", tmp_path / "copy.onnx", tmp_path / "b.onnx"
    graph.write_bytes(b"graph one")
    same.write_bytes(b"graph one")
    other.write_bytes(b"graph two, re-exported")
    options = tensorrt_cache_options(graph)
    folder = options["trt_engine_cache_path"]
    assert folder.startswith(str(tmp_path / "cache" / "sdqes-edge" / "ort-tensorrt"))
    assert options["trt_engine_cache_enable"] == options["trt_timing_cache_enable"] == "True"
    assert options["trt_timing_cache_path"] == folder
    assert "builds engines for a.onnx on first use" in capsys.readouterr().err
    (Path(folder) / "TRTKernel.engine").write_bytes(b"built")  # what the provider leaves there
    assert tensorrt_cache_options(same)["trt_engine_cache_path"] == folder  # same bytes, same engines
    assert capsys.readouterr().err == ""  # nothing to announce once engines are kept
    assert tensorrt_cache_options(other)["trt_engine_cache_path"] != folder  # new weights never load old engines
    assert "builds engines for b.onnx" in capsys.readouterr().err
    monkeypatch.setattr(sessions, "provider_library_problem", lambda provider: "libnvinfer.so.10: cannot open")
    third = tmp_path / "c.onnx"
    third.write_bytes(b"graph three")
    tensorrt_cache_options(third)
    assert capsys.readouterr().err == ""  # where TensorRT cannot load, no engine is built: nothing to announce


def test_without_a_writable_cache_the_tensorrt_provider_builds_every_run_with_a_one_line_warning(
        tmp_path, monkeypatch):
    from sdqes_edge.runtime.ort_sessions import tensorrt_cache_options

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    graph = tmp_path / "a.onnx"
    graph.write_bytes(b"graph")
    with pytest.warns(SetupWarning) as caught:
        assert tensorrt_cache_options(graph) == {}
    warning = str(caught[0].message)
    assert len(caught) == 1 and "\n" not in warning and "XDG_CACHE_HOME" in warning and "every run" in warning


# --- a graph ONNX Runtime's TensorRT provider cannot run whole ------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "cuda", "tensorrt"])
@pytest.mark.parametrize("operators", ["onnx", "onnxruntime", None])
def test_only_the_tensorrt_provider_meeting_onnx_runtimes_fused_operators_is_warned_with_the_fixes(device, operators):
    """The fp16 graph's default form carries com.microsoft operators that TensorRT's parser lacks: ONNX Runtime's
    TensorRT provider then runs the graph in pieces, not as one engine. Said in one line naming both ways to one
    engine, each an option that exists; graphs from before the manifest recorded operators (None) are plain."""
    import argparse

    from sdqes_edge.cli import build_parser
    from sdqes_edge.runtime.ort_releases import fused_operators_warning

    warning = fused_operators_warning(device, operators, "step.fp16.onnx")
    if (device, operators) != ("tensorrt", "onnxruntime"):
        assert warning is None
        return
    assert warning.startswith("step.fp16.onnx carries ONNX Runtime's fused operators") and "\n" not in warning
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert "--fp16-operators onnx" in warning and "onnx" in commands["export"]._option_string_actions[
        "--fp16-operators"].choices
    assert "sdqes-edge build-engine" in warning and "build-engine" in commands
    assert "--backend trt" in warning and "trt" in commands["run"]._option_string_actions["--backend"].choices


# --- A run left on the CPU by default, where the GPU would step it, says so -----------------------------------------

def run_arguments(*argv: str) -> argparse.Namespace:
    """``sdqes-edge run BUNDLE --source clip.mp4 ARGV...`` as the command line reads and checks it."""
    from sdqes_edge.cli import build_parser
    from sdqes_edge.cli.stream import _check_run_args

    args = build_parser().parse_args(["run", "bundle", "--source", "clip.mp4", *argv])
    _check_run_args(args)
    return args


@pytest.mark.parametrize("argv, says", [
    ((), "--ort-device cuda steps on the GPU; add --precision fp16, which this bundle has"),
    (("--precision", "fp16"), "--ort-device cuda steps on the GPU"),
    (("--ort-device", "cpu"), "--precision int8"),  # the CPU was asked for: the CPU's own tip
    (("--ort-device", "cuda"), "--precision fp16 runs 2x fp32"),  # the GPU was asked for: the GPU's own tip
    (("--ort-device", "cuda", "--precision", "fp16"), None),
    (("--backend", "trt"), None),
])
def test_a_run_on_the_cpu_by_default_where_a_gpu_would_step_it_is_pointed_at_the_gpu(argv, says, monkeypatch):
    """The decision and its words, on a machine made to look as if it had a GPU and onnxruntime-gpu (the real
    command on a real one: the test below)."""
    import sdqes_edge.runtime.tensorrt_backend as tensorrt_backend
    from sdqes_edge.cli.run_device import device_tip

    monkeypatch.setattr(tensorrt_backend, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CUDA_PROVIDER, "CPUExecutionProvider"])
    detector = SimpleNamespace(bundle=SimpleNamespace(precisions=["fp32", "fp16", "int8"]))
    tip = device_tip(detector, run_arguments(*argv))
    assert tip is None if says is None else says in tip
    if argv == ("--precision", "fp16"):
        assert "add --precision fp16" not in tip
    without_fp16 = device_tip(SimpleNamespace(bundle=SimpleNamespace(precisions=["fp32"])), run_arguments())
    assert "re-export with --precision fp16" in without_fp16 and "\n" not in without_fp16


def test_a_bench_of_the_cpu_alone_on_a_machine_whose_gpu_would_step_says_how_to_measure_it(monkeypatch):
    import dataclasses

    import sdqes_edge.runtime.tensorrt_backend as tensorrt_backend
    from sdqes_edge.benchmarks.config import BenchConfig
    from sdqes_edge.cli.bench import gpu_left_out_note

    monkeypatch.setattr(tensorrt_backend, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CUDA_PROVIDER, "CPUExecutionProvider"])
    assert "--device cuda measures the GPU beside them" in gpu_left_out_note(BenchConfig())
    assert gpu_left_out_note(dataclasses.replace(BenchConfig(), device="cuda")) is None


def test_without_a_gpu_a_run_and_a_bench_say_nothing_of_one():
    from sdqes_edge.benchmarks.config import BenchConfig
    from sdqes_edge.cli.bench import gpu_left_out_note
    from sdqes_edge.cli.run_device import device_tip

    if GPU_RUNS_HERE:
        pytest.skip("this machine has an NVIDIA GPU and onnxruntime-gpu (the test below runs here)")
    detector = SimpleNamespace(bundle=SimpleNamespace(precisions=["fp32", "fp16"]))
    assert device_tip(detector, run_arguments()) is None
    assert gpu_left_out_note(BenchConfig()) is None


@needs_a_gpu
def test_on_a_gpu_machine_run_says_it_steps_on_the_cpu_unless_asked_and_steps_on_the_gpu_when_asked(tmp_path):
    from runtime_fixtures import write_video

    from sdqes_edge.demo import DEMO_BUNDLE
    from sdqes_edge.sample import sample_frames

    video = write_video(tmp_path / "clip.avi", sample_frames(6, 72, 96), fps=2.0)

    def run(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(DEMO_BUNDLE), "--source",
                               str(video), "--query", "when the lamp turns on", "--quiet", *argv],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stderr

    by_default = run()
    assert "CPUExecutionProvider" in by_default and "--ort-device cuda steps on the GPU" in by_default
    asked = run("--ort-device", "cuda")
    assert "CUDAExecutionProvider" in asked and "tip:" not in asked
