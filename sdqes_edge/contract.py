"""The deployment contract, defined once and torch-free: what an exported graph and a bundle look like.

DESIGN.md section 3 ("The single-step graph contract", "The bundle"). The exporter writes it,
the Python runtime and the native (C++) runtime read it; nothing else spells these names.

Step graph: inputs ``frame`` [B,3,R,R], then ``state_in.<name>`` in state-spec order, then optionally
``query_embeddings`` [Q,E]; outputs ``embedding`` [B,E], optionally ``logits`` [B,Q], then
``state_out.<name>`` in the same order. A state tensor crosses the graph's boundary with its streams and
tokens axes merged, [B*L, ...] (``StateTensorSpec.graph_shape``: stream-major, the same bytes as the spec's
[B, L, ...]), so the step reads it without a reshape; graphs exported before that take the spec's shape.
Text graph: ``token_ids`` [Q,C] -> ``query_embedding`` [Q,E], C the manifest's ``tokenizer.context_length``
(CLIP's 77, Long-CLIP's 248).
Each graph describes itself as JSON in ONNX ``metadata_props`` under ``METADATA_KEY``.

A bundle is a directory::

    manifest.json            what everything else is (``bundle_manifest.schema.json``); written last
    step.fp32.onnx           the single-step graph (and step.fp16.onnx, step.int8.onnx)
    text.onnx                the text encoder
    tokenizer/...            CLIP's BPE vocabulary
    queries.json             optional pre-encoded queries (texts, alert messages)
    query_embeddings.npy     their embeddings [Q, E]
    training_record.json     how the model was trained, where `sdqes-edge train` made it (export carries it)
    engines/<gpu>-sm<cc>-trt<version>/step.<precision>.engine   TensorRT engines, built on the device
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

# --- graph inputs and outputs ----------------------------------------------------------------
FRAME_INPUT = "frame"
STATE_INPUT_PREFIX = "state_in."
QUERY_INPUT = "query_embeddings"
EMBEDDING_OUTPUT = "embedding"
LOGITS_OUTPUT = "logits"
STATE_OUTPUT_PREFIX = "state_out."
TOKEN_INPUT = "token_ids"
QUERY_EMBEDDING_OUTPUT = "query_embedding"
WINDOW_INPUT = "frames"  # the sliding-window baseline's graph (benchmarks only): [B, W, 3, R, R]

METADATA_KEY = "sdqes_edge"  # the one metadata_props key a graph's JSON description lives under
GRAPH_FORMAT_VERSION = 2  # 2: state tensors as rows [B*L, ...] (graph_shape); 1: in the spec's shape
DEFAULT_OPSET = 17  # LayerNormalization is one node from opset 17
SUPPORTED_OPSETS = (16, 17)  # 16 for TensorRT < 8.6

# --- scores ----------------------------------------------------------------------------------
# Every score is p = sigmoid(cos(frame, query)) (DESIGN.md section 1: no temperature), and a cosine lies in [-1, 1],
# so p lies in [sigmoid(-1), sigmoid(1)] = [0.2689, 0.7311], whatever the model: a threshold at or above the top is
# never reached, and one below the bottom is passed by every frame (one alert, at a query's first frame).
SCORE_RANGE = (1.0 / (1.0 + math.e), 1.0 / (1.0 + 1.0 / math.e))

# --- the bundle ------------------------------------------------------------------------------
MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA_FILE = "bundle_manifest.schema.json"  # beside this module, shipped as package data
BUNDLE_FORMAT_VERSION = 2  # the newest format this code writes and reads (2: graphs of GRAPH_FORMAT_VERSION 2); 1 loads
# The fastest rate a bundle samples at (its manifest's fps, `export --fps`), in frames per second: faster than any
# camera. A file is sampled by timestamp, each frame serving every sample time it covers, so a manifest's fps of
# 1e300 (a manifest is the user's to edit, and someone else's data) stepped one frame without end, in both runtimes.
MAX_FPS = 1000.0
TEXT_GRAPH_NAME = "text.onnx"
TOKENIZER_FOLDER = "tokenizer"
QUERIES_NAME = "queries.json"
QUERY_EMBEDDINGS_NAME = "query_embeddings.npy"
TRAINING_RECORD_NAME = "training_record.json"  # `sdqes-edge train`'s record, exported with its checkpoint
ENGINES_FOLDER = "engines"


@functools.lru_cache(maxsize=None)
def manifest_schema() -> dict[str, Any]:
    """The manifest's JSON Schema, read from its file (the one the native runtime is tested against)."""
    return json.loads((Path(__file__).parent / MANIFEST_SCHEMA_FILE).read_text())


# The format name and the precisions are written once, in the schema; read from there.
BUNDLE_FORMAT: str = manifest_schema()["properties"]["format"]["const"]
PRECISIONS: tuple[str, ...] = tuple(
    manifest_schema()["properties"]["graphs"]["properties"]["step"]["propertyNames"]["enum"])
FP32, FP16, INT8 = PRECISIONS  # in the schema's order
REFERENCE_PRECISION = FP32  # always exported; every other precision is measured against it
# The dtype a step graph of each precision takes and gives its state in: the dtype the state is computed in. An
# fp16 graph computes its state in fp16, so fp32 at its boundary held no more precision and cost a Cast kernel per
# state tensor each way; an int8 graph computes its state (the adapters) in fp32.
STATE_DTYPES: dict[str, str] = {FP32: "float32", FP16: "float16", INT8: "float32"}
# The operators a step graph may use, in the schema: plain ONNX, or also ONNX Runtime's fused ones (com.microsoft).
GRAPH_OPERATORS: tuple[str, ...] = tuple(manifest_schema()["properties"]["graphs"]["properties"]["step"][
    "additionalProperties"]["properties"]["operators"]["enum"])
PLAIN_ONNX_OPERATORS, ONNX_RUNTIME_OPERATORS = GRAPH_OPERATORS
# The operator domain of this project's own fused operators: model-local ONNX functions in the graphs for ONNX
# Runtime (export/fused_ops.py), one kernel each where the kernel library is registered (runtime/fused_ops.py).
FUSED_OPS_DOMAIN = "sdqes_edge"
# Its operators (runtime/ort_ops has each): a QRNN pooling step (one frame), a window's pooling over its frames,
# and a RetNet adapter's retention step (export/fused_retention.py).
QRNN_POOL, QRNN_SCAN, RETENTION_STEP = FUSED_OPS = ("QrnnPool", "QrnnScan", "RetentionStep")


def step_graph_name(precision: str) -> str:
    return f"step.{precision}.onnx"


def engine_name(precision: str) -> str:
    return f"step.{precision}.engine"


def step_io_names(state_names: list[str], fused_queries: bool) -> tuple[list[str], list[str]]:
    """(input names, output names) of the step graph, in the contract's order, for state tensors by name."""
    inputs = ([FRAME_INPUT] + [STATE_INPUT_PREFIX + n for n in state_names]
              + ([QUERY_INPUT] if fused_queries else []))
    outputs = ([EMBEDDING_OUTPUT] + ([LOGITS_OUTPUT] if fused_queries else [])
               + [STATE_OUTPUT_PREFIX + n for n in state_names])
    return inputs, outputs


def state_names_in(io_names: list[str], prefix: str) -> list[str]:
    """The state tensor names among a graph's inputs (``STATE_INPUT_PREFIX``) or outputs, in order."""
    return [n[len(prefix):] for n in io_names if n.startswith(prefix)]
