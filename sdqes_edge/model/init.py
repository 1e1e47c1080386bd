"""Weight initialisation helpers beyond the paper's identity init."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def randomize_adapters(model: nn.Module, seed: int = 0, std: float = 0.1) -> nn.Module:
    """Give every adapter parameter random values (a stand-in for a trained adapter).

    The paper's initialisation makes an untrained adapter the identity, which
    would let a broken temporal path pass an equivalence check; this makes every
    path, forget gates and up-projections included, contribute.
    """
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if ".adapter" in name:
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model
