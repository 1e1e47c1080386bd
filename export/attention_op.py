"""fp16 step graphs run each block's attention as one ONNX Runtime ``Attention`` node (com.microsoft).

Written with plain ONNX operators, a block's attention is the in-projection, its bias, a transpose, a Split,
two scaled products around a Softmax and the output projection: nine kernels on ONNX Runtime's CUDA provider
at one stream, and at 32 streams the [32, 12, 197, 197] scores tensor written and read three times a block.
ONNX Runtime's ``Attention`` takes the rows and the in-projection's weight and bias and runs the projection, a
bias-and-transpose kernel and one fused attention kernel (flash, memory-efficient or TensorRT's fused
multi-head attention, whichever ONNX Runtime picks for the GPU and the sequence; the scores never leave the
chip): three kernels. Not yet measured on a GPU (none was lent when it was written); the bench's device
section times it against the plain graph. The output projection stays outside, a product and its bias like
every other linear layer.

The node is traced from the model itself: ``OnnxRuntimeAttention`` holds a block's own ``Attention``
parameters and computes ``layers.mix_heads``, the one definition of the arithmetic, in PyTorch, while the
tracer writes the node (``symbolic``). Only the image tower's blocks are swapped, in the copy of the model the
fp16 graph is traced from; the model itself is never changed. TensorRT has no such operator:
``onnx_runtime_ops.expand_attention`` writes each node back as plain ONNX before its parser reads the graph.
"""

from __future__ import annotations

import torch
from torch import nn

from sdqes_edge.model.layers import Attention, mix_heads

from .onnx_runtime_ops import ATTENTION, MS_DOMAIN


class _AttentionNode(torch.autograd.Function):
    """x [N, L, D] -> [N, L, D]: multi-head self-attention with the in-projection, before the out-projection."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, heads: int) -> torch.Tensor:
        rows = nn.functional.linear(x.reshape(-1, x.shape[-1]), weight, bias)  # [N*L, 3D]
        return mix_heads(rows, x.shape[1], heads).reshape(x.shape)

    @staticmethod
    def symbolic(g, x, weight, bias, heads: int):
        # ONNX Runtime's weights are [D, 3D] (in, out): the exporter folds this Transpose of a constant away.
        weight_in_out = g.op("Transpose", weight, perm_i=[1, 0])
        out = g.op(f"{MS_DOMAIN}::{ATTENTION}", x, weight_in_out, bias, num_heads_i=heads)
        out.setType(x.type())
        return out


class OnnxRuntimeAttention(nn.Module):
    """A block's ``Attention`` (its very parameters), traced as one ONNX Runtime Attention node and the
    output projection."""

    def __init__(self, attention: Attention):
        super().__init__()
        self.heads = attention.heads
        self.in_proj_weight, self.in_proj_bias = attention.in_proj_weight, attention.in_proj_bias
        self.out_proj = attention.out_proj

    def rows(self, x: torch.Tensor, tokens: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention within each sequence of ``tokens`` rows: x [N*L, D] -> [N*L, D]."""
        if mask is not None:
            raise ValueError("the image tower's attention has no mask; the text tower is not traced this way")
        width = x.shape[-1]
        mixed = _AttentionNode.apply(x.reshape(-1, tokens, width), self.in_proj_weight, self.in_proj_bias,
                                     self.heads)
        return self.out_proj(mixed.reshape(-1, width))


def use_onnx_runtime_attention(model) -> int:
    """Swap every image-tower block's attention of ``model`` (a copy made to be traced) for
    ``OnnxRuntimeAttention``; returns how many."""
    blocks = model.visual.transformer.resblocks
    for block in blocks:
        block.attn = OnnxRuntimeAttention(block.attn)
    return len(blocks)
