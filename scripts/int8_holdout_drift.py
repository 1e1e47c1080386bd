"""int8 against fp32 on streams held out from calibration: the measurement behind the int8 defaults.

The exporter's drift check streams the video it calibrated on; this script calibrates on synthetic training
streams and measures on validation streams no calibration saw, which is where a quantization choice shows
whether it generalizes (on the demo model, every block int8 gives min cosine 0.9984 on its calibration stream
but 0.980 held out; with the first block float, 0.9987 and 0.9956). Uses the exporter's own quantize_int8,
run_stream and compare_variant.

    .venv/bin/python scripts/int8_holdout_drift.py BUNDLE/step.fp32.onnx [--float-blocks 0] [--activations symmetric]
    .venv/bin/python scripts/int8_holdout_drift.py BUNDLE/step.fp32.onnx --int8-graph BUNDLE/step.int8.onnx
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from sdqes_edge.config import ModelConfig
from sdqes_edge.export.drift import compare_variant, run_stream
from sdqes_edge.export.graphs import read_metadata
from sdqes_edge.export.precision import (
    DEFAULT_CALIBRATION_FRAMES,
    DEFAULT_INT8_ACTIVATIONS,
    INT8_ACTIVATIONS,
    quantize_int8,
)
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.synthetic import generate_stream
from sdqes_edge.tolerances import DRIFT_FRAMES
from sdqes_edge.train_options import split_seeds

STREAM_SECONDS = 60.0


def split_frames(preprocessor: Preprocessor, split: str, count: int) -> np.ndarray:
    """``count`` frames [count, 1, 3, R, R] of a split's 1-fps synthetic streams, back to back."""
    streams = -(-count // int(STREAM_SECONDS))
    frames = [preprocessor.batch(generate_stream(seed, STREAM_SECONDS, 1.0).frames)
              for seed in split_seeds(split, streams)]
    return np.concatenate(frames)[:count, None]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph", type=Path, help="an fp32 step graph (BUNDLE/step.fp32.onnx)")
    parser.add_argument("--float-blocks", type=int, default=1, help="leading tower blocks kept float (default 1)")
    parser.add_argument("--activations", choices=list(INT8_ACTIVATIONS), default=DEFAULT_INT8_ACTIVATIONS)
    parser.add_argument("--calibration-frames", type=int, default=DEFAULT_CALIBRATION_FRAMES)
    parser.add_argument("--drift-frames", type=int, default=DRIFT_FRAMES)
    parser.add_argument("--int8-graph", type=Path, help="measure this int8 graph (a bundle's) instead of quantizing")
    args = parser.parse_args(argv)
    model = ModelConfig.from_dict(read_metadata(args.graph)["model"])
    preprocessor = Preprocessor.from_config(model)
    with tempfile.TemporaryDirectory() as tmp:
        int8 = args.int8_graph or Path(tmp) / "step.int8.onnx"
        if args.int8_graph is None:
            made = quantize_int8(args.graph, int8, split_frames(preprocessor, "train", args.calibration_frames),
                                 activations=args.activations, float_blocks=args.float_blocks)
            print(made.summary())
        held_out = split_frames(preprocessor, "val", args.drift_frames)
        reference = run_stream(OnnxRuntimeStep(args.graph), held_out, "fp32", show_progress=True)
        variant = run_stream(OnnxRuntimeStep(int8), held_out, "int8", show_progress=True)
    embeddings = reference.embeddings[:, 0], variant.embeddings[:, 0]
    cosine = (embeddings[0] * embeddings[1]).sum(-1) / np.prod([np.linalg.norm(e, axis=-1) for e in embeddings], 0)
    queries = np.eye(model.embed_dim, dtype=np.float32)[:4]  # only the cosine and state figures matter here
    print(compare_variant("int8", reference, variant, queries, 0.5).summary())
    print(f"held out: {len(cosine)} validation frames, 1st percentile of cosine {np.quantile(cosine, 0.01):.5f}, "
          f"{int((cosine < 0.99).sum())} frames below 0.99")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
