"""What the exported graphs cost and where they can run: MACs/parameters, TensorRT operators, engines."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
from conftest import random_model

from sdqes_edge.config import preset
from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.export.complexity import count_graph
from sdqes_edge.export.graphs import export_step_graph
from sdqes_edge.export.tensorrt_engine import nvidia_gpu_present
from sdqes_edge.export.tensorrt_ops import unsupported_ops
from sdqes_edge.model import SDQESModel

# Published figures for CLIP ViT-B/16's image tower at 224px (DESIGN.md section 3).
B16_PARAMETERS = 86.2e6
B16_MACS = 17.6e9


def within(value: float, target: float, fraction: float) -> bool:
    return abs(value - target) <= fraction * target


def test_clip_b16_image_tower_counts_within_2_percent_of_the_published_figures(tmp_path):
    path = tmp_path / "b16.onnx"
    export_step_graph(SDQESModel(preset("clip-vit-b16")).eval(), path)
    counted = count_graph(path)
    assert within(counted.parameters, B16_PARAMETERS, 0.02), counted.parameters
    assert within(counted.macs, B16_MACS, 0.02), counted.macs
    assert counted.flops == 2 * counted.macs
    assert counted.macs_by_category["conv"] == 196 * 768 * (3 * 16 * 16)  # the patch embedding
    assert counted.macs_by_category["matmul_activations"] == 12 * 2 * 12 * 197 * 197 * 64  # q.k^T and p.v


@pytest.mark.parametrize("kind", ["mlp", "st", "qrnn", "retnet"])
def test_adapters_are_counted_apart_from_the_tower(kind, tmp_path):
    model = random_model(kind)
    result = export_bundle(model, tmp_path / kind, ExportOptions(show_progress=False), log=lambda m: None)
    complexity = result.manifest["complexity"]["per_frame"]
    adapter_params = sum(p.numel() for n, p in model.visual.named_parameters() if ".adapter" in n)
    tower_params = sum(p.numel() for n, p in model.visual.named_parameters() if ".adapter" not in n)
    assert complexity["adapters"]["parameters"] == adapter_params
    assert complexity["image_tower"]["parameters"] == tower_params
    assert complexity["adapters"]["macs"] > 0


@pytest.mark.parametrize("opset, tensorrt", [(17, (8, 6)), (16, (8, 5))])
def test_every_operator_of_every_graph_is_one_tensorrt_parses(opset, tensorrt, tmp_path):
    """Step graphs for every adapter kind and precision, and the text graph, on TensorRT 8.6 / 8.5."""
    seen = set()
    for kind in ("none", "mlp", "st", "qrnn", "retnet"):
        out = tmp_path / f"{kind}-{opset}"
        export_bundle(random_model(kind), out, ExportOptions(opset=opset, precisions=("fp32", "fp16", "int8"),
                                                             drift_frames=16, show_progress=False),
                      log=lambda m: None)
        for graph in out.glob("*.onnx"):
            ops = {n.op_type for n in onnx.load(str(graph)).graph.node}
            assert unsupported_ops(ops, tensorrt) == {}, graph.name
            seen |= ops
    assert {"QuantizeLinear", "DequantizeLinear", "MatMul", "Conv"} <= seen
    assert ("LayerNormalization" in seen) == (opset == 17)


def test_an_operator_tensorrt_lacks_is_reported_with_the_fix():
    assert "not supported" in unsupported_ops({"NonZero"})["NonZero"]
    assert "--opset 16" in unsupported_ops({"LayerNormalization"}, (8, 5))["LayerNormalization"]


def tensorrt_available() -> bool:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return nvidia_gpu_present()


@pytest.mark.skipif(tensorrt_available(), reason="this machine has an NVIDIA GPU with TensorRT")
def test_build_engine_without_a_gpu_says_what_is_missing(tmp_path):
    bundle = tmp_path / "b"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(show_progress=False), log=lambda m: None)
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "build-engine", str(bundle)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert ("no NVIDIA GPU" in done.stderr or "TensorRT is not installed" in done.stderr), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (bundle / "engines").exists()


@pytest.mark.skipif(not tensorrt_available(), reason="needs an NVIDIA GPU with TensorRT and pycuda installed")
def test_build_engine_on_an_nvidia_gpu_writes_the_engine_and_its_sidecar(tmp_path):
    import json

    from sdqes_edge.export.tensorrt_engine import build_engine

    bundle = tmp_path / "b"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(show_progress=False), log=lambda m: None)
    engine = build_engine(bundle, precision="fp16")
    sidecar = json.loads(engine.with_suffix(".json").read_text())
    assert engine.stat().st_size > 0 and sidecar["precision"] == "fp16"
    assert (engine.parent / "timing.cache").is_file()
    assert engine.parent.name.endswith(f"trt{sidecar['tensorrt_version']}")
