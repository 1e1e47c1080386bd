"""Numerical verification of exported graphs, run before a bundle is written.

fp32: the ONNX step graph under ONNX Runtime against the PyTorch step form
and the window form (``forward_clip``), over K frames with the state carried,
comparing embeddings and every next-state tensor at every frame.
fp16/int8: against the fp32 graph over a long stream, with the figures a
user needs to decide (worst error, lowest cosine, state drift, alert changes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from sdqes_edge.model import SDQESModel
from sdqes_edge.progress import with_progress
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep, State
from sdqes_edge.tolerances import FP32_EMBEDDING_ATOL, FP32_STATE_ATOL

from .drift import max_abs_error

# How a client hands the state outputs of one frame to the next; the right one is "as they are, by name".
Feedback = Callable[[State], State]


def feed_back_by_name(state: State) -> State:
    return state


def state_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """|actual - expected| in units of the state's own scale where it exceeds 1.

    State tensors are not normalized (a QRNN's hidden state can reach tens), and fp32
    carries about 7 digits, so a fixed absolute tolerance would fail large states for rounding.
    """
    scale = max(1.0, float(np.abs(expected).max())) if expected.size and np.isfinite(expected).all() else 1.0
    return max_abs_error(actual, expected) / scale


@dataclass
class StepVerification:
    frames: int
    batch: int
    max_embedding_error_vs_step: float
    max_embedding_error_vs_window: float
    max_state_error: float  # |onnx - torch| over every state tensor and frame, scaled as below
    worst_state: str | None
    text_max_error: float | None = None
    tolerance_embedding: float = FP32_EMBEDDING_ATOL
    tolerance_state: float = FP32_STATE_ATOL

    @property
    def passed(self) -> bool:
        return (self.max_embedding_error_vs_step <= self.tolerance_embedding
                and self.max_embedding_error_vs_window <= self.tolerance_embedding
                and self.max_state_error <= self.tolerance_state
                and (self.text_max_error is None or self.text_max_error <= self.tolerance_embedding))

    def summary(self) -> str:
        text = f", text {self.text_max_error:.1e}" if self.text_max_error is not None else ""
        state = f", state {self.max_state_error:.1e}" + (f" ({self.worst_state})" if self.worst_state else "")
        return (f"fp32 over {self.frames} frames: embedding vs step {self.max_embedding_error_vs_step:.1e}, "
                f"vs window {self.max_embedding_error_vs_window:.1e}{state}{text} "
                f"(tolerance {self.tolerance_embedding:.0e})")

    def to_dict(self) -> dict:
        return dict(asdict(self), passed=self.passed)


@torch.no_grad()
def verify_step_graph(model: SDQESModel, runner: OnnxRuntimeStep, frames: np.ndarray,
                      feedback: Feedback = feed_back_by_name, query_embeddings: np.ndarray | None = None,
                      show_progress: bool = False) -> StepVerification:
    """frames [K, B, 3, R, R]: ONNX Runtime step (state fed back through ``feedback``) against PyTorch.

    With query scoring fused into the graph, its logits are checked against ``embedding @ queries.T`` too.
    """
    model = model.eval()
    k, b = frames.shape[:2]
    torch_frames = torch.from_numpy(frames)
    window = model.forward_clip(torch_frames.transpose(0, 1)).numpy()  # [B, K, E]
    torch_state = model.init_state(b)
    onnx_state = runner.initial_state()
    worst_embedding_step = worst_embedding_window = worst_state = 0.0
    worst_state_name = None
    for t in with_progress(range(k), "verify fp32", "frame", enabled=show_progress):
        torch_embedding, torch_state = model.step(torch_frames[t], torch_state)
        result = runner.step(frames[t], onnx_state, query_embeddings)
        worst_embedding_step = max(worst_embedding_step, max_abs_error(result.embedding, torch_embedding.numpy()))
        if result.logits is not None:
            expected_logits = torch_embedding.numpy() @ query_embeddings.T
            worst_embedding_step = max(worst_embedding_step, max_abs_error(result.logits, expected_logits))
        worst_embedding_window = max(worst_embedding_window, max_abs_error(result.embedding, window[:, t]))
        for spec, expected in zip(runner.spec, torch_state):
            error = state_error(result.state[spec.name], expected.numpy())
            if error > worst_state:
                worst_state, worst_state_name = error, spec.name
        onnx_state = feedback(result.state)
    return StepVerification(k, b, worst_embedding_step, worst_embedding_window, worst_state, worst_state_name)


