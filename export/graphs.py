"""Trace the model into ONNX graphs: the stateful single-step graph and the text encoder.

The step graph follows DESIGN.md section 3's contract: inputs ``frame``
[B,3,R,R], ``state_in.<name>`` in state-spec order, optionally
``query_embeddings`` [Q,E]; outputs ``embedding`` [B,E], optionally ``logits``
[B,Q], then ``state_out.<name>`` in the same order. Shapes are static. The
graph describes itself in ``metadata_props`` under one key, so a bare .onnx
is enough to build the initial state.
"""

from __future__ import annotations

import copy
import json
import platform
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

import sdqes_edge
from sdqes_edge.config import ModelConfig, receptive_field
from sdqes_edge.contract import (
    DEFAULT_OPSET,
    EMBEDDING_OUTPUT,
    FP16,
    FP32,
    FUSED_OPS_DOMAIN,
    GRAPH_FORMAT_VERSION,
    GRAPH_OPERATORS,
    METADATA_KEY,
    ONNX_RUNTIME_OPERATORS,
    PLAIN_ONNX_OPERATORS,
    QUERY_EMBEDDING_OUTPUT,
    STATE_DTYPES,
    TOKEN_INPUT,
    WINDOW_INPUT,
    step_io_names,
)
from sdqes_edge.files import parse_json
from sdqes_edge.model import SDQESModel
from sdqes_edge.model.adapters import STAdapter
from sdqes_edge.model.layers import cast
from sdqes_edge.package_builds import load_onnxruntime

from .attention_op import use_onnx_runtime_attention
from .carried_biases import carry_biases_to_readers
from .fused_ops import fuse_qrnn_pools
from .fused_retention import fuse_retention_steps
from .gemm_bias import (
    fold_bias_into_concat,
    fold_bias_into_wide_products,
    merge_sibling_products,
    split_gemm_bias,
)
from .graph_edits import drop_unused_opsets, fold_constant_arithmetic, static_shapes
from .joined_products import join_summed_products, mask_rows_before_products
from .onnx_runtime_ops import fuse_skip_layer_norm

PRECISION_DTYPES = {FP32: torch.float32, FP16: torch.float16}


def tool_versions() -> dict[str, str]:
    import onnx
    onnxruntime = load_onnxruntime()
    return {sdqes_edge.__name__: sdqes_edge.__version__, "torch": torch.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "python": platform.python_version()}


def compute_model(model: SDQESModel, precision: str, device: str = "cpu") -> SDQESModel:
    """``model`` with its weights and compute in ``precision`` on ``device``: the model itself where it already
    is that (fp32 on the CPU), else a copy, so the caller's model never moves (``Module.to`` works in place).

    LayerNorm's statistics stay fp32 (``LayerNorm``: one node whose mean and variance are float whatever its
    input dtype), and so does the scores' softmax sum (``Attention.rows``), so the fp16 graph only drops
    precision where it is safe.
    """
    if precision == FP32 and device == "cpu":
        return model.eval()
    return copy.deepcopy(model).to(device, PRECISION_DTYPES[precision]).eval()


class StepGraph(nn.Module):
    """``ImageTower.step_rows`` with flat tensor arguments: the frame in and the embedding (and logits) out in
    fp32 whatever runs inside, the state in and out in the dtype it is computed in (``STATE_DTYPES``) and in
    each tensor's ``graph_shape``."""

    def __init__(self, model: SDQESModel, fused_queries: bool, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.visual = model.visual
        self.fused_queries = fused_queries
        self.dtype = dtype

    def forward(self, frame: torch.Tensor, *rest: torch.Tensor):
        state = list(rest[:-1] if self.fused_queries else rest)  # each in its graph shape (StateTensorSpec)
        embedding, next_state = self.visual.step_rows(cast(frame, self.dtype), state)
        embedding = cast(embedding, torch.float32)
        outputs = [embedding]
        if self.fused_queries:
            outputs.append(embedding @ rest[-1].transpose(0, 1))  # cosine logits [B, Q]
        return tuple(outputs + next_state)



class WindowGraph(nn.Module):
    """The sliding-window baseline: the window form over the last W frames, keeping the newest embedding; the
    frames in and the embedding out in fp32 whatever runs inside, as in ``StepGraph``."""

    def __init__(self, model: SDQESModel, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.visual = model.visual
        self.dtype = dtype

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        newest = self.visual.forward_clip(cast(frames, self.dtype))[:, -1]  # [B, W, 3, R, R] -> [B, E]
        return cast(newest, torch.float32)


class TextGraph(nn.Module):
    def __init__(self, model: SDQESModel):
        super().__init__()
        self.text = model.text

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.text(token_ids)


def describe_step_graph(model: SDQESModel, *, batch: int, opset: int, precision: str, fps: float,
                        query_count: int | None, checkpoint_sha256: str | None) -> dict[str, Any]:
    """The JSON a step graph carries in its metadata (and the manifest repeats)."""
    cfg: ModelConfig = model.cfg
    spec = model.state_spec(batch, STATE_DTYPES[precision])
    inputs, outputs = step_io_names(spec.names, query_count is not None)
    return {
        "format_version": GRAPH_FORMAT_VERSION,
        "kind": "step",
        "precision": precision,
        "model": cfg.to_dict(),
        "preprocess": cfg.to_dict()["preprocess"],
        "image_size": cfg.vision.image_size,
        "embed_dim": cfg.embed_dim,
        "batch": batch,
        "fps": fps,
        "opset": opset,
        "query_count": query_count,
        "state": spec.to_list(),
        "state_bytes": spec.nbytes,
        "inputs": inputs,
        "outputs": outputs,
        "receptive_field": receptive_field(cfg),
        "tool_versions": tool_versions(),
        "checkpoint_sha256": checkpoint_sha256,
    }


def attach_metadata(path: Path, description: dict[str, Any], rewrite: Callable[[Any], object] | None = None) -> None:
    """Store ``description`` in the graph at ``path``; ``rewrite`` (a function of the ``onnx.ModelProto``), if
    given, is applied in the same load and save."""
    import onnx

    graph = onnx.load(str(path))
    if rewrite is not None:
        rewrite(graph)
    fused = sorted({node.op_type for node in graph.graph.node if node.domain == FUSED_OPS_DOMAIN})
    if fused:  # the operators the kernel library runs: the runtime names those a library built before them lacks
        description["fused_ops"] = fused
    del graph.metadata_props[:]
    entry = graph.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(description, sort_keys=True, allow_nan=False)
    graph.producer_name, graph.producer_version = "sdqes-edge", sdqes_edge.__version__
    drop_unused_opsets(graph)
    onnx.save(graph, str(path))


def read_metadata(path: Path) -> dict[str, Any]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False)
    for entry in graph.metadata_props:
        if entry.key == METADATA_KEY:
            return parse_json(entry.value)
    raise KeyError(f"{path} carries no {METADATA_KEY!r} metadata")


def _torch_export(module: nn.Module, args: tuple, path: Path, opset: int, inputs: list[str], outputs: list[str],
                  dynamic_axes: dict | None = None) -> None:
    # The TorchScript-based exporter gives static, fully folded graphs without onnxscript;
    # its deprecation and tracer warnings are about dynamic control flow, which these graphs have none of.
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset, input_names=inputs,
                          output_names=outputs, dynamic_axes=dynamic_axes, do_constant_folding=True)


def export_step_graph(model: SDQESModel, path: Path, *, batch: int = 1, opset: int = DEFAULT_OPSET,
                      precision: str = FP32, query_count: int | None = None, fps: float = 1.0,
                      checkpoint_sha256: str | None = None, trace_device: str = "cpu",
                      operators: str | None = None) -> dict[str, Any]:
    """Trace the single-step graph to ``path``; returns its description (also stored in the graph).

    ``trace_device``: where the trace runs the model once. The graph is the same wherever it is traced, but an
    fp16 trace on a CPU is slow (PyTorch emulates fp16 products there: 2 minutes for ViT-B/16 at 32 streams on
    two cores), so the GPU benchmark traces on its GPU. Exports whose weights are checked stay on the CPU.

    ``operators`` (``GRAPH_OPERATORS``; default: ``default_operators(precision)``): with ONNX Runtime's fused
    operators, each block's attention is one Attention node (export/attention_op.py) and each residual is added
    inside the LayerNorm that reads it (export/onnx_runtime_ops.py); else plain ONNX only.
    """
    operators = checked_form(precision, operators)
    spec = model.state_spec(batch, STATE_DTYPES[precision])
    inputs, outputs = step_io_names(spec.names, query_count is not None)
    _torch_export(*step_graph_trace(model, batch, precision, query_count, trace_device, operators), path, opset,
                  inputs, outputs)
    description = describe_step_graph(model, batch=batch, opset=opset, precision=precision, fps=fps,
                                      query_count=query_count, checkpoint_sha256=checkpoint_sha256)
    description["operators"] = operators
    attach_metadata(path, description, rewrite=graph_rewrites(precision, operators))
    return description


def default_operators(precision: str) -> str:
    """fp16, the GPU format, carries ONNX Runtime's fused operators (fewer kernels on its CUDA provider); fp32,
    the reference every format is checked against and TensorRT's source on 8.5-10, stays plain ONNX."""
    return ONNX_RUNTIME_OPERATORS if precision == FP16 else PLAIN_ONNX_OPERATORS


def checked_form(precision: str, operators: str | None) -> str:
    """The operators a traced graph of ``precision`` is written with (``default_operators`` where None);
    ValueError for a precision that is not traced or operators that are not ``GRAPH_OPERATORS``."""
    if precision not in PRECISION_DTYPES:
        raise ValueError(f"traced precisions are {sorted(PRECISION_DTYPES)}; int8 is made by quantizing fp32")
    operators = operators or default_operators(precision)
    if operators not in GRAPH_OPERATORS:
        raise ValueError(f"operators are one of {GRAPH_OPERATORS}, not {operators!r}")
    return operators


def gpu_form(precision: str, operators: str) -> bool:
    """Whether a graph has the GPU's form: fp16 (the GPU's precision), or any graph with ONNX Runtime's operators,
    whose fp32 form the tests compare with the plain graph."""
    return precision == FP16 or operators == ONNX_RUNTIME_OPERATORS


def graph_rewrites(precision: str, operators: str) -> Callable[[Any], None]:
    """The rewrites (of an ``onnx.ModelProto``) that give a traced graph its form, step and window alike."""
    def rewrite(graph) -> None:
        # The GPU's form (fp16, or any graph with ONNX Runtime's operators, whose fp32 form the tests compare with
        # the plain graph): each bias after its product, sibling products as one, a Concat's product with its bias
        # inside (export/gemm_bias.py) ...
        if gpu_form(precision, operators):
            fold_constant_arithmetic(graph)
            split_gemm_bias(graph)
            merge_sibling_products(graph)
            fold_bias_into_concat(graph)
        if operators == ONNX_RUNTIME_OPERATORS:  # ... then each residual, with such biases, inside its LayerNorm,
            shapes = static_shapes(graph)  # (ONNX infers no shape past ONNX Runtime's operators)
            fuse_skip_layer_norm(graph)
            carry_biases_to_readers(graph)  # ... the biases it could not take, into their sums' readers ...
            fold_bias_into_wide_products(graph, shapes)  # ... and a wide product's, through its input; and the
            mask_rows_before_products(graph, shapes)  # attention's output summed with an adapter's update (its
            join_summed_products(graph, shapes)  # class-token mask moved before its product) as one product;
            fuse_qrnn_pools(graph, shapes)  # each QRNN pooling step one function node (export/fused_ops.py),
            fuse_retention_steps(graph, shapes)  # and each retention step (export/fused_retention.py)
    return rewrite


def traced_model(model: SDQESModel, precision: str, trace_device: str, operators: str) -> SDQESModel:
    """The model a graph of ``precision`` and ``operators`` is traced from, on ``trace_device``; ``model``
    itself is left where it is, in fp32, and as it is."""
    traced = compute_model(model, precision, trace_device)
    if gpu_form(precision, operators):
        traced = copy.deepcopy(model).eval() if traced is model else traced
        for module in traced.modules():
            if isinstance(module, STAdapter):
                module.update_as_one_product = True
    if operators == ONNX_RUNTIME_OPERATORS:
        use_onnx_runtime_attention(traced)
    return traced


def step_graph_trace(model: SDQESModel, batch: int, precision: str, query_count: int | None,
                     trace_device: str, operators: str = PLAIN_ONNX_OPERATORS
                     ) -> tuple[StepGraph, tuple[torch.Tensor, ...]]:
    """The module the step graph is traced from and the inputs it is traced with, all on ``trace_device``;
    ``model`` itself is left where it is, in fp32, and as it is."""
    cfg = model.cfg
    traced = traced_model(model, precision, trace_device, operators)
    spec = model.state_spec(batch, STATE_DTYPES[precision])
    r = cfg.vision.image_size
    args: list[torch.Tensor] = [torch.zeros(batch, 3, r, r)] + [s.reshape(t.graph_shape)
                                                                for s, t in zip(traced.init_state(batch), spec)]
    if query_count is not None:
        args.append(torch.zeros(query_count, cfg.embed_dim))
    step_graph = StepGraph(traced, query_count is not None, PRECISION_DTYPES[precision])
    return step_graph, tuple(a.to(trace_device) for a in args)


def export_window_graph(model: SDQESModel, path: Path, *, window: int, batch: int = 1,
                        opset: int = DEFAULT_OPSET, precision: str = FP32, trace_device: str = "cpu",
                        operators: str | None = None) -> dict[str, Any]:
    """frames [B, W, 3, R, R] -> embedding of the last frame [B, E]: what a stateless deployment recomputes.

    ``precision``, ``trace_device`` and ``operators`` as for ``export_step_graph``: a window graph of a
    precision has the step graph's form (the same operators, the same rewrites), so the two compare on equal
    terms. Returns the description stored in the graph."""
    operators = checked_form(precision, operators)
    r = model.cfg.vision.image_size
    traced = traced_model(model, precision, trace_device, operators)
    frames = torch.zeros(batch, window, 3, r, r, device=trace_device)
    _torch_export(WindowGraph(traced, PRECISION_DTYPES[precision]), (frames,), path, opset, [WINDOW_INPUT],
                  [EMBEDDING_OUTPUT])
    description = {"format_version": GRAPH_FORMAT_VERSION, "kind": "window", "window": window, "batch": batch,
                   "opset": opset, "precision": precision, "operators": operators, "model": model.cfg.to_dict(),
                   "inputs": [WINDOW_INPUT], "outputs": [EMBEDDING_OUTPUT], "tool_versions": tool_versions()}
    attach_metadata(path, description, rewrite=graph_rewrites(precision, operators))
    return description


def export_text_graph(model: SDQESModel, path: Path, *, opset: int = DEFAULT_OPSET) -> dict[str, Any]:
    """Trace the text encoder: token_ids [Q, context] int64 -> query_embedding [Q, E] (Q dynamic)."""
    cfg = model.cfg
    tokens = torch.zeros(2, cfg.text.context_length, dtype=torch.int64)
    tokens[:, 0], tokens[:, 1] = 49406, 49407  # start and end tokens, so argmax finds a real end
    _torch_export(TextGraph(model.eval()), (tokens,), path, opset, [TOKEN_INPUT], [QUERY_EMBEDDING_OUTPUT],
                  dynamic_axes={TOKEN_INPUT: {0: "queries"}, QUERY_EMBEDDING_OUTPUT: {0: "queries"}})
    description = {"format_version": GRAPH_FORMAT_VERSION, "kind": "text", "opset": opset,
                   "context_length": cfg.text.context_length, "embed_dim": cfg.embed_dim,
                   "inputs": [TOKEN_INPUT], "outputs": [QUERY_EMBEDDING_OUTPUT], "tool_versions": tool_versions()}
    attach_metadata(path, description)
    return description


def check_graph(path: Path) -> None:
    """onnx.checker's full check (shape inference included)."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)
