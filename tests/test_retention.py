"""Retention with xPos: the window form matches the reference's formulation, the step form equals it."""

from __future__ import annotations

import pytest
import torch

from sdqes_edge.model.retention import SimpleRetention


def reference_xpos(x: torch.Tensor, downscale: bool, scale_base: int = 512) -> torch.Tensor:
    """The reference's xPos, transcribed independently: sin/cos tables duplicated onto interleaved
    channel pairs, a rotate-every-two of the input, the per-pair scale zeta^(n/scale_base)."""
    length, dim = x.shape[-2], x.shape[-1]
    zeta = (torch.arange(0, dim, 2) + 0.4 * dim) / (1.4 * dim)
    scale = zeta ** (torch.arange(length).float() / scale_base)[:, None]  # [T, d/2]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim // 2) / (dim // 2)))
    angles = torch.arange(length).float()[:, None] * inv_freq[None, :]
    sin, cos = torch.sin(angles), torch.cos(angles)
    if downscale:
        scale = 1 / scale
    sin = (sin * scale).repeat_interleave(2, dim=-1)
    cos = (cos * scale).repeat_interleave(2, dim=-1)
    rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos + rotated * sin


def reference_parallel_retention(r: SimpleRetention, x: torch.Tensor) -> torch.Tensor:
    q = reference_xpos(x @ r.W_Q, downscale=False)
    k = reference_xpos(x @ r.W_K, downscale=True)
    v = x @ r.W_V
    n = torch.arange(x.shape[-2])
    decay = (r.gamma ** (n[:, None] - n[None, :]).float()) * (n[:, None] >= n[None, :]).float()
    return ((q @ k.transpose(-2, -1)) * decay) @ v


@pytest.mark.parametrize("dim", [8, 32])
def test_window_form_matches_the_reference_parallel_form(dim):
    torch.manual_seed(0)
    r = SimpleRetention(dim, gamma=0.5, scale_base=512)
    x = torch.randn(3, 40, dim)
    with torch.no_grad():
        assert torch.allclose(r.window(x), reference_parallel_retention(r, x), atol=1e-5)


def test_relative_step_form_equals_the_window_form_over_a_long_window():
    torch.manual_seed(1)
    r = SimpleRetention(16, gamma=0.9, scale_base=512)  # slow decay: distant frames still count
    x = torch.randn(2, 300, 16)
    state = torch.zeros(2, 16, 16)
    outs = []
    with torch.no_grad():
        for t in range(x.shape[1]):
            out, state = r.step(x[:, t], state)
            outs.append(out)
        window = r.window(x)
    assert (torch.stack(outs, 1) - window).abs().max().item() < 1e-4


def test_xpos_scale_buffer_is_stored_like_the_reference():
    r = SimpleRetention(8, gamma=0.5, scale_base=512)
    keys = set(r.state_dict())
    assert keys == {"W_Q", "W_K", "W_V", "xpos.scale"}
