"""Single-head retention with xPos, in window form and in a relative-position step form.

Window form (the reference's parallel form, positions 0..T-1 from the stream start)::

    Q'_n = xpos_up(X_n W_Q, n)      K'_m = xpos_down(X_m W_K, m)      V_m = X_m W_V
    out_n = sum_{m <= n} gamma^(n-m) (Q'_n . K'_m) V_m

xPos treats channel pairs (2j, 2j+1) as complex numbers: ``xpos_up(x, n)``
multiplies pair j by ``zeta_j^(n/B) e^(i n theta_j)`` and ``xpos_down`` by
``zeta_j^(-n/B) e^(i n theta_j)`` (B = scale_base). So ``Q'_n . K'_m`` is
``Re sum_j q_j conj(k_j) (zeta_j^(1/B) e^(i theta_j))^(n-m)``: it depends on
n - m only, while each factor alone grows or shrinks without bound with n
(fp32 NaN after ~35k frames, fp16 overflow after ~4.5k).

Step form: keep the state in the frame of the current position,
``R_n = sum_{m<=n} (gamma rho_j^*)^(n-m) k_m^T V_m`` with ``rho_j = zeta_j^(1/B) e^(i theta_j)``
applied to the key-channel pairs. Then ``out_n = q_n R_n`` with the *raw*
query, and ``R_n = gamma rho^*(R_{n-1}) + k_n^T V_n``: a fixed rotation and a
decay of at most ``gamma`` per frame. No absolute position is ever computed, so
the state stays finite over unbounded streams and every frame costs the same.

The rotation and decay of the key-channel pairs are written per channel, for
few kernels and few passes over the state (the largest tensor of any adapter):
``gamma rho^*(R) = R * keep + R[swap] * cross``, where ``swap`` exchanges the
two channels of each pair, ``keep = gamma zeta^(1/B) cos theta`` for both and
``cross = +-gamma zeta^(1/B) sin theta`` (+ for the even channel, - for the odd).
"""

from __future__ import annotations

import torch
from torch import nn


def xpos_zeta(head_dim: int) -> torch.Tensor:
    """xPos per-pair scale base zeta_j in (0, 1) (the reference stores it as ``xpos.scale``)."""
    return (torch.arange(0, head_dim, 2) + 0.4 * head_dim) / (1.4 * head_dim)


def xpos_theta(head_dim: int) -> torch.Tensor:
    """Rotation per position for each channel pair."""
    half = head_dim // 2
    return 1.0 / (10000 ** (torch.arange(0, half) / half))


class XPos(nn.Module):
    def __init__(self, head_dim: int, scale_base: int):
        super().__init__()
        self.scale_base = scale_base
        # Persistent so the reference's checkpoints (which store it) load strictly.
        self.register_buffer("scale", xpos_zeta(head_dim))
        self.register_buffer("theta", xpos_theta(head_dim), persistent=False)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, downscale: bool) -> torch.Tensor:
        """x [..., T, d] at absolute ``positions`` [T]: multiply each pair by zeta^(+-p/B) e^(i p theta)."""
        power = positions[:, None] / self.scale_base  # [T, 1]
        magnitude = self.scale[None, :] ** (-power if downscale else power)  # [T, d/2]
        angle = positions[:, None] * self.theta[None, :]  # [T, d/2]
        cos, sin = torch.cos(angle) * magnitude, torch.sin(angle) * magnitude
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


class SimpleRetention(nn.Module):
    def __init__(self, dim: int, gamma: float, scale_base: int):
        super().__init__()
        self.gamma = gamma
        self.W_Q = nn.Parameter(torch.randn(dim, dim) / dim)
        self.W_K = nn.Parameter(torch.randn(dim, dim) / dim)
        self.W_V = nn.Parameter(torch.randn(dim, dim) / dim)
        self.xpos = XPos(dim, scale_base)
        # Step-form constants (module docstring): per key channel, the factors of itself and of its pair partner.
        decay = gamma * self.xpos.scale ** (1.0 / scale_base)  # [d/2]
        keep, cross = decay * torch.cos(self.xpos.theta), decay * torch.sin(self.xpos.theta)
        self.register_buffer("step_keep", keep.repeat_interleave(2)[:, None], persistent=False)  # [d, 1]
        self.register_buffer("step_cross", torch.stack((cross, -cross), dim=-1).reshape(-1, 1), persistent=False)
        self.register_buffer("step_swap", torch.arange(dim).reshape(-1, 2).flip(-1).reshape(-1), persistent=False)

    def window(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., T, d] -> [..., T, d], positions counted from the first frame of the window."""
        length = x.shape[-2]
        positions = torch.arange(length, dtype=x.dtype, device=x.device)
        q = self.xpos.rotate(x @ self.W_Q, positions, downscale=False)
        k = self.xpos.rotate(x @ self.W_K, positions, downscale=True)
        v = x @ self.W_V
        distance = positions[:, None] - positions[None, :]
        decay = torch.where(distance >= 0, self.gamma ** distance.clamp(min=0), torch.zeros_like(distance))
        return ((q @ k.transpose(-2, -1)) * decay) @ v

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., d], state R [..., d, d] (key channel, value channel) -> (out [..., d], new R)."""
        # One product for Q, K and V (the concatenated weights are a constant the export folds).
        q, k, v = (x @ torch.cat((self.W_Q, self.W_K, self.W_V), dim=1)).split(x.shape[-1], dim=-1)
        partners = state.index_select(-2, self.step_swap)  # each key channel's pair partner, [..., d, d]
        new_state = state * self.step_keep + partners * self.step_cross + k.unsqueeze(-1) * v.unsqueeze(-2)
        out = (q.unsqueeze(-2) @ new_state).squeeze(-2)
        return out, new_state
