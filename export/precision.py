"""Reduced-precision step graphs.

fp16 is traced from an fp16 copy of the model (``graphs.compute_copy``), so
weights and compute are fp16 while inputs, outputs and state stay fp32 and
LayerNorm and softmax run in fp32. int8 is ONNX Runtime's static
quantization in QDQ form (explicit QuantizeLinear/DequantizeLinear pairs),
symmetric with zero points at 0 and per-channel weights, which is the form
TensorRT's explicit-quantization path accepts; only the matrix products with a
weight and the convolutions are quantized, so LayerNorm, the recurrent state and
the products of two activations (attention, retention) stay float: quantizing
those too made the B/16 QRNN step 1.54x faster than fp32 instead of 1.76x, the
activations being re-quantized every frame.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from ..runtime.onnxruntime_backend import OnnxRuntimeStep

INT8_OPS = ["MatMul", "Gemm", "Conv"]


def calibration_feeds(fp32_graph: Path, frames: np.ndarray,
                      query_embeddings: np.ndarray | None = None) -> Iterator[dict[str, np.ndarray]]:
    """The inputs the step graph sees on a real stream: each frame with the state carried to it.

    Calibrating on zero state would set the state's ranges from a stream that never started.
    Generated lazily: a ViT-B/16 RetNet state is 1.1 GiB per stream, too much to hold per frame.
    """
    runner = OnnxRuntimeStep(fp32_graph)
    state = runner.initial_state()
    for frame in frames:
        feed = {"frame": frame, **{t.input_name: state[t.name] for t in runner.spec}}
        if runner.fused_queries:
            feed["query_embeddings"] = query_embeddings
        yield feed
        state = runner.step(frame, state, query_embeddings).state


class _FeedReader:
    """onnxruntime.quantization's CalibrationDataReader protocol over an iterator of feeds."""

    def __init__(self, feeds: Iterator[dict[str, np.ndarray]]):
        self._feeds = feeds

    def get_next(self):
        return next(self._feeds, None)


def quantize_int8(fp32_graph: Path, out_path: Path, calibration_frames: np.ndarray,
                  query_embeddings: np.ndarray | None = None, feeds: Iterator[dict] | None = None) -> None:
    """fp32 step graph -> QDQ int8 graph calibrated on ``calibration_frames`` [N, B, 3, R, R].

    ``feeds`` replaces the stream-with-state feeds for a graph with other inputs (the window graph).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if feeds is None:
        feeds = calibration_feeds(fp32_graph, calibration_frames, query_embeddings)
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(fp32_graph), str(prepared), skip_symbolic_shape=True)
        import onnx

        from .complexity import activation_matmuls

        keep_float = activation_matmuls(onnx.load(str(prepared), load_external_data=False))
        quantize_static(
            str(prepared), str(out_path), _FeedReader(feeds),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=INT8_OPS,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
            nodes_to_exclude=keep_float,
        )
