"""What every benchmark section measures: models of a preset with random weights, and the frame and step
that time them. Random weights throughout: cost does not depend on weight values."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from sdqes_edge.config import ModelConfig, with_authors_adapter
from sdqes_edge.model import SDQESModel
from sdqes_edge.model.init import randomize_adapters
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.sample import sample_frames


def bench_model(cfg: ModelConfig, seed: int = 0) -> SDQESModel:
    return randomize_adapters(SDQESModel(cfg).eval(), seed=seed)


def bench_config(base: ModelConfig, kind: str) -> ModelConfig:
    return base if kind == "none" else with_authors_adapter(base, kind)


def bench_frame(cfg: ModelConfig, batch: int = 1) -> np.ndarray:
    pre = Preprocessor.from_config(cfg)
    return np.repeat(pre(sample_frames(1)[0])[None], batch, axis=0)


def ort_step(path: Path, frame: np.ndarray, threads: int | None) -> Callable[[], object]:
    runner = OnnxRuntimeStep(path, threads=threads)
    state = [runner.initial_state()]

    def step():
        state[0] = runner.step(frame, state[0]).state
    return step
