"""sdqes_edge.export: from a model to a deployment bundle (torch, onnx, onnxruntime).

The exporter traces ``ImageTower.step`` (the same definition the window form
uses) into the single-step ONNX graph described in DESIGN.md section 3; its
state inputs and outputs come from ``ImageTower.state_spec``.

The names below are loaded on first use, so the command line can describe
its export options without importing torch.
"""

from __future__ import annotations

from importlib import import_module

_LAZY = {"ExportOptions": "exporter", "ExportResult": "exporter", "Query": "exporter", "export_bundle": "exporter",
         "requantize_int8": "requantize", "build_engine": "tensorrt_engine"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
