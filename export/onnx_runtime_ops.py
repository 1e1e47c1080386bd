"""ONNX Runtime's fused operators (com.microsoft) in fp16 step graphs, written in and written back out.

The fp16 graph, the GPU format, carries two (``graphs.default_operators``), each fewer kernels on ONNX
Runtime's CUDA provider: each block's attention as one ``Attention`` node (traced so, export/attention_op.py)
and each residual Add inside the LayerNorm that reads it (``SkipLayerNormalization``, rewritten here). TensorRT
has neither: ``expand_attention`` and ``expand_skip_layer_norm`` write them back as plain ONNX before its parser
reads the graph (``build-engine``, through ``tensorrt_ops.as_tensorrt_reads_it``), and ONNX Runtime's TensorRT
provider hands these nodes to its CUDA provider.

SkipLayerNormalization. A pre-LN block reads its residual stream twice: the LayerNorm normalizes
``x + branch`` and the next residual adds to it. ONNX Runtime's own fusion (``SkipLayerNormFusion``) fuses an
Add into the LayerNorm after it only when the LayerNorm is that Add's one reader and the tensors are 3-D, so it
never fires on these graphs (2-D rows, every residual read twice), and on its CUDA provider each block ran the
residual Adds, the bias Add before them and the LayerNorm as separate kernels. ``SkipLayerNormalization`` does
all three in one kernel and hands out the sum for the residual's other readers (its fourth output). Per block,
``ln_1`` reads ``x + up(h) + up.bias`` (adapter 1) or ``x + c_proj(..) + c_proj.bias`` (the previous block's
MLP, where there is no adapter 1) and ``ln_2`` reads ``x + a``: 3 kernels fewer a block, 36 in a ViT-B/16 step
(606 kernels on the GPU for the QRNN step, 246 for the backbone: H200, CUPTI).

The fp32 graph stays plain ONNX, the reference every format is checked against: on the CPU the fusion ran the
ViT-B/16 QRNN step no faster (252.6 -> 261.7 ms, interleaved, 2-core Xeon).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .graph_edits import (
    attribute_value,
    constant_tensors,
    drop_unused_initializers,
    readers_of,
    spliced,
    static_shapes,
    with_nodes,
)

MS_DOMAIN = "com.microsoft"
ATTENTION = "Attention"
SKIP_LAYER_NORM = "SkipLayerNormalization"
SUM_OUTPUT = 3  # SkipLayerNormalization's outputs: normalized, mean, inverse std dev, input + skip + bias
MS_OPSET_VERSION = 1
LAYER_NORM_DEFAULT_EPSILON = 1e-5  # ONNX's LayerNormalization default


class _GraphView:
    """What the fusion reads of a graph: its nodes (one list of the node objects, matched by identity), who
    produces and who reads each tensor, its constants and every tensor's shape."""

    def __init__(self, graph):
        self.nodes = list(graph.graph.node)
        self.producers = {out: node for node in self.nodes for out in node.output}
        self.readers = Counter(name for node in self.nodes for name in node.input)
        self.outputs = {o.name for o in graph.graph.output}
        self.values, self.shapes = constant_tensors(graph), static_shapes(graph)
        self.constants = set(self.values) | {n.output[0] for n in self.nodes if n.op_type == "Constant"}

    def read_once(self, name: str, op_type: str = "Add"):
        """The node making ``name`` if it is an ``op_type`` whose output only one node reads, else None."""
        node = self.producers.get(name)
        if node is None or node.op_type != op_type or self.readers[name] != 1 or name in self.outputs:
            return None
        return node

    def bias_of(self, name: str, width: int):
        """If ``name`` is ``Add(product, bias)`` with a constant [width] bias that nothing else reads: (that Add,
        the product, the bias); else None."""
        add = self.read_once(name)
        for product, bias in (add.input, reversed(add.input)) if add is not None else ():
            if bias in self.constants and self.shapes.get(bias) == (width,) and product not in self.constants \
                    and self.shapes.get(product) == self.shapes.get(name):
                return add, product, bias
        return None


def _fold_biases(graph, view: _GraphView, add, width: int, fused_away: set, replacements: dict) -> tuple[list, str]:
    """The SkipLayerNormalization inputs (input, skip) and bias for the residual ``add``: the constant bias of a
    product feeding it folded in, or, where it adds a sum of branches (a block's attention and its second
    adapter), the biases of the branches' products that nothing else reads (the adapter's up-projection; the
    attention's output is also the adapter's input) added inside instead (``fused_away`` takes the nodes this
    removes, ``replacements`` the nodes it puts in a node's place)."""
    from onnx import helper, numpy_helper

    for position, operand in enumerate(add.input):
        found = view.bias_of(operand, width)
        if found is not None:  # the biased product first, so that the expansion adds in the same order
            bias_add, product, bias = found
            fused_away.add(id(bias_add))
            return [product, add.input[1 - position]], bias
    for position, operand in enumerate(add.input):
        pair = view.read_once(operand)
        parts = [view.bias_of(i, width) for i in pair.input] if pair is not None else []
        biased = [part for part in parts if part is not None]  # a biased product that only this sum reads
        if not biased:
            continue
        name = f"{pair.name}.unbiased"
        summed = sum(numpy_helper.to_array(view.values[bias]) for _, _, bias in biased)
        graph.graph.initializer.append(numpy_helper.from_array(summed, f"{name}.bias"))
        terms = [part[1] if part is not None else term for part, term in zip(parts, pair.input)]
        replacements[id(pair)] = [helper.make_node("Add", terms, [name], name=name)]
        fused_away.update(id(bias_add) for bias_add, _, _ in biased)
        return [name, add.input[1 - position]], f"{name}.bias"
    return list(add.input), ""


def fuse_skip_layer_norm(graph) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto``), every ``LayerNormalization(a + b)`` over the last axis, a
    and b two computed tensors of its shape, as one ``SkipLayerNormalization``, with the constant biases of the
    products feeding the sum folded in (``_fold_biases``); returns how many were rewritten. Names are kept: the
    sum, where anything else reads it, is the fused node's fourth output."""
    from onnx import helper

    view = _GraphView(graph)
    fused_away, replacements, fused_count = set(), {}, 0
    for ln in view.nodes:
        attributes = {a.name: helper.get_attribute_value(a) for a in ln.attribute}
        summed = ln.input[0] if ln.op_type == "LayerNormalization" else None
        add, shape = view.producers.get(summed), view.shapes.get(summed)
        if (add is None or add.op_type != "Add" or len(ln.input) != 3 or any(ln.output[1:])
                or not shape or len(shape) < 2 or None in shape
                or attributes.get("axis", -1) not in (-1, len(shape) - 1) or id(add) in replacements
                or any(i in view.constants or view.shapes.get(i) != shape for i in add.input)):
            continue
        inputs, bias = _fold_biases(graph, view, add, shape[-1], fused_away, replacements)
        keeps_sum = view.readers[summed] > 1 or summed in view.outputs
        outputs = [ln.output[0]] + (["", "", summed] if keeps_sum else [])
        inputs, outputs, before, after = _as_three_axes(graph, shape, inputs, outputs, ln.name)
        fused = helper.make_node(
            SKIP_LAYER_NORM, inputs + [ln.input[1], ln.input[2], bias], outputs, name=f"{ln.name}.skip",
            domain=MS_DOMAIN, epsilon=attributes.get("epsilon", LAYER_NORM_DEFAULT_EPSILON))
        # In the residual Add's place: every input is computed by then, and the sum is read no earlier.
        replacements[id(add)] = before + [fused] + after
        fused_away.add(id(ln))
        fused_count += 1
    nodes = [new for node in view.nodes if id(node) not in fused_away for new in replacements.get(id(node), [node])]
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    drop_unused_initializers(graph)  # biases now added inside, as one
    if fused_count and not any(o.domain == MS_DOMAIN for o in graph.opset_import):
        graph.opset_import.append(helper.make_opsetid(MS_DOMAIN, MS_OPSET_VERSION))
    return fused_count


def _as_three_axes(graph, shape: tuple, inputs: list, outputs: list, name: str) -> tuple[list, list, list, list]:
    """SkipLayerNormalization takes [rows, hidden] or [batch, sequence, hidden] tensors. Those of more axes (the
    sliding window's [B, W, L, D]) go in with their leading axes as one and come out in their own shape again:
    Reshapes, views that run no kernel. -> (inputs, outputs, the Reshapes before, the Reshapes after)."""
    if len(shape) <= 3:
        return inputs, outputs, [], []
    from onnx import helper

    flat = _constant(graph, f"{name}.skip.three_axes", np.array([-1, *shape[-2:]], np.int64))
    own = _constant(graph, f"{name}.skip.shape", np.array(shape, np.int64))
    flat_inputs = [f"{name}.skip.in{k}" for k in range(len(inputs))]  # a residual two LayerNorms read: two views
    flat_outputs = [f"{name}.skip.out{k}" if o else "" for k, o in enumerate(outputs)]
    before = [helper.make_node("Reshape", [i, flat], [f], name=f) for i, f in zip(inputs, flat_inputs)]
    after = [helper.make_node("Reshape", [f, own], [o], name=f) for o, f in zip(outputs, flat_outputs) if o]
    return flat_inputs, flat_outputs, before, after


def expand_skip_layer_norm(graph) -> int:
    """The inverse, for a graph reader without ONNX Runtime's operators (TensorRT's parser): every
    ``SkipLayerNormalization`` back to its bias Add, residual Add and ``LayerNormalization``; returns how many."""
    from onnx import helper

    nodes, expanded = [], 0
    for node in graph.graph.node:
        if node.op_type != SKIP_LAYER_NORM or node.domain != MS_DOMAIN:
            nodes.append(node)
            continue
        x, skip, gamma, beta, bias = (list(node.input) + [""] * 5)[:5]
        outputs = list(node.output) + [""] * 4
        summed = outputs[SUM_OUTPUT] or f"{node.name}.sum"
        if bias:
            nodes.append(helper.make_node("Add", [x, bias], [f"{node.name}.biased"], name=f"{node.name}.bias"))
            x = f"{node.name}.biased"
        nodes.append(helper.make_node("Add", [x, skip], [summed], name=f"{node.name}.residual"))
        epsilon = attribute_value(node, "epsilon", LAYER_NORM_DEFAULT_EPSILON)
        nodes.append(helper.make_node("LayerNormalization", [summed, gamma] + ([beta] if beta else []),
                                      [outputs[0]], name=f"{node.name}.norm", axis=-1, epsilon=epsilon))
        expanded += 1
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    return expanded


def _constant(graph, name: str, value: np.ndarray) -> str:
    from onnx import numpy_helper

    graph.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def expand_attention(graph) -> int:
    """Every ONNX Runtime ``Attention`` node of ``graph`` (an ``onnx.ModelProto``) written back as plain ONNX
    (``model.layers.mix_heads`` as the tracer writes it, with the in-projection before it), for a graph reader without
    ONNX Runtime's operators (TensorRT's parser); returns how many."""
    from onnx import helper

    initializers = constant_tensors(graph)  # a weight two blocks share (equal values) reaches one through Identity
    nodes, expanded = [], 0
    for node in list(graph.graph.node):
        if node.op_type != ATTENTION or node.domain != MS_DOMAIN:
            nodes.append(node)
            continue
        x, weight, bias = node.input[:3]
        heads = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "num_heads")
        width = initializers[weight].dims[0]
        head_dim = width // heads
        dtype = helper.tensor_dtype_to_np_dtype(initializers[weight].data_type)
        name = node.name or f"attention{expanded}"
        t = {k: f"{name}.{k}" for k in ("qkv", "biased", "heads", "split", "q", "k", "v", "scaled", "k_t",
                                         "scores", "weights", "mixed", "tokens_major")}
        nodes += [
            helper.make_node("MatMul", [x, weight], [t["qkv"]]),  # [N, L, 3D]
            helper.make_node("Add", [t["qkv"], bias], [t["biased"]]),
            helper.make_node("Reshape", [t["biased"], _constant(graph, f"{name}.heads_shape", np.array(
                [0, 0, 3 * heads, head_dim], np.int64))], [t["heads"]]),  # [N, L, 3H, hd]
            helper.make_node("Transpose", [t["heads"]], [t["split"]], perm=[0, 2, 1, 3]),  # [N, 3H, L, hd]
            helper.make_node("Split", [t["split"], _constant(graph, f"{name}.split_sizes", np.array(
                [heads] * 3, np.int64))], [t["q"], t["k"], t["v"]], axis=1),  # [N, H, L, hd] each
            helper.make_node("Mul", [t["q"], _constant(graph, f"{name}.scale", np.array(
                head_dim**-0.5, dtype))], [t["scaled"]]),
            helper.make_node("Transpose", [t["k"]], [t["k_t"]], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [t["scaled"], t["k_t"]], [t["scores"]]),  # [N, H, L, L]
            helper.make_node("Softmax", [t["scores"]], [t["weights"]], axis=-1),
            helper.make_node("MatMul", [t["weights"], t["v"]], [t["mixed"]]),  # [N, H, L, hd]
            helper.make_node("Transpose", [t["mixed"]], [t["tokens_major"]], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [t["tokens_major"], _constant(graph, f"{name}.rows_shape", np.array(
                [0, 0, width], np.int64))], [node.output[0]]),  # [N, L, D]
        ]
        expanded += 1
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    return expanded



def _a_bias_block(block: np.ndarray, weight: np.ndarray) -> bool:
    """Whether ``[x, block] @ weight`` is ``x @ W + b``: the block a column of ones then zero columns, and the
    weight's rows that meet the zeros zero (``gemm_bias._bias_in_product``)."""
    padding_rows = weight[len(weight) - block.shape[-1] + 1:]
    return bool((block[..., 0] == 1).all() and not block[..., 1:].any() and not padding_rows.any())


def bias_after_wide_products(graph) -> int:
    """Undo ``gemm_bias.fold_bias_into_wide_products`` for TensorRT, which adds a bias inside its GEMM for nothing
    and would copy the input into the Concat: each ``MatMul(Concat(x, E), [W; b; 0])``, E a constant bias block
    (``_a_bias_block``) that only that product reads, back to ``Add(MatMul(x, W), b)``; returns how many. (A QRNN
    gate's Concat of the frames, which its product needs anyway, keeps its block.)"""
    from onnx import helper, numpy_helper

    constants, readers = constant_tensors(graph), readers_of(graph)
    producers = {out: node for node in graph.graph.node for out in node.output}
    removed, bias_adds, added = set(), {}, []
    for product in graph.graph.node:
        concat = producers.get(product.input[0]) if product.op_type == "MatMul" else None
        if (concat is None or concat.op_type != "Concat" or len(concat.input) != 2 or concat.input[1] not in constants
                or product.input[1] not in constants or len(readers[concat.output[0]]) != 1):
            continue
        block = numpy_helper.to_array(constants[concat.input[1]])
        weight = numpy_helper.to_array(constants[product.input[1]])
        axis = attribute_value(concat, "axis", 0)
        if axis not in (-1, block.ndim - 1) or not _a_bias_block(block, weight):
            continue
        name, columns = f"{product.name}.bias_after", block.shape[-1]
        added += [numpy_helper.from_array(weight[:-columns], f"{name}.weight"),
                  numpy_helper.from_array(weight[-columns], f"{name}.bias")]
        bias_adds[id(product)] = [helper.make_node("Add", [f"{name}.product", f"{name}.bias"], [product.output[0]],
                                                   name=f"{name}.add")]
        product.input[0], product.input[1], product.output[0] = concat.input[0], f"{name}.weight", f"{name}.product"
        removed.add(id(concat))
    with_nodes(graph, spliced(graph.graph.node, removed, after=bias_adds), added)
    return len(removed)
