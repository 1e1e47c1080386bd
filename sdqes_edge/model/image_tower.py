"""The CLIP ViT image tower with streaming adapters: one definition, two forms.

``forward_clip(frames [B,T,3,R,R]) -> [B,T,E]`` runs a window of frames in
parallel (training, and the oracle for the step form). ``step(frame [B,3,R,R],
state) -> ([B,E], state)`` runs one frame with the state carried explicitly:
an ordered list of tensors described by ``state_spec(batch)``. The export
traces ``step``; nothing is re-implemented for it.

The step carries the tokens as rows ``[B*L, D]`` from the patch embedding to
the class token's read-out, so that each linear layer of every block and
adapter is one 2-D product: the exported step graph then runs few kernels,
which is what a step costs on a GPU (DESIGN.md, "The step on a GPU").

Block order with adapters (the reference's)::

    x = adapter1(x);  a = MHSA(ln_1(x));  x = x + (adapter2(a) if two adapters else a)
    x = x + MLP(ln_2(x))
"""

from __future__ import annotations

import torch
from torch import nn

from sdqes_edge.config import ModelConfig
from sdqes_edge.state import StateSpec, StateTensorSpec

from .adapters import StreamingAdapter, as_rows, as_tokens_major, build_adapter
from .layers import Attention, LayerNorm, clip_mlp, patch_embedding


class AdaptedBlock(nn.Module):
    def __init__(self, width: int, heads: int, cfg: ModelConfig):
        super().__init__()
        self.attn = Attention(width, heads)
        self.ln_1 = LayerNorm(width)
        self.mlp = clip_mlp(width, cfg.vision.mlp_activation)
        self.ln_2 = LayerNorm(width)
        self.tokens = cfg.vision.num_tokens
        self.adapter1 = build_adapter(width, cfg.adapter, self.tokens)
        self.adapter2 = build_adapter(width, cfg.adapter, self.tokens) if cfg.adapter.per_block == 2 else None
        # How many of this block's state tensors belong to adapter1 (the rest are adapter2's).
        self._adapter1_state_count = len(self.adapter1.state_shapes(self.tokens)) if self.adapter1 is not None else 0

    def adapters(self) -> list[tuple[str, StreamingAdapter]]:
        return [(name, a) for name, a in (("adapter1", self.adapter1), ("adapter2", self.adapter2)) if a is not None]

    def _spatial(self, x: torch.Tensor, adapt1, adapt2) -> torch.Tensor:
        """The block with its adapters given as functions of [B,(T),L,D] tokens (window or step)."""
        x = adapt1(x) if self.adapter1 is not None else x
        a = self._attend(x)
        x = x + (adapt2(a) if self.adapter2 is not None else a)
        return x + self.mlp(self.ln_2(x))

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        """Spatial attention within each frame: x [..., L, D] with any leading axes, or rows [B*L, D]."""
        if x.dim() == 2:
            return self.attn.rows(self.ln_1(x), self.tokens)
        rows = self.attn.rows(self.ln_1(x).reshape(-1, x.shape[-1]), self.tokens)
        return rows.reshape(x.shape)

    def window(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, L, D]."""
        return self._spatial(
            x,
            self.adapter1.window if self.adapter1 is not None else None,
            self.adapter2.window if self.adapter2 is not None else None,
        )

    def step(self, x: torch.Tensor, state: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x rows [B*L, D]; ``state`` holds adapter1's tensors then adapter2's."""
        new_state: list[torch.Tensor] = []
        split = self._adapter1_state_count

        def run(adapter: StreamingAdapter, own_state: list[torch.Tensor]):
            def apply(tokens: torch.Tensor) -> torch.Tensor:
                y, s = adapter.step(tokens, own_state, self.tokens)
                new_state.extend(s)
                return y
            return apply

        x = self._spatial(
            x,
            run(self.adapter1, state[:split]) if self.adapter1 is not None else None,
            run(self.adapter2, state[split:]) if self.adapter2 is not None else None,
        )
        return x, new_state


class AdaptedTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        v = cfg.vision
        self.resblocks = nn.ModuleList(AdaptedBlock(v.width, v.heads, cfg) for _ in range(v.layers))


class ImageTower(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        v = cfg.vision
        self.cfg = cfg
        scale = v.width**-0.5
        self.conv1 = nn.Conv2d(3, v.width, kernel_size=v.patch_size, stride=v.patch_size, bias=False)
        self.class_embedding = nn.Parameter(scale * torch.randn(v.width))
        self.positional_embedding = nn.Parameter(scale * torch.randn(v.num_tokens, v.width))
        self.ln_pre = LayerNorm(v.width)
        self.transformer = AdaptedTransformer(cfg)
        self.ln_post = LayerNorm(v.width)
        self.proj = nn.Parameter(scale * torch.randn(v.width, cfg.embed_dim))
        # Per block: how many state tensors it takes, so step() can slice the flat state list.
        tokens = v.num_tokens
        self._state_counts = [
            sum(len(a.state_shapes(tokens)) for _, a in block.adapters()) for block in self.transformer.resblocks
        ]

    def adapter_parameters(self) -> int:
        """The adapters' parameters, as the checkpoint holds them (the rest of the tower's are the backbone's).

        Counted on the model, not on a step graph: the step form widens bottlenecks with zero weights
        (``adapters.STEP_WIDTH_MULTIPLE``) that a graph carries but no checkpoint has."""
        return sum(p.numel() for name, p in self.named_parameters() if ".adapter" in name)

    # --- the shared ends of both forms -----------------------------------
    def _tokens(self, images: torch.Tensor) -> torch.Tensor:
        """images [N,3,R,R] -> tokens [N, L, D] (class token first)."""
        x = patch_embedding(images, self.conv1)  # [N, grid*grid, D]
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat((cls, x), dim=1) + self.positional_embedding.to(x.dtype)
        return self.ln_pre(x)

    def _embed(self, cls: torch.Tensor) -> torch.Tensor:
        """class tokens [..., D] -> L2-normalized embeddings [..., E]."""
        e = self.ln_post(cls) @ self.proj
        return e / e.norm(dim=-1, keepdim=True)

    # --- window form ------------------------------------------------------
    def forward_clip(self, frames: torch.Tensor) -> torch.Tensor:
        """frames [B, T, 3, R, R] (normalized) -> embeddings [B, T, E] (L2-normalized)."""
        b, t = frames.shape[:2]
        x = self._tokens(frames.flatten(0, 1))
        x = x.reshape(b, t, x.shape[1], x.shape[2])  # [B, T, L, D]
        for block in self.transformer.resblocks:
            x = block.window(x)
        return self._embed(x[..., 0, :])

    forward = forward_clip

    # --- step form ----------------------------------------------------------
    def state_spec(self, batch: int = 1, dtype: str = "float32") -> StateSpec:
        """The state of ``batch`` streams, held in ``dtype`` (a graph's is ``contract.STATE_DTYPES[precision]``)."""
        tokens = self.cfg.vision.num_tokens
        entries = []
        for i, block in enumerate(self.transformer.resblocks):
            for slot, adapter in block.adapters():
                for name, shape in adapter.state_shapes(tokens):
                    entries.append(StateTensorSpec(f"block{i:02d}.{slot}.{name}", (batch,) + tuple(shape), dtype))
        return StateSpec(tuple(entries))

    def init_state(self, batch: int = 1) -> list[torch.Tensor]:
        """The zero state, built from the state spec (so model, export and runtime agree)."""
        device, dtype = self.proj.device, self.proj.dtype
        return [torch.full(t.shape, t.initial_value, device=device, dtype=dtype) for t in self.state_spec(batch)]

    def step(self, frame: torch.Tensor, state: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """frame [B, 3, R, R] (normalized), state in spec order and shapes -> (embedding [B, E], next state)."""
        embedding, rows = self.step_rows(frame, [as_rows(s) for s in state])
        return embedding, [as_tokens_major(r, self.cfg.vision.num_tokens) for r in rows]

    def step_rows(self, frame: torch.Tensor, state: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``step`` with every state tensor as rows, its streams and tokens axes merged ([B, L, ...] as
        [B*L, ...], the same bytes): the form the step graph is traced from, so its state needs no reshape."""
        tokens = self.cfg.vision.num_tokens
        x = self._tokens(frame)
        x = x.reshape(-1, x.shape[-1])  # rows [B*L, D]
        new_state: list[torch.Tensor] = []
        offset = 0
        for block, count in zip(self.transformer.resblocks, self._state_counts):
            x, block_state = block.step(x, list(state[offset : offset + count]))
            new_state.extend(block_state)
            offset += count
        if offset != len(state):
            raise ValueError(f"step() got {len(state)} state tensors, the state spec has {offset}")
        return self._embed(x[::tokens]), new_state  # every stream's first row is its class token

    def step_frames(self, frames: torch.Tensor, state: list[torch.Tensor] | None = None):
        """Step form over a window: frames [B, T, 3, R, R] one at a time, state carried.

        Returns (embeddings [B, T, E], final state); the counterpart of ``forward_clip`` for comparisons.
        """
        state = self.init_state(frames.shape[0]) if state is None else state
        outputs = []
        for t in range(frames.shape[1]):
            emb, state = self.step(frames[:, t], state)
            outputs.append(emb)
        return torch.stack(outputs, dim=1), state
