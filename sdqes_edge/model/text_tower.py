"""CLIP's text tower: token ids [Q, 77] -> L2-normalized query embeddings [Q, E]."""

from __future__ import annotations

import torch
from torch import nn

from sdqes_edge.config import CLIP_MLP_ACTIVATION, ModelConfig

from .layers import LayerNorm, ResidualAttentionBlock


class TextTransformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, activation: str = CLIP_MLP_ACTIVATION):
        super().__init__()
        self.resblocks = nn.ModuleList(ResidualAttentionBlock(width, heads, activation) for _ in range(layers))


class TextTower(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        t = cfg.text
        self.token_embedding = nn.Embedding(t.vocab_size, t.width)
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(t.context_length, t.width))
        self.transformer = TextTransformer(t.width, t.layers, t.heads, t.mlp_activation)
        self.ln_final = LayerNorm(t.width)
        self.text_projection = nn.Parameter(t.width**-0.5 * torch.randn(t.width, cfg.embed_dim))
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        # Causal mask: position i attends to positions <= i (CLIP's text tower is autoregressive).
        mask = torch.full((t.context_length, t.context_length), float("-inf")).triu(1)
        self.register_buffer("attn_mask", mask, persistent=False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [Q, context] int64 -> [Q, E]; the end token has the highest id, so argmax finds it."""
        x = self.token_embedding(token_ids) + self.positional_embedding
        for block in self.transformer.resblocks:
            x = block(x, self.attn_mask)
        x = self.ln_final(x)
        # The argmax over the ids as int32 (token ids fit it): ONNX Runtime before 1.20 has no int64 ArgMax, and
        # devices often carry older builds (Jetson's); TensorRT prefers int32 too. The same index either way.
        eot = x[torch.arange(x.shape[0], device=x.device), token_ids.to(torch.int32).argmax(dim=-1)]
        e = eot @ self.text_projection
        return e / e.norm(dim=-1, keepdim=True)
