"""Weight initialisation helpers beyond the paper's identity init."""

from __future__ import annotations

import math

import torch
from torch import nn

# Parameters that write an adapter's result back into the residual stream.
OUTPUT_PROJECTIONS = ("D_fc2.", "qrnn_up.")


@torch.no_grad()
def randomize_adapters(model: nn.Module, seed: int = 0, std: float = 1.0, output_gain: float = 0.1) -> nn.Module:
    """Give every adapter parameter random values (a stand-in for a trained adapter).

    The paper's initialisation makes an untrained adapter the identity, which
    would let a broken temporal path pass an equivalence check; this makes every
    path, forget gates and output projections included, contribute.

    Weights get ``std / sqrt(fan_in)`` so activations keep their scale at any
    width, and output projections a further ``output_gain``, so each adapter
    adds a perturbation to the residual stream as a trained one does; without
    it 24 adapters stacked in ViT-B/16 would grow the stream (and the QRNN
    state) without bound. Vectors (biases, norms) get ``0.1 * std``.
    """
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if ".adapter" not in name:
            continue
        if param.dim() >= 2:
            fan_in = math.prod(param.shape[1:]) if param.dim() > 2 or "retention." not in name else param.shape[0]
            scale = std / math.sqrt(fan_in)
            if any(key in name for key in OUTPUT_PROJECTIONS):
                scale *= output_gain
        else:
            scale = 0.1 * std
        param.copy_(torch.randn(param.shape, generator=generator) * scale)
    return model
