"""Transformer building blocks in OpenAI CLIP's parameter layout.

Parameter names match CLIP's (``attn.in_proj_weight``, ``mlp.c_fc`` ...) so
that checkpoints load without renaming. Attention is written with plain matrix
products so that it traces into a small, static ONNX graph.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from sdqes_edge.config import CLIP_MLP_ACTIVATION


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in ``dtype``; no node at all in a traced graph where it already is (a traced fp32->fp32 Cast is still
    a kernel every step runs)."""
    return x if x.dtype == dtype else x.to(dtype)


class LayerNorm(nn.LayerNorm):
    """CLIP's LayerNorm: its statistics computed in fp32 whatever the input dtype.

    With fp32 weights and fp16 input (CLIP's mixed precision) the input is cast up and the output back. With
    weights in the input's dtype (an fp16 copy of the model) it is one LayerNormalization in that dtype, whose
    mean and variance are still fp32: torch's kernels accumulate half in float, and ONNX's LayerNormalization
    computes in its ``stash_type``, float32 by default (ONNX Runtime's CPU and CUDA kernels, TensorRT). The same
    values, without the two Cast kernels around every LayerNorm of an fp16 step graph.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype:
            return super().forward(x)
        return cast(super().forward(cast(x, torch.float32)), x.dtype)


def patch_embedding(images: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """images [N, C, R, R] -> patch tokens [N, (R/P)^2, D]: the patch convolution (kernel = stride = P, no
    bias) computed as what it is, one matrix product of each patch's pixels with the flattened kernel.

    Why not ``conv(images)``: the same products, which cuDNN runs badly with 3 input channels. On an H200
    (ONNX Runtime's CUDA provider, ViT-B/16, fp16) the Conv was the step's costliest kernel: 82 us at one
    stream and 424 us at 32, where each of a block's four products over as many rows (768 x 768 up to
    768 x 3072 weights) took 4 to 6 us. As a Transpose and a MatMul the graph runs as many kernels as the
    Conv and the Transpose of its output did, the CPU gives the same numbers (ViT-B/16, 8 frames: max
    difference 0.0), and the checkpoint keeps ``conv1.weight`` [D, C, P, P]."""
    n, channels, size = images.shape[0], images.shape[1], images.shape[-1]
    patch = conv.kernel_size[0]
    grid = size // patch
    pixels = images.reshape(n, channels, grid, patch, grid, patch).permute(0, 2, 4, 1, 3, 5)  # [N, g, g, C, P, P]
    pixels = pixels.reshape(n, grid * grid, channels * patch * patch)  # one row per patch, in the kernel's order
    return pixels @ conv.weight.reshape(conv.out_channels, -1).t()


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's GELU approximation (the reference adapters use it too)."""
    return x * torch.sigmoid(1.702 * x)


class QuickGELU(nn.Module):
    """Module form, so ``mlp.gelu`` sits in CLIP's Sequential layout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quick_gelu(x)


def mix_heads(qkv: torch.Tensor, tokens: int, heads: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention of each head within each sequence of ``tokens`` rows: qkv [N*L, 3D] (q, k, v
    side by side, as ``in_proj`` makes them) -> [N*L, D], before the output projection."""
    width = qkv.shape[-1] // 3
    head_dim = width // heads
    qkv = qkv.reshape(-1, tokens, 3 * heads, head_dim).transpose(1, 2)  # [N, 3H, L, hd]
    q, k, v = qkv.split(heads, dim=1)  # [N, H, L, hd] each (one Split kernel)
    scores = (q * head_dim**-0.5) @ k.transpose(-2, -1)  # [N, H, L, L]
    if mask is not None:
        scores = scores + mask
    # Softmax in the compute dtype: every kernel (torch's; ONNX Runtime's CPU and CUDA; TensorRT's) subtracts
    # the row's maximum before exp, so no exp exceeds 1, and sums half in float. A scores tensor that overflowed
    # fp16 did so in the product above, before any cast to fp32 could help; the casts were two kernels a block.
    out = scores.softmax(dim=-1) @ v  # [N, H, L, hd]
    return out.transpose(1, 2).reshape(-1, width)


class Attention(nn.Module):
    """Multi-head self-attention with ``nn.MultiheadAttention``'s parameter names."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * width))
        self.out_proj = nn.Linear(width, width)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [N, L, D] -> [N, L, D]."""
        return self.rows(x.reshape(-1, x.shape[-1]), x.shape[-2], mask).reshape(x.shape)

    def rows(self, x: torch.Tensor, tokens: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention within each sequence of ``tokens`` rows: x [N*L, D] -> [N*L, D].

        Rows in and out, so both projections are plain 2-D products (one Gemm each in an exported graph).
        """
        if mask is None and x.shape[0] == tokens:
            return self._one_sequence(x)
        qkv = nn.functional.linear(x, self.in_proj_weight, self.in_proj_bias)  # [N*L, 3D]
        return self.out_proj(mix_heads(qkv, tokens, self.heads, mask))

    def _one_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """``rows`` for one sequence (a one-stream step): the same values in 6 kernels instead of 10.

        Heads must lead for the per-head products, and the rows [L, 3D] have them in the middle: the general
        form transposes q, k, v and the output apart (ONNX Runtime pushes one transpose of q, k and v through
        their Split as three). Here every transpose is of a matrix, which ONNX Runtime folds into the
        neighbouring products (the in-projection computes [3D, L], the products take ``trans`` flags, the
        out-projection reads [D, L] transposed): Gemm, Split, two products, Softmax, Gemm.
        """
        width, tokens = x.shape[-1], x.shape[0]
        head_dim = width // self.heads
        qkv = nn.functional.linear(x, self.in_proj_weight, self.in_proj_bias)  # [L, 3D]
        q_t, k_t, v_t = qkv.t().reshape(3 * self.heads, head_dim, tokens).split(self.heads)  # [H, hd, L] each
        scores = (q_t.transpose(-2, -1) * head_dim**-0.5) @ k_t  # [H, L, L]
        out_t = v_t @ scores.softmax(dim=-1).transpose(-2, -1)  # [H, hd, L]
        return self.out_proj(out_t.reshape(width, tokens).t())


def clip_mlp(width: int, activation: str = CLIP_MLP_ACTIVATION) -> nn.Sequential:
    """CLIP's block MLP; ``activation`` one of ``config.MLP_ACTIVATIONS`` (the module keeps CLIP's name, ``gelu``,
    either way: it has no weights)."""
    return nn.Sequential(OrderedDict([
        ("c_fc", nn.Linear(width, width * 4)),
        ("gelu", QuickGELU() if activation == "quick_gelu" else nn.GELU()),
        ("c_proj", nn.Linear(width * 4, width)),
    ]))


class ResidualAttentionBlock(nn.Module):
    """A plain CLIP block (the text tower uses these)."""

    def __init__(self, width: int, heads: int, activation: str = CLIP_MLP_ACTIVATION):
        super().__init__()
        self.attn = Attention(width, heads)
        self.ln_1 = LayerNorm(width)
        self.mlp = clip_mlp(width, activation)
        self.ln_2 = LayerNorm(width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))
