"""The QRNN adapter's pooling step as one operator, ``sdqes_edge.QrnnPool``, in the graphs for ONNX Runtime.

On ONNX Runtime's CUDA provider a QRNN adapter's pooling step,
``h' = h + sigmoid(f) * (QuickGELU(z) - h)`` over the gates ``[z | f]``, is six kernels (Split, QuickGelu,
Sigmoid, Sub, Mul, Add), a few microseconds each at batch 1 and each moving the whole state at 32 streams; no
ONNX or com.microsoft operator does it in one. So the exporter writes it as one node of a model-local ONNX
function (``FunctionProto``) whose body is those operators:

- ONNX Runtime runs a function node by its body when no kernel claims the node (it inlines it before its
  optimizer, which still fuses the QuickGELU), so the graph runs everywhere as before, with the same numbers;
- with this project's kernel library registered (native/ort_ops, built by scripts/build_ort_ops.sh;
  ``runtime/fused_ops.py``), the node is one kernel, on the CPU and on the CUDA provider;
- TensorRT's parser gets the body back in its place (``inline_fused_functions``), and fuses it its own way.

The rewrite applies to graphs written with ONNX Runtime's operators alone (the fp16 GPU graph by default).
"""

from __future__ import annotations

from sdqes_edge.contract import FUSED_OPS_DOMAIN

from .graph_edits import constant_tensors, constant_value, readers_of, spliced, static_shapes, with_nodes

QRNN_POOL = "QrnnPool"
FUSED_OPS_VERSION = 1


def qrnn_pool_function(opset: int, dtype: int):
    """The ``FunctionProto`` of ``QrnnPool(gates [..., 2r], h [..., r]) -> h' [..., r]``, attribute ``alpha``
    (QuickGELU's), for tensors of ONNX element type ``dtype``, written with the default domain's operators of
    ``opset``: the arithmetic of the graph it replaces, operator for operator, so the inlined body computes what
    the graph did. (A Cast to the graph's type, not CastLike, which TensorRT 8.5 and 8.6 cannot parse.)"""
    from onnx import AttributeProto, helper

    alpha = helper.make_node("Constant", [], ["alpha"])
    alpha.attribute.append(AttributeProto(name="value_float", ref_attr_name="alpha", type=AttributeProto.FLOAT))
    halves = {"num_outputs": 2} if opset >= 18 else {}  # from opset 18 a Split without sizes says how many
    return helper.make_function(FUSED_OPS_DOMAIN, QRNN_POOL, ["gates", "h"], ["h_next"], [
        helper.make_node("Split", ["gates"], ["z", "f"], axis=-1, **halves),
        alpha,
        helper.make_node("Cast", ["alpha"], ["alpha_typed"], to=dtype),
        helper.make_node("Mul", ["z", "alpha_typed"], ["alpha_z"]),
        helper.make_node("Sigmoid", ["alpha_z"], ["z_gate"]),
        helper.make_node("Mul", ["z", "z_gate"], ["candidate"]),
        helper.make_node("Sigmoid", ["f"], ["forget"]),
        helper.make_node("Sub", ["candidate", "h"], ["step"]),
        helper.make_node("Mul", ["forget", "step"], ["moved"]),
        helper.make_node("Add", ["h", "moved"], ["h_next"]),
    ], opset_imports=[helper.make_opsetid("", opset)], attributes=["alpha"])


def _other(node, name: str) -> str | None:
    """The input of the binary ``node`` that is not ``name`` (None if ``name`` is not one of them)."""
    return node.input[1] if node.input[0] == name else node.input[0] if node.input[1] == name else None


def _made(name: str, op_type: str, producers: dict):
    node = producers.get(name)
    return node if node is not None and node.op_type == op_type else None


def _pool_nodes(add, producers: dict, readers: dict, constants_of) -> tuple | None:
    """(Split, nodes of the pooling step, h, alpha) if ``add`` ends ``h + sigmoid(f) * (z * sigmoid(alpha z) - h)``
    with z, f the halves of one Split and every tensor in between read inside the step alone; else None."""
    if add.op_type != "Add":
        return None
    for moved_name in add.input:
        h, moved = _other(add, moved_name), _made(moved_name, "Mul", producers)
        forget = next((n for n in (_made(i, "Sigmoid", producers) for i in moved.input) if n), None) if moved else None
        step = _made(_other(moved, forget.output[0]) or "", "Sub", producers) if forget else None
        if step is None or step.input[1] != h:
            continue
        candidate = _made(step.input[0], "Mul", producers)
        z_gate = next((n for n in (_made(i, "Sigmoid", producers) for i in candidate.input) if n), None) \
            if candidate else None
        alpha_z = _made(z_gate.input[0], "Mul", producers) if z_gate else None
        z = _other(candidate, z_gate.output[0]) if alpha_z else None
        alpha = constants_of(_other(alpha_z, z) or "") if z else None
        split = producers.get(z) if alpha is not None and alpha.size == 1 else None
        if split is None or split.op_type != "Split" or list(split.output) != [z, forget.input[0]]:
            continue
        nodes = (alpha_z, z_gate, candidate, forget, step, moved, add)
        single = [(t, 1) for t in (forget.input[0], alpha_z.output[0], z_gate.output[0], candidate.output[0],
                                   forget.output[0], step.output[0], moved.output[0])] + [(z, 2)]
        if all(len(readers.get(t, [])) == n for t, n in single):
            return split, nodes, h, alpha
    return None


def _halves_of_last_axis(split, h: str, shapes: dict) -> bool:
    """Whether ``split`` cuts its input's last axis into two halves shaped like ``h``."""
    from onnx import helper

    gates, state = shapes.get(split.input[0]), shapes.get(h)
    axis = next((helper.get_attribute_value(a) for a in split.attribute if a.name == "axis"), 0)
    return (bool(gates) and bool(state) and None not in gates + state and len(gates) == len(state)
            and axis in (-1, len(gates) - 1) and gates[:-1] == state[:-1] and gates[-1] == 2 * state[-1]
            and shapes.get(split.output[0]) == shapes.get(split.output[1]) == state)


def fuse_qrnn_pools(graph, shapes: dict[str, tuple] | None = None) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto`` with static shapes), each QRNN pooling step as one
    ``sdqes_edge.QrnnPool`` node, and add the function once; returns how many. Output names are kept.
    ``shapes``: every tensor's static shape where the caller has them (ONNX infers none past ONNX Runtime's
    operators), else inferred here."""
    from onnx import helper

    nodes = list(graph.graph.node)  # held: ``spliced`` knows nodes by id
    producers = {out: node for node in nodes for out in node.output}
    readers, shapes = readers_of(graph), static_shapes(graph) if shapes is None else shapes
    for output in graph.graph.output:  # a graph output is read outside the step
        readers.setdefault(output.name, []).append(None)
    initializers = constant_tensors(graph)

    def constants_of(name: str):
        return constant_value(name, initializers, producers)

    removed, replaced, dtypes = set(), {}, set()  # the graph's float type, from QuickGELU's constant
    for add in nodes:
        found = _pool_nodes(add, producers, readers, constants_of)
        if found is None or not _halves_of_last_axis(found[0], found[2], shapes):
            continue
        split, step_nodes, h, alpha = found
        dtypes.add(helper.np_dtype_to_tensor_dtype(alpha.dtype))
        replaced[id(add)] = [helper.make_node(QRNN_POOL, [split.input[0], h], list(add.output), name=f"{add.name}.pool",
                                              domain=FUSED_OPS_DOMAIN, alpha=float(alpha.reshape(())))]
        removed |= {id(node) for node in (split, *step_nodes)}
    if len(dtypes) > 1:  # one function per graph, of one type: a graph of mixed types is left as it is
        return 0
    if replaced:
        with_nodes(graph, spliced(nodes, removed, before=replaced))
        opset = next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
        graph.functions.append(qrnn_pool_function(opset, dtypes.pop()))
        graph.opset_import.append(helper.make_opsetid(FUSED_OPS_DOMAIN, FUSED_OPS_VERSION))
    return len(replaced)


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
