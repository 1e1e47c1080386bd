"""fp16 step graphs carry each linear layer as MatMul, then Add of its bias, not as one Gemm.

ONNX Runtime's CUDA provider runs a Gemm with a bias as two kernels: one writes the bias into every row of
the output (``BroadcastBiasKernel``), then the GEMM multiplies onto it (beta = 1). That bias kernel was 15%
of the GPU's time at one stream and 27% at 32 (ViT-B/16 + QRNN fp16 step, H200, CUPTI). As MatMul then Add
it is still two kernels, the Add an elementwise one that runs faster: measured on that H200, interleaved, the
32-stream step 14.88 -> 13.42 ms (1.11x), the backbone's 11.25 -> 10.47 ms, one stream 2.17 against 2.15 ms.

Linear layers that read the same input (the QRNN's two gates) are then one product, one bias Add and a Split
(``merge_sibling_products``): three kernels instead of four.

A product that reads a Concat (a QRNN gate over the remembered and the current frame) then takes its bias
inside: the Concat, a kernel anyway, appends a constant column of ones and the weight gains the bias as the
row that meets it (``fold_bias_into_concat``): one bias kernel fewer per adapter. A product much wider out than
in (the MLP's first, 768 -> 3072) takes its bias the same way through a Concat of its input made for it
(``fold_bias_into_wide_products``): as many kernels, but the Concat moves the input's width where the bias Add moved
the output's; only with ONNX Runtime's operators, since TensorRT adds a bias inside its GEMM for nothing and would
run the Concat as a kernel more (``build-engine`` undoes it: ``onnx_runtime_ops.bias_after_wide_products``).

Only the fp16 graph, the GPU format, is written so. ONNX Runtime's CPU provider folds the pair back into its
Gemm (``MatMulAddFusion``: the same kernels, the same numbers), the CUDA session keeps the two apart
(``runtime.ort_releases.CUDA_DISABLED_OPTIMIZERS``), and TensorRT fuses the bias into its GEMM.
"""

from __future__ import annotations

import numpy as np

from sdqes_edge.model.adapters import STEP_WIDTH_MULTIPLE

from .graph_edits import (
    attribute_value,
    constant_tensors,
    drop_unused_initializers,
    product_and_bias,
    readers_of,
    spliced,
    static_shapes,
    with_nodes,
)

# The columns a Concat gains to carry a bias: a 1, then zeros, so that its fp16 rows stay as aligned as the step
# form made them (a whole number of 16-byte pieces).
BIAS_COLUMNS = STEP_WIDTH_MULTIPLE
# A product whose output is at least this many times wider than its input takes its bias through a new Concat of
# its input with those columns (``fold_bias_into_wide_products``): the Concat reads and writes about the input's
# width, the bias Add it replaces the output's. On the H200 at 32 streams the MLP's bias Add over [6304, 3072] took
# 31 us, and a Concat to [6304, 552] 7 us; at one stream both are a couple of microseconds.
WIDE_PRODUCT_RATIO = 2


def split_gemm_bias(graph) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto``), every ``Gemm(A, W, b)`` whose weight and 1-D bias are
    constants (alpha = beta = 1, A not transposed) as ``Add(MatMul(A, W'), b)``, W' in the [in, out] layout
    MatMul takes; returns how many were rewritten. Output names are kept, so nothing downstream changes."""
    from onnx import helper, numpy_helper

    initializers = constant_tensors(graph)
    nodes, rewritten, transposed = [], 0, {}
    for node in graph.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight, bias = (node.input[1], node.input[2]) if len(node.input) == 3 else (None, None)
        # A transposed A (the one-stream attention's output projection) stays a Gemm: as a MatMul it would need
        # a Transpose that the CPU's Gemm does not.
        if (node.op_type != "Gemm" or weight not in initializers or bias not in initializers
                or len(initializers[bias].dims) != 1 or attributes.get("transA", 0)
                or attributes.get("alpha", 1.0) != 1.0 or attributes.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        if attributes.get("transB", 0):
            source = initializers[weight]
            if source.name not in transposed:  # a weight two layers share is transposed once
                matrix = np.ascontiguousarray(numpy_helper.to_array(source).T)
                transposed[source.name] = numpy_helper.from_array(matrix, f"{source.name}.in_out")
            weight = transposed[source.name].name
        product = f"{node.output[0]}.product"
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=f"{node.name}.product"))
        nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}.bias"))
        rewritten += 1
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    graph.graph.initializer.extend(transposed.values())
    drop_unused_initializers(graph)  # the [out, in] weights no node reads now
    return rewritten


def merge_sibling_products(graph) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto`` whose linear layers are MatMul then Add of a bias, as
    ``split_gemm_bias`` leaves them), each set of linear layers reading the same input as one product, one Add
    of their biases side by side and a Split; returns how many products were removed. Output names are kept.

    The QRNN's gates are such a pair (``QRNNLayer.gates``: Z and F over the same frames), two products and two
    bias kernels on a GPU where one of each and a Split do; the PyTorch model keeps them apart because on the CPU
    the forget gate's sigmoid fuses into its own Gemm, and the fp32 graph keeps that.
    """
    from onnx import helper, numpy_helper

    initializers = constant_tensors(graph)
    nodes = list(graph.graph.node)
    readers = readers_of(graph)
    graph_outputs = {o.name for o in graph.graph.output}
    siblings: dict[str, list] = {}  # input -> [(MatMul, its bias Add, weight, bias)]
    for node in nodes:
        weight = node.input[1] if node.op_type == "MatMul" else None
        after = readers.get(node.output[0], []) if weight else []
        if (weight not in initializers or len(initializers[weight].dims) != 2 or len(after) != 1
                or after[0].op_type != "Add" or node.output[0] in graph_outputs):
            continue
        bias = next((b for b in after[0].input if b != node.output[0]), None)
        if bias in initializers and list(initializers[bias].dims) == [initializers[weight].dims[1]]:
            siblings.setdefault(node.input[0], []).append((node, after[0], weight, bias))
    removed, replaced, new_initializers = set(), {}, []
    for source, group in siblings.items():
        if len(group) < 2:
            continue
        name = f"{group[0][0].name}.merged"
        weights = [numpy_helper.to_array(initializers[w]) for _, _, w, _ in group]
        biases = [numpy_helper.to_array(initializers[b]) for _, _, _, b in group]
        new_initializers += [numpy_helper.from_array(np.concatenate(weights, axis=1), f"{name}.weight"),
                             numpy_helper.from_array(np.concatenate(biases), f"{name}.bias"),
                             numpy_helper.from_array(np.array([w.shape[1] for w in weights], np.int64),
                                                     f"{name}.sizes")]
        replaced[id(group[0][0])] = [
            helper.make_node("MatMul", [source, f"{name}.weight"], [f"{name}.product"], name=f"{name}.product"),
            helper.make_node("Add", [f"{name}.product", f"{name}.bias"], [f"{name}.biased"], name=f"{name}.bias"),
            helper.make_node("Split", [f"{name}.biased", f"{name}.sizes"], [add.output[0] for _, add, _, _ in group],
                             name=f"{name}.split", axis=-1)]
        removed |= {id(n) for product, add, _, _ in group for n in (product, add)}
    rewritten = [new for node in nodes for new in replaced.get(id(node), [] if id(node) in removed else [node])]
    del graph.graph.node[:]
    graph.graph.node.extend(rewritten)
    graph.graph.initializer.extend(new_initializers)
    drop_unused_initializers(graph)  # the separate weights and biases
    return sum(len(group) - 1 for group in siblings.values() if len(group) >= 2)


def _biased_concat_products(graph, initializers: dict) -> list[tuple]:
    """(Concat, MatMul, Add, bias name, the Concat's axis) for each ``Add(MatMul(Concat(..), W), b)`` with a
    constant 2-D W and [out] b, where only the MatMul reads the Concat and only the Add reads the product."""
    producers = {out: node for node in graph.graph.node for out in node.output}
    readers = readers_of(graph)
    graph_outputs = {o.name for o in graph.graph.output}
    found = []
    for add in graph.graph.node:
        biased = product_and_bias(add, initializers, producers) if add.output[0] not in graph_outputs else None
        if biased is None:
            continue
        product_name, bias = biased
        product = producers[product_name]
        weight, concat = initializers.get(product.input[1]), producers.get(product.input[0])
        if (weight is None or concat is None or concat.op_type != "Concat" or len(weight.dims) != 2
                or list(initializers[bias].dims) != [weight.dims[1]]
                or len(readers[concat.output[0]]) != 1 or len(readers[product_name]) != 1):
            continue
        axis = attribute_value(concat, "axis", 0)
        found.append((concat, product, add, bias, axis))
    return found


def fold_bias_into_concat(graph) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto`` with static shapes, linear layers as MatMul then Add of a
    bias), each product of a Concat along the last axis ``Add(MatMul(Concat(a, b), W), bias)`` as
    ``MatMul(Concat(a, b, E), [W; bias; 0])``, E a constant [rows, BIAS_COLUMNS] whose first column is 1: the
    bias enters through the product, and its Add kernel is gone. Returns how many. Output names are kept."""
    from onnx import numpy_helper

    initializers = constant_tensors(graph)
    candidates = _biased_concat_products(graph, initializers)
    shapes = static_shapes(graph) if candidates else {}
    removed, added = set(), []
    for concat, product, add, bias, axis in candidates:
        shape = shapes.get(concat.output[0])
        if not shape or None in shape or axis not in (-1, len(shape) - 1):
            continue
        name = f"{product.name}.bias_in_product"
        weight, ones = _bias_in_product(initializers[product.input[1]], initializers[bias], shape)
        added += [numpy_helper.from_array(ones, f"{name}.ones"), numpy_helper.from_array(weight, f"{name}.weight")]
        concat.input.append(f"{name}.ones")
        product.input[1] = f"{name}.weight"
        product.output[0] = add.output[0]
        removed.add(id(add))
    with_nodes(graph, spliced(graph.graph.node, removed), added)  # (dropping the weights and biases taken in)
    return len(removed)


def _bias_in_product(weight, bias, input_shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(the weight [W; bias; 0], the constant block E [rows.., BIAS_COLUMNS] whose first column is 1) that carry
    ``bias`` through a product of ``input_shape`` concatenated with E: ``[x, E] @ [W; bias; 0] = x @ W + bias``."""
    from onnx import numpy_helper

    weight = numpy_helper.to_array(weight)
    ones = np.zeros(tuple(input_shape[:-1]) + (BIAS_COLUMNS,), weight.dtype)
    ones[..., 0] = 1
    rows = np.zeros((BIAS_COLUMNS, weight.shape[1]), weight.dtype)
    rows[0] = numpy_helper.to_array(bias)
    return np.concatenate((weight, rows)), ones


def fold_bias_into_wide_products(graph, shapes: dict[str, tuple] | None = None) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto`` with static shapes, linear layers as MatMul then Add of a
    bias), each ``Add(MatMul(x, W), bias)`` whose W is [K, N] with N >= WIDE_PRODUCT_RATIO * K (the MLP's first
    product, 768 -> 3072) as ``MatMul(Concat(x, E), [W; bias; 0])``, E as in ``fold_bias_into_concat``: a Concat
    over the narrow input replaces the bias Add over the wide output. Returns how many. Output names are kept.
    ``shapes``: the tensors' static shapes where ONNX cannot infer them (past ONNX Runtime's operators)."""
    from onnx import helper, numpy_helper

    initializers = constant_tensors(graph)
    producers = {out: node for node in graph.graph.node for out in node.output}
    readers, graph_outputs = readers_of(graph), {o.name for o in graph.graph.output}
    shapes = static_shapes(graph) if shapes is None else shapes
    added, concats, removed = {}, {}, set()
    for add in graph.graph.node:
        biased = product_and_bias(add, initializers, producers) if add.output[0] not in graph_outputs else None
        product = producers[biased[0]] if biased else None
        weight = initializers.get(product.input[1]) if product is not None else None
        if (weight is None or len(weight.dims) != 2 or weight.dims[1] < WIDE_PRODUCT_RATIO * weight.dims[0]
                or len(readers[biased[0]]) != 1):
            continue
        shape = shapes.get(product.input[0])
        if not shape or None in shape:
            continue
        name = f"{product.name}.bias_in_product"
        weight, ones = _bias_in_product(weight, initializers[biased[1]], shape)
        ones_name = "bias_columns." + "x".join(map(str, ones.shape))  # one block for every product of its rows
        added.setdefault(ones_name, numpy_helper.from_array(ones, ones_name))
        added[f"{name}.weight"] = numpy_helper.from_array(weight, f"{name}.weight")
        concats[id(product)] = [helper.make_node("Concat", [product.input[0], ones_name], [f"{name}.input"],
                                                 name=f"{name}.concat", axis=-1)]
        product.input[0], product.input[1], product.output[0] = f"{name}.input", f"{name}.weight", add.output[0]
        removed.add(id(add))
    with_nodes(graph, spliced(graph.graph.node, removed, before=concats), added.values())
    return len(removed)
