"""sdqes-run and the C API warn, as `sdqes-edge run` does, of the fp16 graph on their ONNX Runtime backend (the
CPU): no faster than fp32 there, it had run without a word."""

from __future__ import annotations

import subprocess
import sys

from conftest import random_model
from native_fixtures import CApi

from sdqes_edge.export import ExportOptions, Query, export_bundle


def test_sdqes_run_and_the_c_api_warn_of_the_fp16_graph_on_the_cpu_in_sdqes_edge_runs_words(sdqes_run_on_the_cpu,
                                                                                              video, tmp_path, capfd):
    bundle = tmp_path / "fp16"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(precisions=("fp32", "fp16"), show_progress=False,
                                                              fps=5.0, queries=(Query("When I cook", "Cooking"),)),
                  log=lambda m: None)

    def warned(stderr: str, program: str) -> list[str]:
        return [line.removeprefix(f"{program}: ") for line in stderr.splitlines() if "fp16 graph is a GPU" in line]

    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", video,
                           "--precision", "fp16", "--max-frames", "2", "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    python = warned(done.stderr, "sdqes-edge")
    assert len(python) == 1 and python[0].startswith("warning: the fp16 graph is a GPU format")
    native = subprocess.run([str(sdqes_run_on_the_cpu), str(bundle), "--source", video, "--backend", "onnxruntime",
                             "--precision", "fp16", "--max-frames", "2"], capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    assert warned(native.stderr, "sdqes-run") == python
    fp32 = subprocess.run([str(sdqes_run_on_the_cpu), str(bundle), "--source", video, "--backend", "onnxruntime",
                           "--precision", "fp32", "--max-frames", "2"], capture_output=True, text=True, timeout=120)
    assert fp32.returncode == 0 and not warned(fp32.stderr, "sdqes-run")
    api = CApi(sdqes_run_on_the_cpu.parent / "libsdqes.so")  # a C caller's sdqes_step_open, said on stderr
    handle = api.bundle_open(str(bundle).encode(), api.error, len(api.error))
    capfd.readouterr()
    step = api.step_open(handle, b"onnxruntime", b"fp16", 1, api.error, len(api.error))
    assert step, api.said()
    assert capfd.readouterr().err.splitlines() == [f"sdqes: {python[0]}"]
    api.step_close(step)
    api.bundle_close(handle)
