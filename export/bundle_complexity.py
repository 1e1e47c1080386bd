"""What a bundle's manifest records of its model's cost (``complexity``): parameters, MACs and FLOPs per frame
and per query, and the kernels a step executes, each split between the image tower alone and its adapters by
exporting the same tower without them and counting it the same way (export/complexity.py counts a graph)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from sdqes_edge.model import SDQESModel

from . import graphs
from .complexity import GraphComplexity, adapter_count, count_graph, graph_kernels, kernel_summary
from .options import ExportOptions


def _image_tower_alone(model: SDQESModel, batch: int, opset: int,
                       operators: str | None = None) -> tuple[GraphComplexity, dict]:
    """The same image tower without adapters, counted the same way (adapters = total - this): its complexity
    and the kernels its step executes, its graph written with ``operators`` (None: plain ONNX) as the step's."""
    backbone = SDQESModel(model.cfg.with_adapter("none")).eval()
    weights = {k: v for k, v in model.state_dict().items() if ".adapter" not in k}
    backbone.load_state_dict(weights, strict=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "backbone.onnx"
        graphs.export_step_graph(backbone, path, batch=batch, opset=opset, operators=operators)
        return count_graph(path), graph_kernels(path)


def manifest_complexity(model: SDQESModel, step: Path, text: Path, options: ExportOptions,
                        log: Callable[[str], None]) -> dict:
    """The manifest's ``complexity`` of the plain fp32 ``step`` graph and the ``text`` graph."""
    log("counting parameters and MACs ...")
    step_count = count_graph(step)
    step_kernels = graph_kernels(step)
    backbone, backbone_kernels = (_image_tower_alone(model, options.batch, options.opset)
                                  if model.cfg.adapter.kind != "none" else (step_count, step_kernels))
    return {
        "per_frame": {"batch": options.batch, "image_tower": backbone.to_dict(), "step_graph": step_count.to_dict(),
                      "adapters": {"parameters": model.visual.adapter_parameters(),
                                   "macs": step_count.macs - backbone.macs,
                                   "flops": step_count.flops - backbone.flops}},
        "per_query": {"text_graph": count_graph(text).to_dict()},
        "kernels": kernel_summary(step_kernels, backbone_kernels, adapter_count(model.cfg)),
    }


def kernels_in_form(model: SDQESModel, step: Path, options: ExportOptions) -> dict:
    """The kernel summary of the fp32 ``step`` graph written with ``options.fp32_operators``, against the image
    tower alone written the same way (its MACs are the plain graph's)."""
    step_kernels = graph_kernels(step)
    backbone_kernels = (_image_tower_alone(model, options.batch, options.opset, options.fp32_operators)[1]
                        if model.cfg.adapter.kind != "none" else step_kernels)
    return kernel_summary(step_kernels, backbone_kernels, adapter_count(model.cfg)) | {
        "operators": options.fp32_operators}
