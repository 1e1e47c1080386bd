"""A sum of two products as one product over their concatenated inputs, in the graphs for ONNX Runtime's CUDA
provider.

With two adapters a block, the attention's output ``a = y @ W_o`` is read twice: by the second adapter's
down-projection, and by the residual, ``a + h @ W_up`` (the adapter's update) before the LayerNorm that takes the
block's stream. That is three products and an Add over the whole stream, where a block without adapters has one
product. Both of ``a``'s readers are linear, so ``a`` need not exist: the down-projection reads ``y`` through the
folded weight ``W_o @ W_d``, and the sum is one product, ``[h, y] @ [W_up; W_o]``, whose Concat is a kernel in
place of the Add: a product and a kernel fewer per block (12 at ViT-B/16), the attention's output written and
read once less. The same arithmetic, summed in another order (``W_o @ W_d`` is formed in float32, then stored in
the graph's dtype).
"""

from __future__ import annotations

import numpy as np

from .graph_edits import (
    attribute_value,
    constant_tensors,
    constant_value,
    readers_of,
    spliced,
    static_shapes,
    with_nodes,
)


def _weight_product(node, constants: dict) -> bool:
    """Whether ``node`` is ``MatMul(x, W)`` with a constant 2-D W."""
    return node.op_type == "MatMul" and node.input[1] in constants and len(constants[node.input[1]].dims) == 2


def _joinable(add, constants: dict, producers: dict, readers: dict, shapes: dict) -> tuple | None:
    """(the shared product A = y @ W, the other product P = h @ V, A's other readers) where ``add`` is A + P,
    P read by the Add alone, A by the Add and by products of constant weights alone, y and h of the same rows."""
    if add.op_type != "Add" or len(add.input) != 2:
        return None
    for shared_name, other_name in (add.input, tuple(reversed(add.input))):
        shared, other = producers.get(shared_name), producers.get(other_name)
        if shared is None or other is None or shared is other \
                or not (_weight_product(shared, constants) and _weight_product(other, constants)):
            continue
        others = [n for n in readers[shared_name] if n is not add]
        if len(readers[other_name]) != 1 or len(others) != len(readers[shared_name]) - 1 or not others \
                or not all(_weight_product(n, constants) and n.input[0] == shared_name for n in others):
            continue
        y, h = shapes.get(shared.input[0]), shapes.get(other.input[0])
        if y and h and None not in y + h and len(y) == len(h) and y[:-1] == h[:-1]:
            return shared, other, others
    return None


def _tokens_view_and_back(view, back, tokens: int, shapes: dict) -> bool:
    """Whether ``view`` makes rows [B*L, D] into [B, L, D] (L = ``tokens``) and ``back`` (a Flatten) undoes it."""
    shape = shapes.get(view.output[0])
    axis = attribute_value(back, "axis", 1)
    return back.op_type == "Flatten" and axis == 2 and shape is not None and len(shape) == 3 and shape[1] == tokens


def mask_rows_before_products(graph, shapes: dict[str, tuple] | None = None) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto`` with static shapes), each ``(x @ W)`` viewed as [B, L, D],
    multiplied by a constant [L, 1] mask and viewed back as rows [B*L, D] (the ST adapter's update, its class token
    zeroed) as ``(x * mask_rows) @ W``: scaling rows commutes with the product, the mask then multiplies the narrow
    input (where a bias taken through a column of ones is masked with it), and the update is a product that
    ``join_summed_products`` can join with the attention's output. Returns how many. Output names are kept.
    ``shapes``: as for ``gemm_bias.fold_bias_into_wide_products``; the masked inputs' shapes are added to it."""
    from onnx import numpy_helper

    constants = constant_tensors(graph)
    producers = {out: node for node in graph.graph.node for out in node.output}
    readers, shapes = readers_of(graph), static_shapes(graph) if shapes is None else shapes
    removed, after, added = set(), {}, []
    for mul in graph.graph.node:
        view = producers.get(mul.input[0]) if mul.op_type == "Mul" else None
        product = producers.get(view.input[0]) if view is not None and view.op_type == "Reshape" else None
        mask = constant_value(mul.input[1], constants, producers) if product is not None else None
        back = readers.get(mul.output[0], [])
        rows = shapes.get(product.input[0]) if product is not None else None
        if (mask is None or product.op_type != "MatMul" or mask.ndim != 2 or mask.shape[1] != 1 or len(back) != 1
                or len(readers[product.output[0]]) != 1 or len(readers[view.output[0]]) != 1
                or not rows or len(rows) != 2 or None in rows or rows[0] % mask.shape[0]
                or not _tokens_view_and_back(view, back[0], mask.shape[0], shapes)):
            continue
        flatten = back[0]
        name = f"{mul.name}.before_product"
        added.append(numpy_helper.from_array(np.tile(mask, (rows[0] // mask.shape[0], 1)), f"{name}.rows"))
        mul.input[0], mul.input[1], mul.output[0] = product.input[0], f"{name}.rows", f"{name}.masked"
        shapes[f"{name}.masked"] = rows
        product.input[0], product.output[0] = f"{name}.masked", flatten.output[0]
        removed |= {id(view), id(flatten), id(product)}
        after[id(mul)] = [product]  # which now reads the Mul
    with_nodes(graph, spliced(graph.graph.node, removed, after=after), added)
    return len(after)


def join_summed_products(graph, shapes: dict[str, tuple] | None = None) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto`` with static shapes), each ``Add(y @ W, h @ V)`` whose
    ``y @ W`` is otherwise read only by products ``(y @ W) @ U`` as ``Concat(h, y) @ [V; W]``, those readers as
    ``y @ (W U)``; returns how many sums. Output names are kept. ``shapes``: as for ``mask_rows_before_products``."""
    from onnx import helper, numpy_helper

    constants = constant_tensors(graph)
    producers = {out: node for node in graph.graph.node for out in node.output}
    readers, graph_outputs = readers_of(graph), {o.name for o in graph.graph.output}
    shapes = static_shapes(graph) if shapes is None else shapes
    removed, replaced, added = set(), {}, []

    def array(name: str) -> np.ndarray:
        return numpy_helper.to_array(constants[name])

    for add in graph.graph.node:
        joined = _joinable(add, constants, producers, readers, shapes) if add.output[0] not in graph_outputs else None
        if joined is None or id(joined[0]) in removed:
            continue
        shared, other, shared_readers = joined
        name = f"{add.name}.joined"
        weight = array(shared.input[1])
        added.append(numpy_helper.from_array(np.concatenate((array(other.input[1]), weight)), f"{name}.weight"))
        for i, reader in enumerate(shared_readers):  # (y W) U = y (W U), formed in float32
            folded = weight.astype(np.float32) @ array(reader.input[1]).astype(np.float32)
            added.append(numpy_helper.from_array(folded.astype(weight.dtype), f"{name}.folded{i}"))
            reader.input[0], reader.input[1] = shared.input[0], f"{name}.folded{i}"
        concat = helper.make_node("Concat", [other.input[0], shared.input[0]], [f"{name}.input"],
                                  name=f"{name}.concat", axis=-1)
        replaced[id(add)] = [concat, helper.make_node("MatMul", [f"{name}.input", f"{name}.weight"],
                                                      list(add.output), name=f"{name}.product")]
        removed |= {id(shared), id(other), id(add)}
    with_nodes(graph, spliced(graph.graph.node, removed, before=replaced), added)
    return len(replaced)
