"""A reduced-precision form of a step against the fp32 graph over a long stream, the state carried.

Torch-free, so the device that builds a TensorRT engine can check it the way the exporter checks its
fp16 and int8 graphs: the same figures, the same tolerances (``tolerances.VARIANT_TOLERANCES``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from sdqes_edge.errors import UserError
from sdqes_edge.metrics import rising_edge_mask
from sdqes_edge.progress import with_progress
from sdqes_edge.runtime.backend import State
from sdqes_edge.runtime.queries import score
from sdqes_edge.tolerances import VARIANT_TOLERANCES


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


def run_stream(runner, frames: np.ndarray, desc: str, show_progress: bool = False,
               query_embeddings: np.ndarray | None = None) -> StreamRecord:
    """Any step backend (ONNX Runtime, bound or not, or a TensorRT engine) over ``frames`` [T, B, 3, R, R]."""
    state = runner.initial_state()
    embeddings = []
    for t in with_progress(range(len(frames)), desc, "frame", enabled=show_progress):
        result = runner.step(frames[t], state, query_embeddings)
        embeddings.append(result.embedding)
        state = result.state
    return StreamRecord(np.stack(embeddings), runner.state_to_numpy(state))


def compare_variant(precision: str, reference: StreamRecord, variant: StreamRecord, query_embeddings: np.ndarray,
                    threshold: float, tolerance: dict | None = None) -> VariantReport:
    """A reduced-precision graph's stream against the fp32 graph's on the same frames, judged by ``tolerance``
    (default: ``VARIANT_TOLERANCES[precision]``)."""
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
                         *alerts(threshold), threshold, probe, *alerts(probe),
                         dict(tolerance or VARIANT_TOLERANCES[precision]))
