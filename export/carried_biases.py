"""A bias added where its sum is read, not as a kernel of its own (fp16 graphs with ONNX Runtime's operators).

With adapters a block's residual stream is read between its LayerNorms: the MLP's ``x + c_proj(..) + bias``
by the next block's first adapter (its down-projection) before the LayerNorm after it, and the attention's
``a = out_proj(..) + bias`` by the second adapter and by the residual. ``SkipLayerNormalization`` takes one
bias (``onnx_runtime_ops.fuse_skip_layer_norm``), so those two biases stayed Adds of their own: on ONNX
Runtime's CUDA provider a kernel over the whole [rows, width] stream each, two a block, that a block without
adapters does not run.

Everything that reads such a sum is linear in it: residual Adds, linear layers (a product then the Add of a
constant bias) and SkipLayerNormalizations. So the sum is left without its bias, and each reader adds what
the bias would have made of it: ``bias @ W`` into a linear layer's own bias, ``bias`` into a
SkipLayerNormalization's; a residual Add passes the missing bias on to its own readers. Where any reader is
anything else (a nonlinearity, a graph output, a Concat into the state), the bias stays where it is.
"""

from __future__ import annotations

import numpy as np

from .graph_edits import constant_tensors, product_and_bias, readers_of, spliced, with_nodes
from .onnx_runtime_ops import SKIP_LAYER_NORM

SKIP_BIAS_INPUT = 4  # SkipLayerNormalization's inputs: input, skip, gamma, beta, bias


class _Graph:
    def __init__(self, graph):
        self.nodes = list(graph.graph.node)
        self.constants = constant_tensors(graph)
        self.producers = {out: n for n in self.nodes for out in n.output}
        self.readers = readers_of(graph)
        self.outputs = {o.name for o in graph.graph.output}

    def linear_bias(self, product):
        """The Add of a constant bias to ``product`` (a MatMul with a constant 2-D weight), if it is the product's
        one reader; else None."""
        after = self.readers.get(product.output[0], [])
        if product.input[1] not in self.constants or len(self.constants[product.input[1]].dims) != 2 \
                or len(after) != 1 or product.output[0] in self.outputs:
            return None
        found = product_and_bias(after[0], self.constants, self.producers)
        return after[0] if found is not None and found[0] == product.output[0] else None


def _readers_plan(view: _Graph, start: str) -> list | None:
    """What must take in the bias of the sum ``start`` if the sum comes without it: [("linear", MatMul) |
    ("skip", SkipLayerNormalization)], one entry per read; None where a reader is not linear in it."""
    plan, frontier, seen = [], [start], set()
    while frontier:
        tensor = frontier.pop()
        if tensor in view.outputs:
            return None
        for reader in view.readers.get(tensor, []):
            if id(reader) in seen:  # read twice (two inputs of one node): not worth the bookkeeping
                return None
            seen.add(id(reader))
            if reader.op_type == "MatMul" and reader.input[0] == tensor and view.linear_bias(reader) is not None:
                plan.append(("linear", reader))
            elif reader.op_type == SKIP_LAYER_NORM and tensor in reader.input[:2] and (
                    len(reader.input) <= SKIP_BIAS_INPUT or reader.input[SKIP_BIAS_INPUT] in view.constants
                    or not reader.input[SKIP_BIAS_INPUT]):
                plan.append(("skip", reader))
            elif reader.op_type == "Add" and not any(i in view.constants for i in reader.input):
                # a residual: its sum comes without the bias too (broadcast along the leading axes, if at all)
                frontier.append(reader.output[0])
            else:
                return None
    return plan


def carry_biases_to_readers(graph) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto``, after ``fuse_skip_layer_norm``), each ``Add(product, bias)``
    that only linear readers read (see the module's docstring) so that they add the bias; returns how many bias
    Adds are gone. Output names are kept; every new constant is a new initializer (a shared one stays as it was)."""
    from onnx import numpy_helper

    view = _Graph(graph)
    gone, renamed = set(), {}
    biases = {}  # the new bias constants ("<old name>.carried") -> their values

    def summed(name: str, extra: np.ndarray, dtype, fresh: str) -> str:
        """A new constant, the bias ``name`` ("" for none) plus ``extra``; its name (``fresh`` where there was none).
        A bias made here is no constant of ``view``'s, so no later plan adds to it again (it stops there)."""
        old = numpy_helper.to_array(view.constants[name]).astype(np.float32) if name else 0
        new = f"{name}.carried" if name else fresh
        biases[new] = (old + extra).astype(dtype)
        return new

    touched = set()  # the bias Adds of linear layers this rewrite changed: none of them is also removed
    for add in view.nodes:
        found = product_and_bias(add, view.constants, view.producers) if id(add) not in touched else None
        plan = _readers_plan(view, add.output[0]) if found is not None else None
        targets = {id(view.linear_bias(r)) for kind, r in plan or () if kind == "linear"}
        if not plan or targets & gone:
            continue
        touched |= targets
        product, bias = found
        own = numpy_helper.to_array(view.constants[bias])
        dtype, carried = own.dtype, own.astype(np.float32)
        for kind, reader in plan:
            if kind == "linear":
                bias_add = view.linear_bias(reader)
                position = 1 if bias_add.input[0] == reader.output[0] else 0
                weight = numpy_helper.to_array(view.constants[reader.input[1]]).astype(np.float32)
                bias_add.input[position] = summed(bias_add.input[position], carried @ weight, dtype, fresh="")
            else:
                while len(reader.input) <= SKIP_BIAS_INPUT:
                    reader.input.append("")
                reader.input[SKIP_BIAS_INPUT] = summed(reader.input[SKIP_BIAS_INPUT], carried, dtype,
                                                       fresh=f"{reader.name}.bias.carried")
        renamed[add.output[0]] = product
        gone.add(id(add))
    for node in view.nodes:
        for k, name in enumerate(node.input):
            node.input[k] = renamed.get(name, name)
    # the biases summed into new ones are dropped with the initializers no node reads
    with_nodes(graph, spliced(view.nodes, gone), [numpy_helper.from_array(a, name) for name, a in biases.items()])
    return len(gone)
