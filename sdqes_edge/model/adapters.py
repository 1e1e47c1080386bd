"""Streaming temporal adapters, each with a window form and a step form.

Every adapter treats each token position as its own sequence over time (a
"tubelet"). Tokens arrive as ``[B, T, L, D]`` in window form and ``[B, L, D]``
in step form (L = tokens per frame, class token first). Both forms share the
code that does the arithmetic, so they cannot drift apart; only the source of
the past frames differs (zero padding inside the window, or the carried state).

Parameter names follow the reference implementation (DESIGN.md section 2).
Conventions kept from it:
- ``mlp``: ``D_fc1`` -> QuickGELU -> ``D_fc2``, plus skip.
- ``st``: ``D_fc1`` on patch tokens, causal depthwise conv over ``lookback + 1``
  frames (zero left padding), ``D_fc2``, added to patch tokens only.
- ``qrnn``: full ``Conv1d`` gates over ``lookback + 1`` frames, ``Z = QuickGELU``,
  ``F = sigmoid``, ``h_t = F_t * Z_t + (1 - F_t) * h_{t-1}``, ``h_0 = 0``,
  ``qrnn_up`` plus skip; optional ``qrnn_down`` first. All tokens, CLS included.
- ``retnet``: ``D_fc1`` -> ``lnorm`` -> retention -> ``D_fc2``, plus skip.
Initialisation as the paper: up-projections zero (an untrained adapter is the
identity), QRNN forget gates weight 0 and bias +5.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import AdapterConfig
from .layers import LayerNorm, quick_gelu
from .retention import SimpleRetention

QRNN_FORGET_BIAS = 5.0  # the reference's init: sigmoid(5) ~ 0.993, the gate passes the new candidate


def causal_windows(x: torch.Tensor, lookback: int) -> torch.Tensor:
    """x [B, T, ...] -> [B, T, lookback + 1, ...]: each frame with its ``lookback`` predecessors (zeros before t=0)."""
    pad = x.new_zeros((x.shape[0], lookback) + tuple(x.shape[2:]))
    padded = torch.cat((pad, x), dim=1)
    frames = x.shape[1]
    return torch.stack([padded[:, i : i + frames] for i in range(lookback + 1)], dim=2)


def step_window(history: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """history [B, lookback, ...] and current x [B, ...] -> [B, 1, lookback + 1, ...] (the window-form layout)."""
    return torch.cat((history, x.unsqueeze(1)), dim=1).unsqueeze(1)


class StreamingAdapter(nn.Module):
    """Every adapter has ``window(x [B,T,L,D]) -> [B,T,L,D]`` and
    ``step(x [B,L,D], state: list) -> (y [B,L,D], new_state: list)``; the state
    tensors are the ones ``state_shapes`` declares, in that order."""

    def state_shapes(self, tokens: int) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape without the batch axis) of each state tensor, in the order ``step`` takes them."""
        return []


class MLPAdapter(StreamingAdapter):
    def __init__(self, width: int, bottleneck: int):
        super().__init__()
        self.D_fc1 = nn.Linear(width, bottleneck)
        self.D_fc2 = nn.Linear(bottleneck, width)
        nn.init.zeros_(self.D_fc2.weight)
        nn.init.zeros_(self.D_fc2.bias)

    def _residual(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.D_fc2(quick_gelu(self.D_fc1(x)))

    def window(self, x):
        return self._residual(x)

    def step(self, x, state):
        return self._residual(x), []


class STAdapter(StreamingAdapter):
    def __init__(self, width: int, bottleneck: int, lookback: int):
        super().__init__()
        self.lookback = lookback
        self.D_fc1 = nn.Linear(width, bottleneck)
        # Depthwise over time only; the reference's Conv3d layout [C, 1, k, 1, 1] keeps its keys loadable.
        self.conv = nn.Conv3d(bottleneck, bottleneck, kernel_size=(lookback + 1, 1, 1), groups=bottleneck)
        self.D_fc2 = nn.Linear(bottleneck, width)
        for p in (self.conv.weight, self.conv.bias, self.D_fc1.bias, self.D_fc2.weight, self.D_fc2.bias):
            nn.init.zeros_(p)

    def state_shapes(self, tokens):
        return [("st_history", (self.lookback, tokens - 1, self.D_fc1.out_features))]

    def _mix(self, x: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
        """x [B,T,L,D], windows [B,T,k,P,d'] of down-projected patch tokens -> x with patch tokens updated."""
        kernel = self.conv.weight.reshape(self.conv.out_channels, -1).transpose(0, 1)  # [k, d']
        mixed = (windows * kernel[:, None, :]).sum(dim=2) + self.conv.bias  # [B,T,P,d']
        return torch.cat((x[:, :, :1], x[:, :, 1:] + self.D_fc2(mixed)), dim=2)

    def window(self, x):
        return self._mix(x, causal_windows(self.D_fc1(x[:, :, 1:]), self.lookback))

    def step(self, x, state):
        (history,) = state  # [B, lookback, P, d']
        down = self.D_fc1(x[:, 1:])
        windows = step_window(history, down)
        y = self._mix(x.unsqueeze(1), windows).squeeze(1)
        return y, [windows[:, 0, 1:]]


class QRNNLayer(nn.Module):
    """One QRNN-f layer: full-width convolutional gates over ``lookback + 1`` frames, forget-mult pooling."""

    def __init__(self, in_dim: int, hidden: int, lookback: int):
        super().__init__()
        self.lookback = lookback
        self.conv1d_z = nn.Conv1d(in_dim, hidden, kernel_size=lookback + 1)
        self.conv1d_f = nn.Conv1d(in_dim, hidden, kernel_size=lookback + 1)
        nn.init.zeros_(self.conv1d_f.weight)
        nn.init.constant_(self.conv1d_f.bias, QRNN_FORGET_BIAS)

    def gates(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """windows [B,T,k,L,d_in] -> candidate Z and forget gate F, each [B,T,L,hidden]."""
        b, t, k, length, d_in = windows.shape
        flat = windows.permute(0, 1, 3, 2, 4).reshape(b, t, length, k * d_in)  # [B,T,L,k*d_in]
        # Conv1d weight [hidden, d_in, k] -> one matrix [k*d_in, 2*hidden] for both gates.
        weight = torch.cat((self.conv1d_z.weight, self.conv1d_f.weight), dim=0)
        weight = weight.permute(2, 1, 0).reshape(k * d_in, -1)
        bias = torch.cat((self.conv1d_z.bias, self.conv1d_f.bias))
        z, f = (flat @ weight + bias).chunk(2, dim=-1)
        return quick_gelu(z), torch.sigmoid(f)

    @staticmethod
    def pool(z: torch.Tensor, f: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # The reference's convention: F gates the new candidate.
        return f * z + (1 - f) * h

    def window(self, x: torch.Tensor) -> torch.Tensor:
        z, f = self.gates(causal_windows(x, self.lookback))
        h = torch.zeros_like(z[:, 0])
        outputs = []
        for t in range(z.shape[1]):
            h = self.pool(z[:, t], f[:, t], h)
            outputs.append(h)
        return torch.stack(outputs, dim=1)

    def step(self, x: torch.Tensor, history: torch.Tensor, h: torch.Tensor):
        windows = step_window(history, x)
        z, f = self.gates(windows)
        h = self.pool(z[:, 0], f[:, 0], h)
        return h, windows[:, 0, 1:], h


class QRNN(nn.Module):
    def __init__(self, in_dim: int, hidden: int, layers: int, lookback: int):
        super().__init__()
        self.layers = nn.ModuleList(
            QRNNLayer(in_dim if i == 0 else hidden, hidden, lookback) for i in range(layers)
        )


class QRNNAdapter(StreamingAdapter):
    def __init__(self, width: int, cfg: AdapterConfig):
        super().__init__()
        hidden = cfg.qrnn_hidden(width)
        qrnn_in = width
        if cfg.qrnn_downsample:
            qrnn_in = cfg.bottleneck(width)
            self.qrnn_down = nn.Linear(width, qrnn_in)
        else:
            self.qrnn_down = None
        self.qrnn = QRNN(qrnn_in, hidden, cfg.qrnn_layers, cfg.lookback)
        self.qrnn_up = nn.Linear(hidden, width)
        nn.init.zeros_(self.qrnn_up.weight)
        nn.init.zeros_(self.qrnn_up.bias)

    def state_shapes(self, tokens):
        shapes = []
        for i, layer in enumerate(self.qrnn.layers):
            shapes.append((f"qrnn{i}_x_history", (layer.lookback, tokens, layer.conv1d_z.in_channels)))
            shapes.append((f"qrnn{i}_h", (tokens, layer.conv1d_z.out_channels)))
        return shapes

    def _down(self, x):
        return x if self.qrnn_down is None else self.qrnn_down(x)

    def window(self, x):
        h = self._down(x)
        for layer in self.qrnn.layers:
            h = layer.window(h)
        return x + self.qrnn_up(h)

    def step(self, x, state):
        h = self._down(x)
        new_state = []
        for i, layer in enumerate(self.qrnn.layers):
            h, history, hidden = layer.step(h, state[2 * i], state[2 * i + 1])
            new_state += [history, hidden]
        return x + self.qrnn_up(h), new_state


class RetNetAdapter(StreamingAdapter):
    def __init__(self, width: int, bottleneck: int, gamma: float, scale_base: int):
        super().__init__()
        self.D_fc1 = nn.Linear(width, bottleneck)
        self.lnorm = LayerNorm(bottleneck)
        self.retention = SimpleRetention(bottleneck, gamma, scale_base)
        self.D_fc2 = nn.Linear(bottleneck, width)
        nn.init.zeros_(self.D_fc2.weight)
        nn.init.zeros_(self.D_fc2.bias)

    def state_shapes(self, tokens):
        d = self.D_fc1.out_features
        return [("retention_s", (tokens, d, d))]

    def window(self, x):
        h = self.lnorm(self.D_fc1(x)).transpose(1, 2)  # [B, L, T, d']: one sequence per token
        return x + self.D_fc2(self.retention.window(h).transpose(1, 2))

    def step(self, x, state):
        out, s = self.retention.step(self.lnorm(self.D_fc1(x)), state[0])
        return x + self.D_fc2(out), [s]


def build_adapter(width: int, cfg: AdapterConfig) -> StreamingAdapter | None:
    if cfg.kind == "none":
        return None
    if cfg.kind == "mlp":
        return MLPAdapter(width, cfg.bottleneck(width))
    if cfg.kind == "st":
        return STAdapter(width, cfg.bottleneck(width), cfg.lookback)
    if cfg.kind == "qrnn":
        return QRNNAdapter(width, cfg)
    if cfg.kind == "retnet":
        return RetNetAdapter(width, cfg.bottleneck(width), cfg.retnet_gamma, cfg.xpos_scale_base)
    raise ValueError(f"unknown adapter kind {cfg.kind!r}")
