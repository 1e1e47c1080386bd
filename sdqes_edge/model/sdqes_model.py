"""The dual encoder: image tower with streaming adapters, text tower, cosine scoring.

Scoring follows DESIGN.md section 1: ``logit = cos(frame, query)`` (no
temperature) and ``p = sigmoid(logit)``; all queries in one matrix product.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from sdqes_edge.config import ModelConfig
from sdqes_edge.errors import UserError
from sdqes_edge.tokenizer import default_tokenizer

from .image_tower import ImageTower
from .text_tower import TextTower

# CLIP's checkpoint layout keeps the text tower's parameters at the top level;
# here they live under ``text.``. These are the top-level names that move.
CLIP_TEXT_KEYS = ("token_embedding.", "positional_embedding", "transformer.", "ln_final.", "text_projection")


def score(frame_embeddings: torch.Tensor, query_embeddings: torch.Tensor) -> torch.Tensor:
    """[B, E] and [Q, E], both L2-normalized -> cosine logits [B, Q]."""
    return frame_embeddings @ query_embeddings.transpose(0, 1)


def probability(logits: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(logits)


class SDQESModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        if not isinstance(cfg, ModelConfig):  # a preset's name failed with "'str' object has no attribute 'vision'"
            example = f"preset({cfg!r})" if isinstance(cfg, str) else "preset('tiny+qrnn')"
            raise UserError(f"SDQESModel takes a ModelConfig, not a {type(cfg).__name__}: SDQESModel({example})")
        super().__init__()
        self.cfg = cfg
        self.visual = ImageTower(cfg)
        self.text = TextTower(cfg)

    # Forms of the image tower, surfaced here.
    def forward_clip(self, frames: torch.Tensor) -> torch.Tensor:
        return self.visual.forward_clip(frames)

    def step(self, frame, state):
        return self.visual.step(frame, state)

    def step_frames(self, frames, state=None):
        return self.visual.step_frames(frames, state)

    def init_state(self, batch: int = 1):
        return self.visual.init_state(batch)

    def state_spec(self, batch: int = 1, dtype: str = "float32"):
        return self.visual.state_spec(batch, dtype)

    def encode_text(self, queries: Sequence[str] | torch.Tensor, on_overflow: str = "error") -> torch.Tensor:
        """Query strings (or token ids [Q, text.context_length], 77 for CLIP) -> L2-normalized embeddings [Q, E]."""
        if not isinstance(queries, torch.Tensor):
            ids = default_tokenizer(self.cfg.text.context_length).tokenize(list(queries), on_overflow=on_overflow)
            queries = torch.from_numpy(ids).to(self.visual.proj.device)
        return self.text(queries)

    # --- CLIP key layout ---------------------------------------------------
    def clip_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters named as in an OpenAI CLIP checkpoint (text tower at the top level)."""
        out = {}
        for key, value in self.state_dict().items():
            out[key[len("text."):] if key.startswith("text.") else key] = value
        return out

    @staticmethod
    def from_clip_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """CLIP-layout keys -> this module's keys."""
        out = {}
        for key, value in state_dict.items():
            out["text." + key if key.startswith(CLIP_TEXT_KEYS) else key] = value
        return out
