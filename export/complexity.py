"""Parameters, MACs and FLOPs per frame, counted from an exported graph, operator by operator.

MACs are counted for the operators that carry the arithmetic: MatMul and Gemm
(split into products with a weight, and products of two activations such as
attention's q·kᵀ and p·v or retention's state updates) and Conv. FLOPs are
2 x MACs, the convention behind the published CLIP figures (17.6 GMACs,
35.1 GFLOPs). Element-wise operators are not counted (they are a fraction of a
percent). Parameters are the elements of the graph's floating-point weights: in a step graph with adapters
they include the zero weights the step form widens bottlenecks with (``model.adapters.STEP_WIDTH_MULTIPLE``),
so the adapters' parameters are counted on the model (``ImageTower.adapter_parameters``), and the MACs here are
the ones the step executes, the widening's included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

_FLOAT_TYPES = {1, 10, 11, 16}  # onnx TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass
class GraphComplexity:
    parameters: int
    macs: int
    macs_by_category: dict[str, int] = field(default_factory=dict)

    @property
    def flops(self) -> int:
        return 2 * self.macs

    def to_dict(self) -> dict:
        return dict(asdict(self), flops=self.flops)


def _shapes(graph_proto) -> dict[str, list[int]]:
    # ONNX Runtime's symbolic inference follows shapes computed inside the graph (Shape -> Reshape chains),
    # which onnx's own inference leaves unknown.
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inferred = SymbolicShapeInference.infer_shapes(graph_proto, auto_merge=True)
    shapes: dict[str, list[int]] = {}
    for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    for init in inferred.graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def count_graph(path: str | Path) -> GraphComplexity:
    """Count a graph with static shapes (a dynamic axis, as the text graph's, is counted at 1)."""
    import onnx

    model = onnx.load(str(path))
    for value in list(model.graph.input) + list(model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.dim_value = 1  # per query / per stream
    shapes = _shapes(model)
    weights = {init.name for init in model.graph.initializer}
    constants = {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    weights |= constants
    parameters = _parameters(model)
    producers = {out: node for node in model.graph.node for out in node.output}
    by_category: dict[str, int] = {}

    def add(category: str, macs: int) -> None:
        by_category[category] = by_category.get(category, 0) + int(macs)

    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            out = shapes.get(node.output[0])
            a = shapes.get(node.input[0])
            if out is None or a is None:
                raise ValueError(f"cannot count {node.name}: shapes unknown (export with static shapes)")
            trans_a = any(att.name == "transA" and att.i for att in node.attribute)
            inner = a[-2] if (node.op_type == "Gemm" and trans_a) else a[-1]
            with_weight = any(_is_weight(i, weights, producers) for i in node.input[:2])
            add("matmul_weight" if with_weight else "matmul_activations", np.prod(out, dtype=np.int64) * inner)
        elif node.op_type == "Conv":
            out = shapes[node.output[0]]
            kernel = shapes[node.input[1]]  # [C_out, C_in / groups, k...]
            add("conv", np.prod(out, dtype=np.int64) * np.prod(kernel[1:], dtype=np.int64))
    return GraphComplexity(parameters, sum(by_category.values()), by_category)


def _parameters(model) -> int:
    """Elements of floating-point weights, counted once per operator that reads them.

    Per use, because the exporter merges identical initializers (the all-ones
    LayerNorm scales of a freshly built model become one tensor); scalars
    (activation constants such as QuickGELU's 1.702) are not parameters.
    """
    sizes = {init.name: int(np.prod(init.dims, dtype=np.int64)) for init in model.graph.initializer
             if init.data_type in _FLOAT_TYPES}
    return sum(sizes.get(name, 0) for node in model.graph.node for name in node.input if sizes.get(name, 0) > 1)


def activation_matmuls(model) -> list[str]:
    """Names of the MatMul nodes whose inputs are both activations (attention's q.k^T and p.v, retention)."""
    weights = {init.name for init in model.graph.initializer}
    weights |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    producers = {out: node for node in model.graph.node for out in node.output}
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and not any(_is_weight(i, weights, producers) for i in n.input[:2])]


def weight_source(name: str, weights: set[str], producers: dict) -> str | None:
    """The weight (initializer or Constant output) that tensor ``name`` is, or None for an activation."""
    if name in weights:
        return name
    # A weight behind a DequantizeLinear (int8 QDQ graphs), a Cast (fp16) or a Transpose is still a weight.
    node = producers.get(name)
    if node is not None and node.op_type in ("DequantizeLinear", "Cast", "Transpose"):
        return weight_source(node.input[0], weights, producers)
    return None


def _is_weight(name: str, weights: set[str], producers: dict) -> bool:
    return weight_source(name, weights, producers) is not None


# --- kernels a step executes ---------------------------------------------------------

def adapter_count(cfg) -> int:
    """Adapters in the image tower (0 without adapters)."""
    return 0 if cfg.adapter.kind == "none" else cfg.vision.layers * cfg.adapter.per_block


def runtime_casts(graph) -> list:
    """The Cast nodes of an ONNX graph that a step runs: those not computed from constants alone (ONNX Runtime
    folds those away). ONNX Runtime's CPU provider adds Casts of its own around ops it has no fp16 kernel for,
    so for an fp16 graph this count, not the CPU profile's, is what a GPU runs."""
    constant = {i.name for i in graph.initializer}
    for node in graph.node:  # nodes come in topological order
        if all(i in constant for i in node.input if i):
            constant.update(node.output)
    return [n for n in graph.node if n.op_type == "Cast" and n.output[0] not in constant]


def graph_casts(path: str | Path) -> int:
    """How many Casts a step of the graph at ``path`` runs (``runtime_casts``)."""
    import onnx

    return len(runtime_casts(onnx.load(str(path), load_external_data=False).graph))


def graph_kernels(path: str | Path) -> dict:
    """ONNX nodes and the Casts among them a step runs, and kernels ONNX Runtime (CPU) executes per step, by
    operator."""
    import onnx

    from sdqes_edge.runtime.kernels import count_kernels

    graph = onnx.load(str(path), load_external_data=False).graph
    return {"onnx_nodes": len(graph.node), "graph_casts": len(runtime_casts(graph)), **count_kernels(path).to_dict()}


def kernel_summary(step: dict, image_tower: dict, adapters: int) -> dict:
    """Kernels per step of the step graph and of the same tower without adapters, and per adapter."""
    summary = {"step_graph": step, "image_tower": image_tower, "adapters": adapters}
    if adapters:
        summary["per_adapter"] = {
            "kernels": (step["per_step"] - image_tower["per_step"]) / adapters,
            "computing": (step["computing"] - image_tower["computing"]) / adapters,
            "onnx_nodes": (step["onnx_nodes"] - image_tower["onnx_nodes"]) / adapters,
        }
    return summary
