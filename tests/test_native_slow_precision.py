"""sdqes-run warns, as `sdqes-edge run` does, of the fp16 graph on its ONNX Runtime backend (the CPU): no faster
than fp32 there, it had run without a word."""

from __future__ import annotations

import subprocess
import sys

from conftest import random_model

from sdqes_edge.export import ExportOptions, Query, export_bundle


def test_sdqes_run_warns_of_the_fp16_graph_on_the_cpu_in_sdqes_edge_runs_words(sdqes_run_on_the_cpu, video, tmp_path):
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
