"""fp16 step graphs run each block's attention as one ONNX Runtime Attention node (export/attention_op.py), traced
from the model's own parameters and arithmetic. The node must compute what the plain graph computes: checked
on fp32 graphs, where ONNX Runtime's CPU kernels are exact, over a stream with the state carried, for one stream
(the one-sequence form) and several; and written back as plain ONNX for TensorRT it must be the same again."""

from __future__ import annotations

import json

import onnx
import pytest
from conftest import assert_same_stream, random_model
from conftest import op_counts as ops

from sdqes_edge.contract import FUSED_OPS_DOMAIN, ONNX_RUNTIME_OPERATORS
from sdqes_edge.export.graphs import export_step_graph
from sdqes_edge.export.onnx_runtime_ops import ATTENTION, MS_DOMAIN
from sdqes_edge.export.tensorrt_ops import as_tensorrt_reads_it
from sdqes_edge.model.layers import Attention
from sdqes_edge.runtime.kernels import count_kernels

BLOCKS = 2  # the tiny preset's image tower


@pytest.mark.parametrize("kind, batch", [("qrnn", 1), ("qrnn", 3), ("st", 1), ("none", 2)])
def test_the_attention_node_computes_the_plain_graphs_values_over_a_stream(kind, batch, tmp_path):
    model = random_model(kind, lookback=2) if kind != "none" else random_model(kind)
    plain, fused = tmp_path / "plain.onnx", tmp_path / "fused.onnx"
    export_step_graph(model, plain, batch=batch)
    description = export_step_graph(model, fused, batch=batch, operators=ONNX_RUNTIME_OPERATORS)
    assert description["operators"] == ONNX_RUNTIME_OPERATORS
    assert ops(fused)[ATTENTION] == BLOCKS and ops(plain)[ATTENTION] == 0
    assert "Softmax" not in ops(fused)
    size = model.cfg.vision.image_size
    assert_same_stream((plain, fused), (batch, 3, size, size), frames=16, atol=2e-6)
    # The model it was traced from is the model it was: its blocks' attention unswapped.
    assert all(type(block.attn) is Attention for block in model.visual.transformer.resblocks)


def test_the_fp16_graph_carries_the_attention_node_and_the_fp32_graph_stays_plain_onnx(tmp_path):
    model = random_model("qrnn")
    export_step_graph(model, tmp_path / "fp32.onnx")
    export_step_graph(model, tmp_path / "fp16.onnx", precision="fp16")
    assert ops(tmp_path / "fp16.onnx")[ATTENTION] == BLOCKS
    assert all(n.domain == "" for n in onnx.load(str(tmp_path / "fp32.onnx")).graph.node)
    fp16 = onnx.load(str(tmp_path / "fp16.onnx"))
    assert {n.domain for n in fp16.graph.node if n.op_type == ATTENTION} == {MS_DOMAIN}


def test_on_the_cpu_the_attention_node_runs_fewer_kernels(tmp_path):
    model = random_model("qrnn")
    export_step_graph(model, tmp_path / "plain.onnx")
    export_step_graph(model, tmp_path / "fused.onnx", operators=ONNX_RUNTIME_OPERATORS)
    plain, fused = count_kernels(tmp_path / "plain.onnx"), count_kernels(tmp_path / "fused.onnx")
    assert fused.by_op[ATTENTION] == BLOCKS and "Softmax" not in fused.by_op
    assert fused.per_step < plain.per_step


def test_tensorrt_reads_the_attention_node_written_back_as_the_same_values(tmp_path):
    model = random_model("qrnn", lookback=2)
    plain, fused, readable = tmp_path / "plain.onnx", tmp_path / "fused.onnx", tmp_path / "readable.onnx"
    export_step_graph(model, plain, batch=2)
    export_step_graph(model, fused, batch=2, operators=ONNX_RUNTIME_OPERATORS)
    graph = as_tensorrt_reads_it(onnx.load(str(fused)))
    assert all(n.domain == "" for n in graph.graph.node) and all(o.domain != MS_DOMAIN for o in graph.opset_import)
    onnx.checker.check_model(graph, full_check=True)
    onnx.save(graph, str(readable))
    size = model.cfg.vision.image_size
    assert_same_stream((plain, readable), (2, 3, size, size), frames=12, atol=2e-6)


@pytest.mark.parametrize("fp16_operators", ["onnxruntime", "onnx"])
def test_the_manifest_records_each_graphs_operators_and_plain_onnx_is_kept_on_request(fp16_operators, tmp_path):
    from sdqes_edge.export import ExportOptions, export_bundle

    out = tmp_path / "bundle"
    export_bundle(random_model("qrnn"), out, ExportOptions(precisions=("fp32", "fp16"), drift_frames=16,
                                                           fp16_operators=fp16_operators, show_progress=False),
                  log=lambda m: None)
    step = json.loads((out / "manifest.json").read_text())["graphs"]["step"]
    assert {p: entry["operators"] for p, entry in step.items()} == {"fp32": "onnx", "fp16": fp16_operators}
    fp16_domains = {n.domain for n in onnx.load(str(out / "step.fp16.onnx")).graph.node}
    # (the QRNN pooling steps are this project's functions in the graph for ONNX Runtime: export/fused_ops.py)
    assert fp16_domains == ({"", MS_DOMAIN, FUSED_OPS_DOMAIN} if fp16_operators == "onnxruntime" else {""})
