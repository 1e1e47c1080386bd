"""int8 that ships for recurrent models: the backbone policy keeps every recurrence in float.

The policy is checked on the graph itself (which products carry QDQ, whether any quantization lies on an
adapter's loop from its state input to its state output), on what ONNX Runtime runs (every quantized product
fused, no weight dequantized per frame), and by equivalence with fp32 over a long stream with the state carried.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from conftest import random_model

from sdqes_edge.errors import UserError
from sdqes_edge.export import ExportOptions, export_bundle, graphs
from sdqes_edge.export.drift import compare_variant, run_stream
from sdqes_edge.export.precision import (
    BACKBONE_PRODUCTS_PER_BLOCK,
    QuantizationPolicyError,
    TowerShape,
    quantize_int8,
)
from sdqes_edge.runtime.kernels import count_kernels
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.sample import sample_frames

RECURRENT_KINDS = ("st", "qrnn", "retnet")


def frames_for(model, count: int) -> np.ndarray:
    return Preprocessor.from_config(model.cfg).batch(sample_frames(count))[:, None]  # [N, 1, 3, R, R]


LONG_STREAM = 2000


@pytest.fixture(scope="module")
def long_stream() -> np.ndarray:
    """LONG_STREAM preprocessed frames of the built-in sample, [N, 1, 3, R, R], made once for the module (about 10 s
    on 2 cores, most of it drawing the sample's noise): every adapter kind shares the tiny tower's preprocessing."""
    return frames_for(random_model("none"), LONG_STREAM)


@pytest.fixture(scope="module")
def fp32_graphs(tmp_path_factory):
    """kind -> (model, fp32 step graph) for every adapter kind."""
    out = {}
    for kind in ("none", "mlp") + RECURRENT_KINDS:
        model = random_model(kind)
        path = tmp_path_factory.mktemp(kind) / "step.fp32.onnx"
        graphs.export_step_graph(model, path)
        out[kind] = (model, path)
    return out


def quantized_nodes(graph) -> set[str]:
    """Nodes that consume a DequantizeLinear output: the products the int8 graph computes from int8 values."""
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    return {n.name for n in graph.node if n.op_type != "QuantizeLinear" and any(i in dequantized for i in n.input)}


def ops_on_state_loops(graph, state_names: list[str]) -> set[str]:
    """Op types on any path from ``state_in.X`` to ``state_out.X``: each adapter's own recurrence."""
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producers = {out: node for node in graph.node for out in node.output}
    ops = set()
    for name in state_names:
        forward, frontier = set(), [f"state_in.{name}"]
        while frontier:
            for node in consumers.get(frontier.pop(), []):
                if node.name not in forward:
                    forward.add(node.name)
                    frontier.extend(node.output)
        backward, frontier = set(), [f"state_out.{name}"]
        while frontier:
            node = producers.get(frontier.pop())
            if node is not None and node.name not in backward:
                backward.add(node.name)
                frontier.extend(node.input)
        ops |= {n.op_type for n in graph.node if n.name in forward & backward}
    return ops


@pytest.mark.parametrize("kind", RECURRENT_KINDS)
def test_the_backbone_policy_keeps_every_adapter_recurrence_float(fp32_graphs, tmp_path, kind):
    model, fp32 = fp32_graphs[kind]
    state_names = [t.name for t in model.state_spec(1)]
    frames = frames_for(model, 8)
    quantize_int8(fp32, tmp_path / "backbone.onnx", frames, policy="backbone", float_blocks=0)
    quantize_int8(fp32, tmp_path / "all.onnx", frames, policy="all-weights")
    backbone = onnx.load(str(tmp_path / "backbone.onnx")).graph
    everything = onnx.load(str(tmp_path / "all.onnx")).graph
    assert not {"QuantizeLinear", "DequantizeLinear"} & ops_on_state_loops(backbone, state_names)
    if kind == "qrnn":  # its gates are weight products on the loop (ST shifts a history, RetNet's are activations')
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops_on_state_loops(everything, state_names)
    assert len(quantized_nodes(backbone)) == BACKBONE_PRODUCTS_PER_BLOCK * model.cfg.vision.layers
    assert len(quantized_nodes(everything)) > len(quantized_nodes(backbone))


def test_the_backbone_policy_can_keep_the_first_blocks_float(fp32_graphs, tmp_path):
    model, fp32 = fp32_graphs["qrnn"]
    quantize_int8(fp32, tmp_path / "all-blocks.onnx", frames_for(model, 8))
    result = quantize_int8(fp32, tmp_path / "first-float.onnx", frames_for(model, 8), float_blocks=1)
    every_block = quantized_nodes(onnx.load(str(tmp_path / "all-blocks.onnx")).graph)
    first_float = quantized_nodes(onnx.load(str(tmp_path / "first-float.onnx")).graph)
    assert len(every_block) == BACKBONE_PRODUCTS_PER_BLOCK * model.cfg.vision.layers
    assert result.float_blocks == 1
    assert len(first_float) == result.quantized_products == BACKBONE_PRODUCTS_PER_BLOCK * (model.cfg.vision.layers - 1)
    # The ones left float are the first block's: the four products that run first.
    order = [n.name for n in onnx.load(str(fp32)).graph.node]
    first_block = every_block - first_float
    assert len(first_block) == BACKBONE_PRODUCTS_PER_BLOCK
    assert max(order.index(n) for n in first_block if n in order) < min(order.index(n) for n in first_float
                                                                        if n in order)
    with pytest.raises(QuantizationPolicyError, match="--int8-float-blocks"):
        quantize_int8(fp32, tmp_path / "none.onnx", frames_for(model, 4), float_blocks=model.cfg.vision.layers)


def activation_zero_points(path) -> list[np.ndarray]:
    """Zero points of the QuantizeLinear nodes that quantize activations (weights are stored quantized)."""
    graph = onnx.load(str(path)).graph
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    return [initializers[n.input[2]] for n in graph.node if n.op_type == "QuantizeLinear"]


def test_activations_are_uint8_with_zero_points_by_default_and_int8_at_zero_when_symmetric(fp32_graphs, tmp_path):
    model, fp32 = fp32_graphs["qrnn"]
    quantize_int8(fp32, tmp_path / "asymmetric.onnx", frames_for(model, 8))
    quantize_int8(fp32, tmp_path / "symmetric.onnx", frames_for(model, 8), activations="symmetric")
    asymmetric, symmetric = activation_zero_points(tmp_path / "asymmetric.onnx"), activation_zero_points(
        tmp_path / "symmetric.onnx")
    assert asymmetric and all(z.dtype == np.uint8 for z in asymmetric) and any(z.any() for z in asymmetric)
    assert symmetric and all(z.dtype == np.int8 and not z.any() for z in symmetric)


def quantized_weights(path) -> list[np.ndarray]:
    """The int8 weights the graph stores: 8-bit initializers a DequantizeLinear reads (biases are int32)."""
    graph = onnx.load(str(path)).graph
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    stored = [initializers[n.input[0]] for n in graph.node
              if n.op_type == "DequantizeLinear" and n.input[0] in initializers]
    return [w for w in stored if w.dtype.itemsize == 1]


@pytest.mark.parametrize("activations", ["asymmetric", "symmetric"])
def test_weights_are_seven_bit_so_cpus_without_vnni_cannot_saturate(fp32_graphs, tmp_path, activations):
    # ONNX Runtime's x86 kernels without VNNI sum pairs of uint8 x int8 products in 16 bits: 2 * 255 * 127
    # overflows it, 2 * 255 * 64 does not.
    model, fp32 = fp32_graphs["qrnn"]
    record = quantize_int8(fp32, tmp_path / "int8.onnx", frames_for(model, 8), activations=activations)
    weights = quantized_weights(tmp_path / "int8.onnx")
    assert len(weights) == BACKBONE_PRODUCTS_PER_BLOCK * model.cfg.vision.layers
    assert all(w.dtype == np.int8 for w in weights)
    assert max(int(np.abs(w.astype(np.int16)).max()) for w in weights) <= 64
    assert record.weight_bits == 7 and "7-bit weights" in record.summary()


@pytest.mark.parametrize("kind", ("none", "mlp") + RECURRENT_KINDS)
def test_onnx_runtime_runs_every_quantized_product_fused(fp32_graphs, tmp_path, kind):
    """No product runs in float from weights dequantized every frame (what made int8 slower than fp32)."""
    model, fp32 = fp32_graphs[kind]
    result = quantize_int8(fp32, tmp_path / "int8.onnx", frames_for(model, 8))
    executed = count_kernels(tmp_path / "int8.onnx").by_op
    assert executed.get("QGemm", 0) + executed.get("MatMulIntegerToFloat", 0) == result.quantized_products
    # What is still dequantized per step: LayerNorm biases that the tracer shares with a quantized Gemm bias
    # (zeros of a random init), never a weight matrix.
    optimized = onnx.load(str(tmp_path / "int8.onnx"))
    matrices = {i.name for i in optimized.graph.initializer if len(i.dims) >= 2}
    dequantized_matrices = [n for n in optimized.graph.node
                            if n.op_type == "DequantizeLinear" and n.input[0] in matrices]
    assert executed.get("DequantizeLinear", 0) <= executed.get("LayerNormalization", 0)
    assert dequantized_matrices  # they exist in the file; ONNX Runtime folds them into QGemm


def test_a_graph_that_is_not_the_towers_is_refused_by_the_backbone_policy(fp32_graphs, tmp_path):
    model, fp32 = fp32_graphs["qrnn"]
    wrong = TowerShape(width=model.cfg.vision.width, layers=model.cfg.vision.layers + 1)
    with pytest.raises(QuantizationPolicyError, match="all-weights"):
        quantize_int8(fp32, tmp_path / "int8.onnx", frames_for(model, 4), tower=wrong)


@pytest.mark.parametrize("width", [192, 48])  # 3 * 8 * 8 pixels a patch: the width (ViT-B/16's case), 4x it (B/32's)
def test_the_patch_embedding_stays_float_where_it_has_a_blocks_shape(tmp_path, width):
    from sdqes_edge.model import SDQESModel

    cfg = random_model("qrnn").cfg
    cfg = dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, width=width))
    model = SDQESModel(cfg).eval()
    graphs.export_step_graph(model, tmp_path / "fp32.onnx")
    result = quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", frames_for(model, 4))
    assert result.quantized_products == BACKBONE_PRODUCTS_PER_BLOCK * cfg.vision.layers
    fp32 = onnx.load(str(tmp_path / "fp32.onnx")).graph
    first_product = next(n for n in fp32.node if n.op_type == "MatMul")
    weight = next(i for i in fp32.initializer if i.name == first_product.input[1])
    assert list(weight.dims) == [3 * 8 * 8, width]  # the patch embedding, a block's shape
    assert first_product.name not in quantized_nodes(onnx.load(str(tmp_path / "int8.onnx")).graph)


@pytest.mark.parametrize("kind", RECURRENT_KINDS)
def test_int8_follows_fp32_over_2000_frames_with_the_state_carried(fp32_graphs, long_stream, tmp_path, kind):
    model, fp32 = fp32_graphs[kind]
    quantize_int8(fp32, tmp_path / "int8.onnx", frames_for(model, 64))
    assert Preprocessor.from_config(model.cfg) == Preprocessor.from_config(random_model("none").cfg)  # its frames
    reference = run_stream(OnnxRuntimeStep(fp32), long_stream, "fp32")
    variant = run_stream(OnnxRuntimeStep(tmp_path / "int8.onnx"), long_stream, "int8")
    queries = np.random.default_rng(0).standard_normal((4, model.cfg.embed_dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    report = compare_variant("int8", reference, variant, queries, threshold=0.5)
    assert report.min_cosine >= 0.99, report.summary()
    # Every next-state tensor after LONG_STREAM frames, against its own scale.
    for name, expected in reference.final_state.items():
        scale = max(1.0, float(np.abs(expected).max()))
        assert np.abs(variant.final_state[name] - expected).max() / scale < 0.05, name


def test_the_manifest_records_the_policy_and_what_it_kept_float(tmp_path):
    model = random_model("qrnn")
    result = export_bundle(model, tmp_path / "b", ExportOptions(precisions=("int8",), drift_frames=64,
                                                                calibration_frames=16, show_progress=False),
                           log=lambda m: None)
    entry = result.manifest["graphs"]["step"]["int8"]
    assert entry["quantization"]["policy"] == "backbone"
    # auto: every block int8 first, kept because it passed the drift check.
    assert entry["quantization"]["quantized_products"] == BACKBONE_PRODUCTS_PER_BLOCK * model.cfg.vision.layers
    assert entry["quantization"]["activations"] == "asymmetric" and entry["quantization"]["float_blocks"] == 0
    assert entry["quantization"]["float_products"] > 0 and entry["quantization"]["calibration_frames"] == 16
    metadata = json.loads(next(p.value for p in onnx.load(str(tmp_path / "b" / "step.int8.onnx")).metadata_props))
    assert metadata["quantization"] == entry["quantization"]
    # TensorRT builds only symmetric int8: a CPU int8 graph is refused before any GPU is looked for, with the fix.
    from sdqes_edge.export.tensorrt_engine import build_engine

    with pytest.raises(UserError, match="re-export with --precision int8 --int8-activations symmetric"):
        build_engine(tmp_path / "b", "int8")


def test_int8_options_are_checked_up_front_and_ignored_with_a_warning_without_int8():
    from sdqes_edge.export.exporter import check_options

    warnings: list[str] = []
    check_options(ExportOptions(int8_policy="all-weights"), warnings.append)
    assert any("--int8-policy" in w and "ignoring" in w for w in warnings)
    with pytest.raises(UserError, match="--calibration-method"):
        check_options(ExportOptions(precisions=("int8",), calibration_method="kl"), warnings.append)
    with pytest.raises(UserError, match="--calibration-frames"):
        check_options(ExportOptions(precisions=("int8",), calibration_frames=0), warnings.append)
    with pytest.raises(UserError, match="--int8-float-blocks"):
        check_options(ExportOptions(precisions=("int8",), int8_float_blocks=-1), warnings.append)
    with pytest.raises(UserError, match="--int8-activations"):
        check_options(ExportOptions(precisions=("int8",), int8_activations="int4"), warnings.append)
    warnings.clear()
    check_options(ExportOptions(int8_activations="symmetric"), warnings.append)
    assert warnings == ["--int8-activations is only used for int8, which this export does not write; ignoring it "
                        "(add --precision int8 to write it)"]  # only the option given is named
    warnings.clear()
    check_options(ExportOptions(calibration_frames=64), warnings.append)  # it went unsaid
    assert len(warnings) == 1 and warnings[0].startswith("--calibration-frames is only used for int8")


def test_keeping_every_block_float_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "export", "--preset", "tiny", "--adapter", "qrnn",
                           "--precision", "int8", "--int8-float-blocks", "2", "--drift-frames", "16",
                           "--calibration-frames", "4", "--quiet", "--out", str(tmp_path / "b")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    refusal = [line for line in done.stderr.splitlines() if not line.startswith("sdqes-edge: warning:")]
    assert len(refusal) == 1 and "--int8-float-blocks must be from 0 to 1" in refusal[0]  # warnings aside
    assert not (tmp_path / "b").exists()


def test_auto_float_blocks_quantizes_again_with_one_more_block_float_until_the_drift_check_passes(tmp_path,
                                                                                                  monkeypatch):
    """A bar no graph meets (cosine above 1) makes every try fail: each is made and measured, then refused."""
    from sdqes_edge.export.drift import VerificationError
    from sdqes_edge.tolerances import VARIANT_TOLERANCES

    monkeypatch.setitem(VARIANT_TOLERANCES, "int8", {"min_cosine": 1.01, "max_abs_embedding": 1.0})
    model = random_model("qrnn")  # 2 blocks: tries 0, then 1 leading block float
    messages: list[str] = []
    options = ExportOptions(precisions=("int8",), drift_frames=32, calibration_frames=8, show_progress=False)
    with pytest.raises(VerificationError, match="with up to 1 leading block"):
        export_bundle(model, tmp_path / "b", options, log=messages.append)
    summaries = [m for m in messages if "weight products int8" in m]
    assert len(summaries) == 2 and "(4 in the first block)" in summaries[1]
    assert any("quantizing again with 1 leading block(s) float" in m for m in messages)
    assert not (tmp_path / "b").exists()
    # An explicit count is one try.
    messages.clear()
    with pytest.raises(VerificationError):
        export_bundle(model, tmp_path / "b", dataclasses.replace(options, int8_float_blocks=1), log=messages.append)
    assert len([m for m in messages if "weight products int8" in m]) == 1


def test_requantizing_remakes_only_the_int8_graph_of_a_bundle_and_keeps_the_original_until_it_passes(tmp_path):
    from sdqes_edge.export.requantize import requantize_int8
    from sdqes_edge.runtime.bundle import load_bundle

    model = random_model("qrnn")
    original = tmp_path / "original"
    export_bundle(model, original, ExportOptions(precisions=("int8",), drift_frames=64, calibration_frames=16,
                                                 show_progress=False), log=lambda m: None)
    # Stand in for a graph an earlier version made: the manifest says 8-bit weights.
    manifest = json.loads((original / "manifest.json").read_text())
    manifest["graphs"]["step"]["int8"]["quantization"]["weight_bits"] = 8
    (original / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "secret.txt").write_text("not the bundle's")
    (original / "leak.txt").symlink_to(tmp_path / "secret.txt")  # a link out of the bundle is never followed
    before = {p.name: p.read_bytes() for p in original.iterdir() if p.is_file() and not p.is_symlink()}

    options = ExportOptions(drift_frames=64, calibration_frames=16, show_progress=False)
    (tmp_path / "photos").mkdir()  # a folder of the user's is never the one replaced
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(UserError, match="is a non-empty directory that is not a bundle"):
        requantize_int8(original, tmp_path / "photos", options, log=lambda m: None)
    assert (tmp_path / "photos" / "cat.jpg").is_file()
    report = requantize_int8(original, tmp_path / "new", options, log=lambda m: None)
    assert report.passed and report.frames == 64
    bundle = load_bundle(tmp_path / "new")  # every file matches the manifest's sha256
    entry = bundle.manifest["graphs"]["step"]["int8"]
    assert entry["quantization"]["weight_bits"] == 7 and entry["verification"]["min_cosine"] == report.min_cosine
    assert (tmp_path / "new" / "step.fp32.onnx").read_bytes() == before["step.fp32.onnx"]
    assert not (tmp_path / "new" / "leak.txt").exists() and "leak.txt" not in bundle.manifest["files"]
    assert {p.name: p.read_bytes() for p in original.iterdir() if p.is_file() and not p.is_symlink()} == before

    # A graph that cannot pass (a bar nothing meets) leaves the bundle it would have replaced as it was.
    import sdqes_edge.export.drift as drift

    strict = {**drift.VARIANT_TOLERANCES, "int8": {"min_cosine": 1.0 + 1e-9, "max_abs_embedding": 0.0}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(drift, "VARIANT_TOLERANCES", strict)
        with pytest.raises(UserError, match="drifts beyond its tolerance"):
            requantize_int8(original, original, options, log=lambda m: None)
    assert {p.name: p.read_bytes() for p in original.iterdir() if p.is_file() and not p.is_symlink()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind


@pytest.mark.parametrize("video_frames, count, batch", [(30, 20, 1), (8, 20, 2)])  # long enough; short: cycled
def test_calibration_and_drift_frames_of_a_video_are_its_frames_preprocessed_in_order_cycled_and_staggered(
        tmp_path, video_frames, count, batch):
    """Read into one array as they come (a list of 2,000 ViT-B/16 frames and its stacked copy were 2.4 GB)."""
    from runtime_fixtures import write_video

    from sdqes_edge.config import preset
    from sdqes_edge.export.exporter import _frames
    from sdqes_edge.runtime.sources import frames_spread_over
    from sdqes_edge.sample import STREAM_OFFSET_FRAMES

    cfg = preset("tiny")
    video = write_video(tmp_path / "kitchen.avi", sample_frames(video_frames, 96, 128, seed=4))
    needed = count + STREAM_OFFSET_FRAMES * (batch - 1)
    read = [Preprocessor.from_config(cfg)(image) for image in frames_spread_over(video, needed)]
    expected = np.stack([read[i % len(read)] for i in range(needed)])
    streams = _frames(cfg, count, batch, video)
    assert streams.shape == (count, batch) + expected.shape[1:]
    for b in range(batch):
        np.testing.assert_array_equal(streams[:, b], expected[STREAM_OFFSET_FRAMES * b:][:count])


def test_a_videos_frames_are_held_once_while_they_are_read(tmp_path):
    import tracemalloc

    from runtime_fixtures import write_video

    from sdqes_edge.config import preset
    from sdqes_edge.export.exporter import _frames
    from sdqes_edge.sample import preprocessed_bytes

    cfg = preset("clip-vit-b16")  # 224 px: the preprocessed frames outweigh everything else
    video = write_video(tmp_path / "kitchen.avi", sample_frames(150, 96, 128, seed=4))
    tracemalloc.start()
    try:
        _frames(cfg, 150, 1, video)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    held = preprocessed_bytes(150, cfg.vision.image_size)
    assert peak < 1.5 * held, f"{peak / 2**20:.0f} MiB at the peak for {held / 2**20:.0f} MiB of frames"
