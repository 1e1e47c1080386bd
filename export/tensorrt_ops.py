"""ONNX operators TensorRT's ONNX parser accepts, with the first TensorRT release that does.

Our own table, covering the operators these graphs can contain, read from
onnx-tensorrt's operator support matrix (docs/operators.md): everything here
is supported from TensorRT 8.5 (opset 17) except LayerNormalization, which the
parser maps to a native layer from 8.6. Export with ``--opset 16`` for older
TensorRT (Xavier tops out at 8.5): LayerNorm is then decomposed.

QuantizeLinear/DequantizeLinear need zero points of 0 (the int8 graphs are
symmetric for this reason); Conv needs its weights as an initializer.

The fp16 graph carries ONNX Runtime's Attention and SkipLayerNormalization (com.microsoft), which the parser
does not know: ``as_tensorrt_reads_it`` writes them back as plain ONNX before parsing
(export/onnx_runtime_ops.py).
"""

from __future__ import annotations

from pathlib import Path

from sdqes_edge.contract import ONNX_RUNTIME_OPERATORS
from sdqes_edge.errors import UserError

from .fused_ops import inline_fused_functions
from .graph_edits import drop_unused_opsets
from .onnx_runtime_ops import bias_after_wide_products, expand_attention, expand_skip_layer_norm

MIN_TENSORRT = (8, 5)
LAYERNORM_OPSET = 17  # the ONNX opset from which LayerNorm is one LayerNormalization node (16: plain nodes)

TENSORRT_ONNX_OPS: dict[str, tuple[int, int]] = {op: MIN_TENSORRT for op in (
    "Abs", "Add", "And", "ArgMax", "ArgMin", "Cast", "Ceil", "Clip", "Concat", "Constant", "ConstantOfShape",
    "Conv", "Cos", "CumSum", "DequantizeLinear", "Div", "Einsum", "Equal", "Erf", "Exp", "Expand", "Flatten",
    "Floor", "Gather", "GatherElements", "GatherND", "Gemm", "Greater", "GreaterOrEqual", "Identity", "Less",
    "LessOrEqual", "Log", "MatMul", "Max", "Min", "Mul", "Neg", "Not", "Or", "Pad", "Pow", "QuantizeLinear",
    "Range", "ReduceL2", "ReduceMax", "ReduceMean", "ReduceSum", "Relu", "Reshape", "Shape", "Sigmoid", "Sin",
    "Size", "Slice", "Softmax", "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Trilu",
    "Unsqueeze", "Where",
)}
TENSORRT_ONNX_OPS["LayerNormalization"] = (8, 6)


def unsupported_ops(op_types: set[str], tensorrt_version: tuple[int, int] = MIN_TENSORRT) -> dict[str, str]:
    """Operators of a graph that TensorRT ``tensorrt_version`` would refuse, with the reason."""
    problems = {}
    for op in sorted(op_types):
        if op not in TENSORRT_ONNX_OPS:
            problems[op] = "not supported by TensorRT's ONNX parser"
        elif TENSORRT_ONNX_OPS[op] > tensorrt_version:
            needed = ".".join(map(str, TENSORRT_ONNX_OPS[op]))
            problems[op] = f"needs TensorRT {needed} (export with --opset 16 for older TensorRT)"
    return problems


def check_opset_readable(opset: int, tensorrt_version: str, bundle_root: Path | str = "the bundle") -> None:
    """Refuse, before minutes of parsing, a bundle whose graphs hold LayerNormalization where this TensorRT
    (``trt.__version__``, "8.5.2.2") cannot read it."""
    needed = TENSORRT_ONNX_OPS["LayerNormalization"]
    if opset >= LAYERNORM_OPSET and tuple(int(part) for part in tensorrt_version.split(".")[:2]) < needed:
        raise UserError(f"TensorRT {tensorrt_version} cannot read LayerNormalization, which the graphs of "
                        f"{bundle_root} (ONNX opset {opset}) use: TensorRT reads it from {'.'.join(map(str, needed))} "
                        "on; re-export the bundle with --opset 16 (LayerNorm as plain nodes), or build on a newer "
                        "TensorRT")


def as_tensorrt_reads_it(graph):
    """``graph`` (an ``onnx.ModelProto``, changed in place and returned) with ONNX Runtime's operators
    written back as the plain ONNX operators they fuse, and the biases taken through a Concat for ONNX Runtime's
    sake after their products again."""
    inline_fused_functions(graph)  # TensorRT's parser reads no model-local functions
    expand_skip_layer_norm(graph)
    expand_attention(graph)
    bias_after_wide_products(graph)  # TensorRT adds a bias inside its GEMM for nothing
    drop_unused_opsets(graph)
    return graph


def tensorrt_readable_bytes(path: Path, operators: str) -> bytes | None:
    """The graph at ``path``, whose operators are ``operators`` (its manifest entry's, contract.GRAPH_OPERATORS),
    serialized as TensorRT's parser can read it; None when the file already is, which the parser reads itself.

    Only an fp16 graph built strongly typed (TensorRT 11) holds such operators; a device that builds from the
    fp32 graph (TensorRT 8.5-10, a Jetson) needs no onnx package for this."""
    if operators != ONNX_RUNTIME_OPERATORS:
        return None
    try:
        import onnx
    except ImportError:
        raise UserError(f"{path.name} uses ONNX Runtime's fused operators, which build-engine writes back as "
                        "plain ONNX for TensorRT with the onnx package: pip install onnx") from None
    return as_tensorrt_reads_it(onnx.load(str(path))).SerializeToString()
