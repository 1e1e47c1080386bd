"""The QRNN adapter's pooling as one operator in the graphs for ONNX Runtime: ``sdqes_edge.QrnnPool`` (the step
form's, one frame) and ``sdqes_edge.QrnnScan`` (the sliding window's, its frames from ``h = 0``).

On ONNX Runtime's CUDA provider a QRNN adapter's pooling step,
``h' = h + sigmoid(f) * (QuickGELU(z) - h)`` over the gates ``[z | f]``, is six kernels (Split, QuickGelu,
Sigmoid, Sub, Mul, Add), a few microseconds each at batch 1 and each moving the whole state at 32 streams; no
ONNX or com.microsoft operator does it in one. The window's pooling over T frames is the activations once and
then, frame by frame, the rest (3 + 5 T kernels, and the frames stacked). So the exporter writes each as one
node of a model-local ONNX function (``FunctionProto``) whose body is those operators, step and window alike
(the window is what the step is measured against, and gets the same treatment):

- ONNX Runtime runs a function node by its body when no kernel claims the node (it inlines it before its
  optimizer, which still fuses the QuickGELU), so the graph runs everywhere as before, with the same numbers;
- with this project's kernel library registered (runtime/ort_ops, built by sdqes-edge build-ort-ops;
  ``runtime/fused_ops.py``), the node is one kernel, on the CPU and on the CUDA provider;
- TensorRT's parser gets the body back in its place (``inline_fused_functions``), and fuses it its own way.

The rewrite applies to graphs written with ONNX Runtime's operators alone (the fp16 GPU graph by default).
"""

from __future__ import annotations

import numpy as np

from sdqes_edge.contract import FUSED_OPS_DOMAIN, QRNN_POOL, QRNN_SCAN

from .graph_edits import constant_tensors, constant_value, readers_of, spliced, static_shapes, with_nodes
from .qrnn_patterns import pooling_scan, pooling_step

FUSED_OPS_VERSION = 1


def _activations_body(dtype: int) -> list:
    """The function body's nodes after its Split: the halves' activations, ``candidate`` and ``forget``.
    QuickGELU's constant is cast to the graph's type with Cast, not CastLike, which TensorRT 8.5/8.6 lack."""
    from onnx import AttributeProto, helper

    alpha = helper.make_node("Constant", [], ["alpha"])
    alpha.attribute.append(AttributeProto(name="value_float", ref_attr_name="alpha", type=AttributeProto.FLOAT))
    return [alpha, helper.make_node("Cast", ["alpha"], ["alpha_typed"], to=dtype),
            helper.make_node("Mul", ["z", "alpha_typed"], ["alpha_z"]),
            helper.make_node("Sigmoid", ["alpha_z"], ["z_gate"]),
            helper.make_node("Mul", ["z", "z_gate"], ["candidate"]),
            helper.make_node("Sigmoid", ["f"], ["forget"])]


def _split(opset: int):
    from onnx import helper

    halves = {"num_outputs": 2} if opset >= 18 else {}  # from opset 18 a Split without sizes says how many
    return helper.make_node("Split", ["gates"], ["z", "f"], axis=-1, **halves)


def qrnn_pool_function(opset: int, dtype: int):
    """The ``FunctionProto`` of ``QrnnPool(gates [..., 2r], h [..., r]) -> h' [..., r]``, attribute ``alpha``
    (QuickGELU's), for tensors of ONNX element type ``dtype``, written with the default domain's operators of
    ``opset``: the arithmetic of the graph it replaces, operator for operator, so the inlined body computes
    what the graph did."""
    from onnx import helper

    return helper.make_function(FUSED_OPS_DOMAIN, QRNN_POOL, ["gates", "h"], ["h_next"], [
        _split(opset), *_activations_body(dtype),
        helper.make_node("Sub", ["candidate", "h"], ["step"]),
        helper.make_node("Mul", ["forget", "step"], ["moved"]),
        helper.make_node("Add", ["h", "moved"], ["h_next"]),
    ], opset_imports=[helper.make_opsetid("", opset)], attributes=["alpha"])


def qrnn_scan_function(opset: int, dtype: int, frames: int, axis: int):
    """The ``FunctionProto`` of ``QrnnScan(gates [.., T, .., 2r]) -> h [.., T, .., r]`` (attributes ``alpha``,
    and ``axis``, the time axis, which the kernel reads): the window form's pooling from ``h = 0`` over its
    ``frames`` frames along ``axis``, unrolled as the graph had it (a model-local function is the graph's own,
    and one graph has one window). The first frame is ``forget * candidate``, which is ``0 + forget *
    (candidate - 0)`` exactly, two kernels fewer than the trace."""
    from onnx import helper, numpy_helper

    def constant(name: str, value) -> object:
        tensor = numpy_helper.from_array(np.asarray(value, np.int64), name)
        return helper.make_node("Constant", [], [name], value=tensor)

    body = [_split(opset), *_activations_body(dtype), constant("axes", [axis])]
    for t in range(frames):
        body += [constant(f"t{t}", t), helper.make_node("Gather", ["candidate", f"t{t}"], [f"c{t}"], axis=axis),
                 helper.make_node("Gather", ["forget", f"t{t}"], [f"f{t}"], axis=axis)]
        if t == 0:
            body.append(helper.make_node("Mul", ["f0", "c0"], ["h0"]))
        else:
            body += [helper.make_node("Sub", [f"c{t}", f"h{t - 1}"], [f"step{t}"]),
                     helper.make_node("Mul", [f"f{t}", f"step{t}"], [f"moved{t}"]),
                     helper.make_node("Add", [f"h{t - 1}", f"moved{t}"], [f"h{t}"])]
        body.append(helper.make_node("Unsqueeze", [f"h{t}", "axes"], [f"stacked{t}"]))
    body.append(helper.make_node("Concat", [f"stacked{t}" for t in range(frames)], ["h"], axis=axis))
    return helper.make_function(FUSED_OPS_DOMAIN, QRNN_SCAN, ["gates"], ["h"], body,
                                opset_imports=[helper.make_opsetid("", opset)], attributes=["alpha", "axis"])


def fusion_view(graph, shapes: dict[str, tuple] | None) -> tuple:
    """What a fused operator's pattern finder reads of ``graph``: (its nodes, held, as ``spliced`` knows nodes by
    id; each tensor's producer; each tensor's readers, a graph output counted as a reader outside the step; every
    tensor's static shape, ``shapes`` where given, else inferred; the value of a constant by name, else None)."""
    nodes = list(graph.graph.node)
    producers = {out: node for node in nodes for out in node.output}
    readers, shapes = readers_of(graph), static_shapes(graph) if shapes is None else shapes
    for output in graph.graph.output:
        readers.setdefault(output.name, []).append(None)
    initializers = constant_tensors(graph)

    def constants_of(name: str):
        return constant_value(name, initializers, producers)
    return nodes, producers, readers, shapes, constants_of


def fuse_qrnn_pools(graph, shapes: dict[str, tuple] | None = None) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto`` with static shapes), each QRNN pooling step as one
    ``sdqes_edge.QrnnPool`` node and each window's pooling over its frames as one ``sdqes_edge.QrnnScan`` node
    (export/qrnn_patterns.py finds them), and add their functions; returns how many nodes. Output names are
    kept. ``shapes``: every tensor's static shape where the caller has them (ONNX infers none past ONNX
    Runtime's operators), else inferred here."""
    from onnx import helper

    nodes, producers, readers, shapes, constants_of = fusion_view(graph, shapes)
    removed, replaced, kinds = set(), {}, set()  # kinds: (function, element type, frames, axis)
    for node in nodes:
        found = (pooling_step(node, producers, readers, constants_of, shapes) if node.op_type == "Add" else
                 pooling_scan(node, producers, readers, constants_of, shapes) if node.op_type == "Concat" else None)
        if found is None or removed & {id(n) for n in found.nodes}:
            continue
        dtype = helper.np_dtype_to_tensor_dtype(found.alpha.dtype)
        alpha = float(found.alpha.reshape(()))
        if found.h is not None:
            fused = helper.make_node(QRNN_POOL, [found.split.input[0], found.h], list(node.output),
                                     name=f"{node.name}.pool", domain=FUSED_OPS_DOMAIN, alpha=alpha)
        else:
            fused = helper.make_node(QRNN_SCAN, [found.split.input[0]], list(node.output), name=f"{node.name}.scan",
                                     domain=FUSED_OPS_DOMAIN, alpha=alpha, axis=found.axis)
        kinds.add((fused.op_type, dtype, found.frames, found.axis))
        replaced[id(node)] = [fused]
        removed |= {id(n) for n in found.nodes}
    if not replaced or len({k[1] for k in kinds}) > 1 or len({k for k in kinds if k[0] == QRNN_SCAN}) > 1:
        return 0  # one function of each, of one type (and one window) per graph: anything else is left as it is
    with_nodes(graph, without_unread_constants(spliced(nodes, removed, before=replaced), graph))
    opset = next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
    for op_type, dtype, frames, axis in sorted(kinds, key=str):
        graph.functions.append(qrnn_pool_function(opset, dtype) if op_type == QRNN_POOL
                               else qrnn_scan_function(opset, dtype, frames, axis))
    declare_fused_domain(graph)
    return len(replaced)


def declare_fused_domain(graph) -> None:
    """Declare this project's operator domain in ``graph``'s operator sets, once, whichever rewrite used it first."""
    from onnx import helper

    if all(o.domain != FUSED_OPS_DOMAIN for o in graph.opset_import):
        graph.opset_import.append(helper.make_opsetid(FUSED_OPS_DOMAIN, FUSED_OPS_VERSION))


def without_unread_constants(nodes: list, graph) -> list:
    """``nodes`` without the Constant nodes nothing reads any more (the zeros a window's pooling started from)."""
    read = {name for node in nodes for name in node.input} | {o.name for o in graph.graph.output}
    return [n for n in nodes if n.op_type != "Constant" or any(out in read for out in n.output)]


def inline_fused_functions(graph) -> int:
    """Put each ``sdqes_edge`` function node's body in its place (TensorRT's parser reads no model-local
    functions), its tensors named after the node; drop the functions. Returns how many nodes were inlined."""
    from onnx import helper

    functions = {(f.domain, f.name): f for f in graph.functions if f.domain == FUSED_OPS_DOMAIN}
    nodes, replaced = list(graph.graph.node), {}  # held: ``spliced`` knows nodes by id
    for node in nodes:
        function = functions.get((node.domain, node.op_type))
        if function is not None:
            replaced[id(node)] = _instantiated(function, node, helper)
    with_nodes(graph, spliced(nodes, set(replaced), before=replaced))
    kept = [f for f in graph.functions if f.domain != FUSED_OPS_DOMAIN]
    del graph.functions[:]
    graph.functions.extend(kept)
    return len(replaced)


def _instantiated(function, node, helper) -> list:
    """``function``'s body for the call ``node``: formal inputs and outputs renamed to the node's, every other
    tensor prefixed with the node's name, attribute references resolved from the node's attributes."""
    names = {**dict(zip(function.input, node.input)), **dict(zip(function.output, node.output))}
    values = {a.name: a for a in node.attribute}
    body = []
    for i, inner in enumerate(function.node):
        copy = helper.make_node(inner.op_type, [names.get(t, f"{node.name}/{t}") for t in inner.input],
                                [names.get(t, f"{node.name}/{t}") for t in inner.output],
                                name=f"{node.name}/{i}.{inner.op_type}", domain=inner.domain)
        for attribute in inner.attribute:
            resolved = values[attribute.ref_attr_name] if attribute.ref_attr_name else attribute
            copy.attribute.append(helper.make_attribute(attribute.name, helper.get_attribute_value(resolved)))
        body.append(copy)
    return body
