"""The dual encoder: image tower with streaming adapters, text tower, cosine scoring.

Scoring follows DESIGN.md section 1: ``logit = cos(frame, query)`` (no
temperature) and ``p = sigmoid(logit)``; all queries in one matrix product.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from sdqes_edge.config import ModelConfig
from sdqes_edge.errors import UserError, is_whole_number
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
        self._state_count = len(self.visual.state_spec(1))  # tensors a state holds, whatever the batch (step checks)

    # Forms of the image tower, surfaced here, their inputs checked: a frame of another size, a uint8 image or a
    # state of another batch failed deep inside the tower ("The size of tensor a (65) must match ...").
    def forward_clip(self, frames: torch.Tensor) -> torch.Tensor:
        self._check_frames(frames, "forward_clip", window=True)
        return self.visual.forward_clip(frames)

    def step(self, frame: torch.Tensor, state: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        self._check_frames(frame, "step", window=False)
        self._check_state(state, frame.shape[0])
        return self.visual.step(frame, state)

    def step_frames(self, frames: torch.Tensor, state: list[torch.Tensor] | None = None):
        self._check_frames(frames, "step_frames", window=True)
        if state is not None:
            self._check_state(state, frames.shape[0])
        return self.visual.step_frames(frames, state)

    def _check_frames(self, frames: object, call: str, window: bool) -> None:
        size = self.cfg.vision.image_size
        if (isinstance(frames, torch.Tensor) and frames.is_floating_point() and frames.dim() == (5 if window else 4)
                and tuple(frames.shape[-3:]) == (3, size, size)):
            return  # every call with its frames right: the refusals' words are made only for a refusal
        layout = f"[B, T, 3, {size}, {size}]" if window else f"[B, 3, {size}, {size}]"
        if not isinstance(frames, torch.Tensor):
            hint = ": torch.from_numpy(frames)" if type(frames).__module__ == "numpy" else ""
            raise UserError(f"{call} takes frames as a torch.Tensor {layout}, not a {type(frames).__name__}{hint}")
        if not frames.is_floating_point():
            raise UserError(f"{call} takes normalized float frames (CLIP's transform, or "
                            f"sdqes_edge.runtime.preprocess.Preprocessor), not {frames.dtype}")
        raise UserError(f"{call} takes frames {layout} (this model's image size is {size}), not {list(frames.shape)}")

    def _check_state(self, state: object, batch: int) -> None:
        count = self._state_count
        if not isinstance(state, (list, tuple)) or len(state) != count or \
                not all(isinstance(s, torch.Tensor) for s in state):
            raise UserError(f"step takes the state as model.init_state(batch) makes it ({count} tensors) or as the "
                            f"step before returned it, not {type(state).__name__}"
                            f"{f' of {len(state)}' if isinstance(state, (list, tuple)) else ''}")
        if state and state[0].shape[0] != batch:
            raise UserError(f"the state is of {state[0].shape[0]} stream(s) and the frames of {batch}: make it with "
                            f"model.init_state({batch})")

    def init_state(self, batch: int = 1):
        # torch refused -1 as "negative dimension", and 0 made a state of no streams that failed at the first step
        if not is_whole_number(batch, least=1):
            raise UserError(f"init_state takes the number of streams, a whole number of at least 1, not {batch!r}")
        return self.visual.init_state(int(batch))

    def state_spec(self, batch: int = 1, dtype: str = "float32"):
        return self.visual.state_spec(batch, dtype)

    def encode_text(self, queries: Sequence[str] | torch.Tensor, on_overflow: str = "error") -> torch.Tensor:
        """Query strings, or one, (or token ids [Q, text.context_length], 77 for CLIP) -> L2-normalized embeddings
        [Q, E]."""
        if isinstance(queries, str):  # one query, not one a letter
            queries = [queries]
        if not isinstance(queries, (torch.Tensor, Sequence)):
            raise UserError("encode_text takes a query text, a list of them or token ids, not a "
                            f"{type(queries).__name__}")
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
