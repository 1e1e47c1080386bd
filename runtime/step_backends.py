"""The step backends by name (``--backend``): ONNX Runtime or TensorRT, each imported only when asked for, since a
device has one of them and may lack the other's libraries altogether."""

from __future__ import annotations

import warnings
from pathlib import Path

from sdqes_edge.contract import REFERENCE_PRECISION
from sdqes_edge.errors import UserError

from .backend import BACKENDS, StepBackend
from .bundle import Bundle, as_bundle


def make_backend(bundle: str | Path | Bundle, backend: str = "ort", precision: str = REFERENCE_PRECISION,
                 threads: int | None = None, ort_device: str = "cpu", ort_ops: str | Path | None = None
                 ) -> StepBackend:
    """The backend named ``backend`` stepping ``bundle``'s graph of ``precision``: what ``StreamingDetector`` makes
    unless it is given one (made once, one backend serves every detector of its bundle, as ``score``'s workers
    share theirs). ``ort_ops``: this project's ONNX Runtime kernel library (runtime/fused_ops.py), for "ort"."""
    bundle = as_bundle(bundle)
    if backend == "ort":
        from .onnxruntime_backend import OnnxRuntimeStep, SlowPrecisionWarning, slow_precision_words

        step = OnnxRuntimeStep(bundle.step_graph(precision), device=ort_device, threads=threads, fused_ops=ort_ops)
        if (words := slow_precision_words(precision, ort_device, bundle.root)) is not None:
            warnings.warn(words, SlowPrecisionWarning, stacklevel=3)  # at the program's StreamingDetector(...)
        return step
    if backend == "trt":
        from .tensorrt_backend import TensorRTStep

        return TensorRTStep.from_bundle(bundle, precision)
    raise UserError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
