"""What every rewrite of an exported graph (an ``onnx.ModelProto``) needs, in one place and torch-free, so that
``build-engine`` on a device can use it: the constants nodes read, and the tidying after nodes are replaced."""

from __future__ import annotations

import numpy as np

# What ``fold_constant_arithmetic`` computes when every input is a constant.
FOLDED_OPERATORS = {"MatMul": np.matmul, "Add": np.add}


def constant_tensors(graph) -> dict:
    """The graph's initializers by the names nodes read them under: the tracer hands a constant that two layers
    share (equal values: the QRNN forget gates' initial bias) to the second through an Identity node."""
    initializers = {i.name: i for i in graph.graph.initializer}
    initializers.update({n.output[0]: initializers[n.input[0]] for n in graph.graph.node
                         if n.op_type == "Identity" and n.input[0] in initializers})
    return initializers


def readers_of(graph) -> dict[str, list]:
    """Every tensor's readers, by name: the nodes that take it as an input, in graph order (a node reading it
    twice is listed twice)."""
    readers: dict[str, list] = {}
    for node in graph.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def product_and_bias(add, constants: dict, producers: dict) -> tuple[str, str] | None:
    """(product, bias) if ``add`` is ``Add(MatMul(..), b)``, b a constant 1-D tensor (either input order); else
    None: a linear layer's bias, as ``gemm_bias.split_gemm_bias`` writes it after its product."""
    if add.op_type != "Add":
        return None
    for product, bias in (add.input, tuple(reversed(add.input))):
        made_by = producers.get(product)
        if made_by is not None and made_by.op_type == "MatMul" and bias in constants \
                and len(constants[bias].dims) == 1:
            return product, bias
    return None


def constant_value(name: str, constants: dict, producers: dict) -> np.ndarray | None:
    """The value of ``name`` if it is an initializer or a Constant node's output, else None."""
    from onnx import numpy_helper

    if name in constants:
        return numpy_helper.to_array(constants[name])
    node = producers.get(name)
    if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def made_by(name: str | None, op_type: str, producers: dict):
    """The node that makes ``name`` if it is an ``op_type``, else None (``producers``: each tensor's maker)."""
    node = producers.get(name) if name else None
    return node if node is not None and node.op_type == op_type else None


def attribute_value(node, name: str, default=None):
    """The value of ``node``'s attribute ``name``, or ``default`` where the node does not set it."""
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def static_shapes(graph) -> dict[str, tuple]:
    """Every tensor's static shape (the step graphs are static), by name."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(graph, data_prop=True)  # Reshapes to computed shapes
    infos = list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
    shapes = {v.name: tuple(d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim)
              for v in infos}
    return shapes | {i.name: tuple(i.dims) for i in graph.graph.initializer}


def fold_constant_arithmetic(graph) -> int:
    """Replace each MatMul and Add whose inputs are all constants with a constant of its value, in graph order (a
    chain folds whole); returns how many. The tracer folds no products, so a bias made from two layers' parameters
    (model/adapters.py: ``STAdapter._update_product``) reached the graph as a MatMul and an Add of constants, which
    the rewrites that take a constant bias would not see. Computed in at least float32, kept in the graph's dtype."""
    from onnx import numpy_helper

    constants, nodes = constant_tensors(graph), list(graph.graph.node)
    folded, values = set(), []
    for node in nodes:
        if node.op_type in FOLDED_OPERATORS and all(name in constants for name in node.input):
            arrays = [numpy_helper.to_array(constants[name]) for name in node.input]
            value = FOLDED_OPERATORS[node.op_type](*(a.astype(np.promote_types(a.dtype, np.float32)) for a in arrays))
            constants[node.output[0]] = numpy_helper.from_array(value.astype(arrays[0].dtype), node.output[0])
            values.append(constants[node.output[0]])
            folded.add(id(node))
    with_nodes(graph, spliced(nodes, folded), values)
    return len(folded)


def spliced(nodes, removed: set, before: dict | None = None, after: dict | None = None) -> list:
    """``nodes`` in order without those whose ``id`` is in ``removed``, each node's ``before[id]`` (a list of new
    nodes) put in front of its place and its ``after[id]`` behind it, whether it stays or not. The ids are those of
    node objects the caller has held since it took them (a list or a map of the nodes): protobuf hands out a new
    object for a node whose last one was freed, and its id may be another's."""
    before, after = before or {}, after or {}
    return [new for node in nodes for new in before.get(id(node), []) + ([] if id(node) in removed else [node])
            + after.get(id(node), [])]


def with_nodes(graph, nodes: list, initializers=()) -> None:
    """Give ``graph`` the nodes ``nodes``, add ``initializers``, and drop the initializers no node reads any more."""
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    graph.graph.initializer.extend(initializers)
    drop_unused_initializers(graph)


def drop_unused_initializers(graph) -> None:
    """Remove the initializers no node reads any more (a weight replaced by its transpose, biases now added as
    one) and no graph output names."""
    read = {name for node in graph.graph.node for name in node.input} | {o.name for o in graph.graph.output}
    kept = [i for i in graph.graph.initializer if i.name in read]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(kept)


def drop_unused_opsets(graph) -> None:
    """Keep only the operator sets the graph's nodes use. ONNX Runtime's quantizer declares every domain it
    knows (ai.onnx.ml 5, training, preview...), and an ONNX Runtime older than those versions refuses the whole
    graph for a domain no node needs: the int8 graph made by ONNX Runtime 1.32 did not load on 1.17. And a
    graph whose ONNX Runtime operators were written back as plain ONNX no longer needs their domain."""
    used = {node.domain for node in graph.graph.node} | {
        node.domain for function in graph.functions for node in function.node} | {""}
    kept = [opset for opset in graph.opset_import if opset.domain in used]
    del graph.opset_import[:]
    graph.opset_import.extend(kept)
