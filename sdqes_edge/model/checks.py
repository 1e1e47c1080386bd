"""Long-stream checks of the step form: does the carried state stay finite and bounded?"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sdqes_model import SDQESModel


@dataclass
class SoakReport:
    frames: int
    finite: bool
    max_state_abs: float  # over all state tensors and all frames
    max_state_name: str
    max_state_abs_first_half: float
    max_state_abs_second_half: float  # bounded means this does not keep growing

    @property
    def growth(self) -> float:
        return self.max_state_abs_second_half / max(self.max_state_abs_first_half, 1e-30)


@torch.inference_mode()
def soak(model: SDQESModel, frames: int, seed: int = 0, batch: int = 1) -> SoakReport:
    """Step ``frames`` random frames through the model, tracking the largest state magnitude."""
    generator = torch.Generator().manual_seed(seed)
    size = model.cfg.vision.image_size
    names = model.state_spec(batch).names
    state = model.init_state(batch)
    finite = True
    halves = [0.0, 0.0]
    peak, peak_name = 0.0, names[0] if names else "-"
    for t in range(frames):
        emb, state = model.step(torch.randn(batch, 3, size, size, generator=generator), state)
        finite = finite and bool(torch.isfinite(emb).all())
        for name, tensor in zip(names, state):
            magnitude = float(tensor.abs().max())
            finite = finite and magnitude == magnitude and magnitude != float("inf")
            half = 0 if t < frames // 2 else 1
            halves[half] = max(halves[half], magnitude)
            if magnitude > peak:
                peak, peak_name = magnitude, name
    return SoakReport(frames, finite, peak, peak_name, halves[0], halves[1])
