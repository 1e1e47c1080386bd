"""Numerical verification of exported graphs, run before a bundle is written.

fp32: the ONNX step graph under ONNX Runtime against the PyTorch step form
and the window form (``forward_clip``), over K frames with the state carried,
comparing embeddings and every next-state tensor at every frame.
fp16/int8: against the fp32 graph over a long stream, with the figures a
user needs to decide (worst error, lowest cosine, state drift, alert changes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from sdqes_edge.errors import UserError
from sdqes_edge.metrics import rising_edge_mask
from sdqes_edge.model import SDQESModel
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep, State
from sdqes_edge.runtime.queries import score
from sdqes_edge.tolerances import FP32_EMBEDDING_ATOL, FP32_STATE_ATOL, VARIANT_TOLERANCES

# How a client hands the state outputs of one frame to the next; the right one is "as they are, by name".
Feedback = Callable[[State], State]


def feed_back_by_name(state: State) -> State:
    return state


class VerificationError(UserError):
    """An exported graph that does not compute what the model computes."""


class VariantDriftError(VerificationError):
    """A reduced-precision graph that drifts from the fp32 graph beyond its tolerance (``precision`` says which)."""

    def __init__(self, precision: str, message: str):
        super().__init__(message)
        self.precision = precision


def max_abs_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Largest |actual - expected|; inf where either is not finite (NaN must never pass a check)."""
    if not (np.isfinite(actual).all() and np.isfinite(expected).all()):
        return float("inf")
    return float(np.abs(actual - expected).max()) if actual.size else 0.0


def state_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """|actual - expected| in units of the state's own scale where it exceeds 1.

    State tensors are not normalized (a QRNN's hidden state can reach tens), and fp32
    carries about 7 digits, so a fixed absolute tolerance would fail large states for rounding.
    """
    scale = max(1.0, float(np.abs(expected).max())) if expected.size and np.isfinite(expected).all() else 1.0
    return max_abs_error(actual, expected) / scale


def _progress(iterable, total: int, desc: str, show: bool):
    if not show:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="frame", leave=False)


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
    for t in _progress(range(k), k, "verify fp32", show_progress):
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


@dataclass
class VariantReport:
    precision: str
    frames: int
    max_abs_embedding_error: float
    min_cosine: float
    final_state_max_error: float  # largest |variant - fp32| over every state tensor after the last frame
    final_state_scale: float  # largest |fp32 state| then, to read the error against
    alerts_reference: int  # alerts (rising edges of p > threshold) the fp32 graph raises on the probe queries
    alerts_changed: int  # (query, frame) alerts present in one graph and not the other
    threshold: float
    # The same at a threshold the fp32 stream crosses (its 90th percentile of p), so that a model whose
    # scores never reach the default threshold (random weights) still shows whether alerts move.
    probe_threshold: float
    alerts_reference_at_probe: int
    alerts_changed_at_probe: int
    tolerance: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (self.min_cosine >= self.tolerance["min_cosine"]
                and self.max_abs_embedding_error <= self.tolerance["max_abs_embedding"])

    def summary(self) -> str:
        return (f"{self.precision} over {self.frames} frames: max |emb - fp32| {self.max_abs_embedding_error:.2e}, "
                f"min cosine {self.min_cosine:.6f}, final state error {self.final_state_max_error:.2e} "
                f"(state scale {self.final_state_scale:.2f}), alerts changed {self.alerts_changed} of "
                f"{self.alerts_reference} at threshold {self.threshold:.2f}, {self.alerts_changed_at_probe} of "
                f"{self.alerts_reference_at_probe} at {self.probe_threshold:.4f}")

    def to_dict(self) -> dict:
        return dict(asdict(self), passed=self.passed)


@dataclass
class StreamRecord:
    """A graph's outputs over a stream: embeddings [T, B, E] and the state after the last frame."""

    embeddings: np.ndarray
    final_state: State


def run_stream(runner: OnnxRuntimeStep, frames: np.ndarray, desc: str, show_progress: bool = False,
               query_embeddings: np.ndarray | None = None) -> StreamRecord:
    state = runner.initial_state()
    embeddings = []
    for t in _progress(range(len(frames)), len(frames), desc, show_progress):
        result = runner.step(frames[t], state, query_embeddings)
        embeddings.append(result.embedding)
        state = result.state
    return StreamRecord(np.stack(embeddings), state)


def compare_variant(precision: str, reference: StreamRecord, variant: StreamRecord, query_embeddings: np.ndarray,
                    threshold: float) -> VariantReport:
    """A reduced-precision graph's stream against the fp32 graph's on the same frames."""
    ref, var = reference.embeddings, variant.embeddings
    cosine = (ref * var).sum(-1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(var, axis=-1))
    min_cosine = float(cosine.min()) if np.isfinite(cosine).all() else float("-inf")
    state_error = max((max_abs_error(variant.final_state[n], s) for n, s in reference.final_state.items()),
                      default=0.0)
    state_scale = max((float(np.abs(s).max()) for s in reference.final_state.values()), default=0.0)
    p_ref = score(ref, query_embeddings)[1]  # [T, B, Q]
    p_var = score(var, query_embeddings)[1]

    def alerts(threshold_: float) -> tuple[int, int]:
        a_ref, a_var = rising_edge_mask(p_ref, threshold_), rising_edge_mask(p_var, threshold_)
        return int(a_ref.sum()), int((a_ref != a_var).sum())

    probe = float(np.quantile(p_ref, 0.9))
    return VariantReport(precision, len(ref), max_abs_error(var, ref), min_cosine, state_error, state_scale,
                         *alerts(threshold), threshold, probe, *alerts(probe), dict(VARIANT_TOLERANCES[precision]))
