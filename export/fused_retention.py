"""The RetNet adapter's retention step as one operator in the graphs for ONNX Runtime: ``sdqes_edge.RetentionStep``.

``SimpleRetention.step`` (sdqes_edge/model/retention.py) is, per token, with ``R`` its state [d, d] (key channel,
value channel) and ``[q | k | v]`` one product of the frame::

    R' = R * keep + R[swap] * cross + k^T v        out = q R'

Traced, that is a Split, a Gather, three Muls, two Adds, a MatMul and four views over the largest tensor of any
adapter (ViT-B/16: 197 x 248 x 248 numbers, 46 MiB a stream in fp32): each elementwise operator reads and writes
it whole, some twelve passes over it a step, where one kernel reads it once, writes ``R'`` once and sums ``q R'``
from what it wrote. No ONNX or com.microsoft operator does this, so the exporter writes it as one node of a
model-local ONNX function whose body is those operators, as export/fused_ops.py does for the QRNN pooling:
ONNX Runtime inlines the body where no kernel claims the node (the same kernels and numbers as before), the
kernel library (runtime/ort_ops) runs it as one kernel on the CPU and the CUDA provider, and TensorRT's parser
gets the body back in its place (``fused_ops.inline_fused_functions``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdqes_edge.contract import FUSED_OPS_DOMAIN, RETENTION_STEP

from .fused_ops import declare_fused_domain, fusion_view, without_unread_constants
from .graph_edits import attribute_value, made_by, spliced, with_nodes

# The node's inputs and outputs, in order; the kernel (runtime/ort_ops/ort_ops.cc) reads them in this order.
RETENTION_INPUTS = ("qkv", "state", "swap", "keep", "cross")  # [.., 3d], [.., d, d], [d] int64, [d, 1], [d, 1]
RETENTION_OUTPUTS = ("out", "state_next")  # [.., d], [.., d, d]


def retention_step_function(opset: int):
    """The ``FunctionProto`` of ``RetentionStep(qkv, state, swap, keep, cross) -> (out, state_next)``: the traced
    step's operators in its order, so the inlined body computes what the graph did (for any float type)."""
    from onnx import helper, numpy_helper

    def axes(name: str, axis: int):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array([axis], np.int64)))

    thirds = {"num_outputs": 3} if opset >= 18 else {}  # from opset 18 a Split without sizes says how many
    return helper.make_function(FUSED_OPS_DOMAIN, RETENTION_STEP, list(RETENTION_INPUTS), list(RETENTION_OUTPUTS), [
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=-1, **thirds),
        helper.make_node("Gather", ["state", "swap"], ["partners"], axis=-2),
        helper.make_node("Mul", ["state", "keep"], ["kept"]),
        helper.make_node("Mul", ["partners", "cross"], ["crossed"]),
        helper.make_node("Add", ["kept", "crossed"], ["rotated"]),
        axes("last", -1), axes("second_last", -2),
        helper.make_node("Unsqueeze", ["k", "last"], ["k_column"]),
        helper.make_node("Unsqueeze", ["v", "second_last"], ["v_row"]),
        helper.make_node("Mul", ["k_column", "v_row"], ["kv"]),
        helper.make_node("Add", ["rotated", "kv"], ["state_next"]),
        helper.make_node("Unsqueeze", ["q", "second_last"], ["q_row"]),
        helper.make_node("MatMul", ["q_row", "state_next"], ["out_row"]),
        helper.make_node("Squeeze", ["out_row", "second_last"], ["out"]),
    ], opset_imports=[helper.make_opsetid("", opset)])


@dataclass(frozen=True)
class RetentionStepMatch:
    """A matched retention step: the node's inputs (RETENTION_INPUTS' order), its outputs, the nodes it replaces,
    and the one whose place it takes: the Add that makes the new state, after all it reads and before every
    reader of what it makes."""

    inputs: tuple
    outputs: tuple
    nodes: tuple
    place: object


def _axes(node, constants_of, rank: int) -> list | None:
    """An Unsqueeze's or Squeeze's axes (its second input from opset 13), made non-negative for ``rank``."""
    value = constants_of(node.input[1]) if len(node.input) == 2 else None
    return None if value is None else [int(a) % rank for a in value.ravel()]


def _rotation(rotated: str, producers: dict, constants_of) -> tuple | None:
    """(state, swap, keep, cross, nodes) if ``rotated`` is ``state * keep + Gather(state, swap) * cross``, the
    three constants; else None. The Gather's axis is checked by the caller, which knows the state's rank."""
    add = made_by(rotated, "Add", producers)
    kept, crossed = (made_by(name, "Mul", producers) for name in add.input) if add is not None else (None, None)
    gather = made_by(crossed.input[0], "Gather", producers) if kept is not None and crossed is not None else None
    if gather is None or kept.input[0] != gather.input[0]:
        return None
    state = gather.input[0]
    swap, keep, cross = gather.input[1], kept.input[1], crossed.input[1]
    values = [constants_of(name) for name in (swap, keep, cross)]
    if any(v is None for v in values):
        return None
    return state, swap, keep, cross, (gather, kept, crossed, add)


def retention_step(squeeze, producers: dict, readers: dict, constants_of, shapes: dict) -> RetentionStepMatch | None:
    """The retention step whose output ``squeeze`` makes, else None. Every tensor in between must be read inside
    the step alone (the new state aside, which is the graph's output), and the shapes must be the step's."""
    matmul = made_by(squeeze.input[0], "MatMul", producers) if squeeze.op_type == "Squeeze" else None
    q_row = made_by(matmul.input[0], "Unsqueeze", producers) if matmul is not None else None
    update = made_by(matmul.input[1], "Add", producers) if q_row is not None else None
    if update is None:
        return None
    for rotated, kv_name in (update.input, tuple(reversed(update.input))):
        kv, rotation = made_by(kv_name, "Mul", producers), _rotation(rotated, producers, constants_of)
        if kv is not None and rotation is not None:
            break
    else:
        return None
    k_column, v_row = (made_by(name, "Unsqueeze", producers) for name in kv.input)
    split = producers.get(q_row.input[0])
    if k_column is None or v_row is None or split is None or split.op_type != "Split" \
            or list(split.output) != [q_row.input[0], k_column.input[0], v_row.input[0]]:
        return None
    state, swap, keep, cross, rotation_nodes = rotation
    state_shape, qkv_shape = shapes.get(state), shapes.get(split.input[0])
    if not state_shape or not qkv_shape or None in state_shape + qkv_shape or len(state_shape) < 3:
        return None
    d, rank = state_shape[-1], len(state_shape)
    expected_axes = [(k_column, [rank - 1]), (v_row, [rank - 2]), (q_row, [rank - 2]), (squeeze, [rank - 2])]
    if (state_shape[-2] != d or qkv_shape != state_shape[:-2] + (3 * d,)
            or attribute_value(split, "axis", 0) % (rank - 1) != rank - 2
            or attribute_value(rotation_nodes[0], "axis", 0) % rank != rank - 2
            or any(shapes.get(name) != state_shape[:-2] + (d,) for name in split.output)
            or any(_axes(node, constants_of, rank) != axes for node, axes in expected_axes)
            or not _pair_exchange(constants_of(swap), d) or constants_of(keep).size != d
            or constants_of(cross).size != d or shapes.get(update.output[0]) != state_shape):
        return None
    nodes = (split, *rotation_nodes, k_column, v_row, kv, update, q_row, matmul, squeeze)
    inner = [o for n in nodes for o in n.output if n is not squeeze and o != update.output[0]]
    if any(len(readers.get(name, [])) != 1 for name in inner):
        return None
    return RetentionStepMatch((split.input[0], state, swap, keep, cross), (squeeze.output[0], update.output[0]),
                              nodes, update)


def _pair_exchange(swap: np.ndarray | None, d: int) -> bool:
    """Whether ``swap`` exchanges the two channels of each pair (the kernel reads each row's partner as such)."""
    return swap is not None and swap.shape == (d,) and d % 2 == 0 and bool((swap == np.arange(d) ^ 1).all())


def fuse_retention_steps(graph, shapes: dict[str, tuple] | None = None) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto`` with static shapes), each retention step as one
    ``sdqes_edge.RetentionStep`` node, and add its function; returns how many nodes. Output names are kept.
    ``shapes`` as for ``fused_ops.fuse_qrnn_pools``."""
    from onnx import helper

    nodes, producers, readers, shapes, constants_of = fusion_view(graph, shapes)
    removed, replaced = set(), {}
    for node in nodes:
        found = retention_step(node, producers, readers, constants_of, shapes) if node.op_type == "Squeeze" else None
        if found is None or removed & {id(n) for n in found.nodes}:
            continue
        replaced[id(found.place)] = [helper.make_node(RETENTION_STEP, list(found.inputs), list(found.outputs),
                                               name=f"{node.name}.retention", domain=FUSED_OPS_DOMAIN)]
        removed |= {id(n) for n in found.nodes}
    if not replaced:
        return 0
    with_nodes(graph, without_unread_constants(spliced(nodes, removed, before=replaced), graph))
    opset = next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
    graph.functions.append(retention_step_function(opset))
    declare_fused_domain(graph)
    return len(replaced)
