"""Streaming temporal adapters, each with a window form and a step form.

Every adapter treats each token position as its own sequence over time (a
"tubelet"). Tokens arrive as ``[B, T, L, D]`` in window form. In step form they
arrive as token rows ``[B*L, D]`` (stream-major, class token first in each
stream's block of L rows): every linear layer is then one 2-D matrix product
(one Gemm kernel in the exported graph, no reshapes around it), which is what
makes the step cheap on a GPU, where a step costs per kernel, not per FLOP.
State tensors are declared tokens-major, ``[B, L, k]`` (``state_shapes``, the
state spec), and a step takes and gives them as rows, ``[B*L, k]``: the same
bytes, so the exported graph needs no reshape at its state inputs and outputs
(``ImageTower.step`` converts for callers that hold the spec's layout). The step form widens a bottleneck
that a product writes with zero features to a multiple of ``STEP_WIDTH_MULTIPLE`` (``step_width``), so that the
product is aligned for a GPU's fp16 kernels, and carries it so; the window form, like the checkpoint, has d'.

Both forms share the code that does the arithmetic, so they cannot drift apart;
only the source of the past frames differs (zero padding inside the window, or
the carried state). Where a step needs several of the checkpoint's parameters
as one matrix (a convolution over time as one product over the concatenated
frames), the matrix is assembled from the parameters on every call, so
checkpoints are unchanged and the exporter folds it into a constant.

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

import abc

import torch
from torch import nn
from torch.nn import functional as F

from sdqes_edge.config import AdapterConfig

from .layers import LayerNorm, quick_gelu
from .retention import SimpleRetention

QRNN_FORGET_BIAS = 5.0  # the reference's init: sigmoid(5) ~ 0.993, the gate passes the new candidate
# A GPU's fp16 matrix products read and write rows in 16-byte pieces: a product whose output rows are not a
# multiple of 8 halves wide falls back to an unaligned kernel. ViT-B/16's bottleneck is 268 (0.35 x 768), so
# the step form widens the down-projected features it carries to 272 with zero columns (exact: zero weights
# and biases make them zero, and the products that read them have zero rows there). Measured on an H200 with
# the same widening made as a rewrite of the traced graph (ONNX Runtime CUDA, fp16, CUDA graphs, interleaved):
# QRNN step 1.87 -> 1.76 ms at one stream, 6.68 -> 6.34 ms at 32; the 24 unaligned GEMMs (7.9 us each) became
# aligned ones (4.0 us). PyTorch eager pays a few small ops per adapter for it; the exported graphs fold it.
STEP_WIDTH_MULTIPLE = 8


def step_width(width: int) -> int:
    """The width the step form gives ``width`` features that it computes and carries (``STEP_WIDTH_MULTIPLE``)."""
    return -(-width // STEP_WIDTH_MULTIPLE) * STEP_WIDTH_MULTIPLE


def widened(tensor: torch.Tensor, width: int, dim: int = -1) -> torch.Tensor:
    """``tensor`` with zeros appended along ``dim`` up to ``width``; ``tensor`` itself where it is that wide.

    Traced from parameters, the exporter folds this into one constant. The zeros are made from the tensor itself
    (a slice of it times 0): a new tensor (``new_zeros``) is made on the CPU by the exporter's constant folding,
    which then cannot join it to weights traced on a GPU; ``F.pad`` traces as a Pad whose amounts a dozen shape
    operators compute, and is not folded at all."""
    extra = width - tensor.shape[dim]
    if extra == 0:
        return tensor
    zero = tensor.narrow(dim, 0, 1) * 0  # zeros for finite weights (an infinite one spoils every embedding anyway)
    return torch.cat((tensor,) + (zero,) * extra, dim=dim)


def widened_linear(x: torch.Tensor, layer: nn.Linear, *, outputs: int | None = None,
                   inputs: int | None = None) -> torch.Tensor:
    """``layer`` on ``x`` with zero outputs appended up to ``outputs`` (zero weight rows and biases) and zero-weight
    inputs up to ``inputs``: its weight assembled on every call from the checkpoint's parameters (the exporter
    folds it into a constant)."""
    weight, bias = layer.weight, layer.bias
    if outputs is not None:
        weight, bias = widened(weight, outputs, dim=0), widened(bias, outputs)
    if inputs is not None:
        weight = widened(weight, inputs)
    return F.linear(x, weight, bias)


def widened_frames(weight: torch.Tensor, width: int) -> torch.Tensor:
    """A weight over concatenated frames, [out, k, in] (oldest frame first), with zero inputs appended to each
    frame up to ``width``: -> [out, k * width], the layout of a step's widened windows."""
    return widened(weight, width).reshape(weight.shape[0], -1)


def causal_windows(x: torch.Tensor, lookback: int) -> torch.Tensor:
    """x [B, T, L, d] -> [B, T, L, (lookback + 1) * d]: each frame's token with its ``lookback`` predecessors,
    oldest first, concatenated along the channels (zeros before t=0): the layout a step's rows have."""
    pad = x.new_zeros((x.shape[0], lookback) + tuple(x.shape[2:]))
    padded = torch.cat((pad, x), dim=1)
    frames = x.shape[1]
    return torch.cat([padded[:, i : i + frames] for i in range(lookback + 1)], dim=-1)


def as_rows(tokens_major: torch.Tensor) -> torch.Tensor:
    """[B, L, ...] as rows [B*L, ...] (a view: no data moves)."""
    return tokens_major.flatten(0, 1)


def as_tokens_major(rows: torch.Tensor, tokens: int) -> torch.Tensor:
    """Rows [B*L, ...] back to [B, L, ...] (a view)."""
    return rows.reshape((-1, tokens) + tuple(rows.shape[1:]))


def step_windows(history: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """history rows [B*L, lookback*d] and the current rows x [B*L, d] -> (windows [B*L, (lookback+1)*d] in
    ``causal_windows``' layout, the next history [B*L, lookback*d])."""
    windows = torch.cat((history, x), dim=-1)
    width = x.shape[-1]
    # With one remembered frame the next history is the current input itself: no kernel at all.
    return windows, (x if history.shape[-1] == width else windows[:, width:])


class StreamingAdapter(nn.Module, abc.ABC):
    """Every adapter has ``window(x [B,T,L,D]) -> [B,T,L,D]`` and
    ``step(x [B*L,D], state: list, tokens) -> (y [B*L,D], new_state: list)``; the state
    tensors are the ones ``state_shapes`` declares, in that order, as rows: [B, L, ...] with the first two
    axes merged, [B*L, ...]."""

    def state_shapes(self, tokens: int) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape without the batch axis) of each state tensor, in the order ``step`` takes them."""
        return []

    @abc.abstractmethod
    def window(self, x: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def step(self, x: torch.Tensor, state: list[torch.Tensor], tokens: int): ...


class MLPAdapter(StreamingAdapter):
    def __init__(self, width: int, bottleneck: int):
        super().__init__()
        self.D_fc1 = nn.Linear(width, bottleneck)
        self.D_fc2 = nn.Linear(bottleneck, width)
        nn.init.zeros_(self.D_fc2.weight)
        nn.init.zeros_(self.D_fc2.bias)

    def _residual(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """x + the adapter's update, its bottleneck ``width`` >= d' wide (zero features past d': QuickGELU(0) = 0)."""
        hidden = quick_gelu(widened_linear(x, self.D_fc1, outputs=width))
        return x + widened_linear(hidden, self.D_fc2, inputs=width)

    def window(self, x):
        return self._residual(x, self.D_fc1.out_features)

    def step(self, x, state, tokens):
        return self._residual(x, step_width(self.D_fc1.out_features)), []


class STAdapter(StreamingAdapter):
    """Down-projection, a depthwise causal convolution over time, up-projection added to the patch tokens.

    Both forms project every token, the class token too, and zero the class token's update with a mask:
    the class token's row then costs 1/L more arithmetic but the step needs no gather of patch rows.

    ``update_as_one_product`` (off: the form the CPU runs fastest) computes the convolution over time and
    ``D_fc2`` as one product over the concatenated frames; the exporter turns it on in the graphs it makes for a
    GPU (export/graphs.py: ``traced_model``).
    """

    def __init__(self, width: int, bottleneck: int, lookback: int, tokens: int):
        super().__init__()
        self.lookback = lookback
        self.D_fc1 = nn.Linear(width, bottleneck)
        # Depthwise over time only; the reference's Conv3d layout [C, 1, k, 1, 1] keeps its keys loadable.
        self.conv = nn.Conv3d(bottleneck, bottleneck, kernel_size=(lookback + 1, 1, 1), groups=bottleneck)
        self.D_fc2 = nn.Linear(bottleneck, width)
        for p in (self.conv.weight, self.conv.bias, self.D_fc1.bias, self.D_fc2.weight, self.D_fc2.bias):
            nn.init.zeros_(p)
        patch_mask = torch.ones(tokens, 1)
        patch_mask[0] = 0.0  # the class token gets no update (the reference adds to x[1:] only)
        self.register_buffer("patch_mask", patch_mask, persistent=False)
        self.update_as_one_product = False

    def state_shapes(self, tokens):
        return [("st_history", (tokens, self.lookback * step_width(self.D_fc1.out_features)))]

    def _update(self, windows: torch.Tensor) -> torch.Tensor:
        """windows [..., k*c] -> the update for every token, [..., D] (before the class-token mask); c is d' in
        the window form and ``step_width(d')`` in the step form (zero channels past d').

        The depthwise conv over time is one Einsum of the frames with the [k, c] kernel: one kernel in the
        step graph, and exactly the checkpoint's parameters (no block-diagonal matrix full of zeros).
        """
        frame_count = self.lookback + 1
        channels = windows.shape[-1] // frame_count
        kernel = widened(self.conv.weight.reshape(self.conv.out_channels, -1).t(), channels)  # [k, c], oldest first
        conv_bias = widened(self.conv.bias, channels)
        if self.update_as_one_product:
            return self._update_product(windows, kernel, conv_bias)
        frames = windows.reshape(-1, frame_count, channels)  # [N, k, c] (a view)
        mixed = torch.einsum("nkc,kc->nc", frames, kernel)  # [N, c]
        if windows.dim() > 2:  # window form: back to [B, T, L, d'] (the step's rows need no reshape)
            mixed = mixed.reshape(windows.shape[:-1] + (channels,))
        return widened_linear(mixed + conv_bias, self.D_fc2, inputs=channels)

    def _update_product(self, windows: torch.Tensor, kernel: torch.Tensor, conv_bias: torch.Tensor) -> torch.Tensor:
        """``_update`` as one product: mixing the frames with the taps and projecting the mix are both linear, so
        ``D_fc2``'s weight with its columns scaled by frame j's taps projects frame j, and the k frames'
        projections sum inside one product over the concatenated frames:
        sum_j (frame_j * k_j) W2^T + cb W2^T + b2 = windows [W2 diag(k_1) | .. | W2 diag(k_k)]^T + (cb W2^T + b2).

        On a GPU one GEMM (which takes its bias through the frames' Concat, export/gemm_bias.py) replaces the
        Einsum (ONNX Runtime's CUDA Einsum transposes and runs a batched product per channel), the conv's bias Add,
        ``D_fc2``'s GEMM and its bias Add. It does k times ``D_fc2``'s arithmetic, which a CPU would notice and a
        GPU at these sizes does not. Equal to the other form up to the order of the sums.
        """
        up = widened(self.D_fc2.weight, kernel.shape[1])  # [D, c]
        weight = (up[:, None, :] * kernel[None]).reshape(up.shape[0], -1)  # [D, k*c], frame j's columns W2 diag(k_j)
        return F.linear(windows, weight, F.linear(conv_bias, up, self.D_fc2.bias))

    def window(self, x):
        update = self._update(causal_windows(self.D_fc1(x), self.lookback))  # [B, T, L, D]
        return x + update * self.patch_mask

    def step(self, x, state, tokens):
        down = widened_linear(x, self.D_fc1, outputs=step_width(self.D_fc1.out_features))
        windows, history = step_windows(state[0], down)
        update = as_tokens_major(self._update(windows), tokens) * self.patch_mask  # [B, L, D]
        return x + as_rows(update), [history]


class QRNNLayer(nn.Module):
    """One QRNN-f layer: full-width convolutional gates over ``lookback + 1`` frames, forget-mult pooling."""

    def __init__(self, in_dim: int, hidden: int, lookback: int):
        super().__init__()
        self.lookback = lookback
        self.conv1d_z = nn.Conv1d(in_dim, hidden, kernel_size=lookback + 1)
        self.conv1d_f = nn.Conv1d(in_dim, hidden, kernel_size=lookback + 1)
        nn.init.zeros_(self.conv1d_f.weight)
        nn.init.constant_(self.conv1d_f.bias, QRNN_FORGET_BIAS)

    @staticmethod
    def _over_frames(conv: nn.Conv1d, frame_width: int) -> torch.Tensor:
        """Conv1d weight [hidden, d_in, k] -> a linear layer's weight [hidden, k*frame_width] on concatenated
        frames of ``frame_width`` >= d_in features each (zero weights for the step form's widening)."""
        return widened_frames(conv.weight.permute(0, 2, 1), frame_width)

    def gates(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """windows [..., k*w] (frames concatenated, oldest first; w = d_in, or wider with zeros in the step form)
        -> candidate Z and forget gate F [..., hidden].

        Two products rather than one split: on the CPU the forget gate's sigmoid then fuses into its product.
        """
        frame_width = windows.shape[-1] // (self.lookback + 1)
        z = F.linear(windows, self._over_frames(self.conv1d_z, frame_width), self.conv1d_z.bias)
        f = F.linear(windows, self._over_frames(self.conv1d_f, frame_width), self.conv1d_f.bias)
        return quick_gelu(z), torch.sigmoid(f)

    @staticmethod
    def pool(z: torch.Tensor, f: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # The reference's convention: F gates the new candidate, h_t = F Z + (1 - F) h_{t-1},
        # written as h + F (Z - h): the same value in three kernels instead of four.
        return h + f * (z - h)

    def window(self, x: torch.Tensor) -> torch.Tensor:
        z, f = self.gates(causal_windows(x, self.lookback))
        h = torch.zeros_like(z[:, 0])
        outputs = []
        for t in range(z.shape[1]):
            h = self.pool(z[:, t], f[:, t], h)
            outputs.append(h)
        return torch.stack(outputs, dim=1)

    def step(self, x: torch.Tensor, history: torch.Tensor, h: torch.Tensor):
        """x rows [B*L, w] (w >= d_in: the input widened with zeros); history rows [B*L, lookback*w], h rows
        [B*L, hidden] -> (h, history)."""
        windows, next_history = step_windows(history, x)
        z, f = self.gates(windows)
        return self.pool(z, f, h), next_history


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

    def _step_input_width(self, layer_index: int) -> int:
        """The features a layer reads in the step form: the down-projection's widened to ``step_width`` (a
        product writes them, so the zeros cost no kernel); otherwise as they are."""
        if layer_index == 0 and self.qrnn_down is not None:
            return step_width(self.qrnn_down.out_features)
        return self.qrnn.layers[layer_index].conv1d_z.in_channels

    def state_shapes(self, tokens):
        shapes = []
        for i, layer in enumerate(self.qrnn.layers):
            shapes.append((f"qrnn{i}_x_history", (tokens, layer.lookback * self._step_input_width(i))))
            shapes.append((f"qrnn{i}_h", (tokens, layer.conv1d_z.out_channels)))
        return shapes

    def _down(self, x):
        return x if self.qrnn_down is None else self.qrnn_down(x)

    def _down_step(self, x):
        if self.qrnn_down is None:
            return x
        return widened_linear(x, self.qrnn_down, outputs=self._step_input_width(0))

    def window(self, x):
        h = self._down(x)
        for layer in self.qrnn.layers:
            h = layer.window(h)
        return x + self.qrnn_up(h)

    def step(self, x, state, tokens):
        h = self._down_step(x)
        new_state = []
        for i, layer in enumerate(self.qrnn.layers):
            h, history = layer.step(h, state[2 * i], state[2 * i + 1])
            new_state += [history, h]
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

    def step(self, x, state, tokens):
        out, s = self.retention.step(self.lnorm(self.D_fc1(x)), state[0])  # state [B*L, d', d']
        return x + self.D_fc2(out), [s]


def build_adapter(width: int, cfg: AdapterConfig, tokens: int) -> StreamingAdapter | None:
    if cfg.kind == "none":
        return None
    if cfg.kind == "mlp":
        return MLPAdapter(width, cfg.bottleneck(width))
    if cfg.kind == "st":
        return STAdapter(width, cfg.bottleneck(width), cfg.lookback, tokens)
    if cfg.kind == "qrnn":
        return QRNNAdapter(width, cfg)
    if cfg.kind == "retnet":
        return RetNetAdapter(width, cfg.bottleneck(width), cfg.retnet_gamma, cfg.xpos_scale_base)
    raise ValueError(f"unknown adapter kind {cfg.kind!r}")
