"""Model configuration: one frozen dataclass tree that fully describes a model.

Torch-free on purpose: the runtime reads the same description from a bundle's
manifest without importing torch. ``ModelConfig.from_json(cfg.to_json()) == cfg``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import UserError

ADAPTER_KINDS = ("none", "mlp", "st", "qrnn", "retnet")
# Adapters whose output at frame t depends on earlier frames (they carry streaming state).
TEMPORAL_ADAPTER_KINDS = ("st", "qrnn", "retnet")

# The towers' MLP activation: OpenAI CLIP's QuickGELU (x * sigmoid(1.702 x); the authors' model and every OpenAI
# checkpoint), or the exact GELU that open_clip's own models use unless their config says quick_gelu. No checkpoint
# stores which: the same weights under the other one give other embeddings.
MLP_ACTIVATIONS = ("quick_gelu", "gelu")
CLIP_MLP_ACTIVATION = "quick_gelu"

CLIP_VOCAB_SIZE = 49408  # CLIP's BPE (sdqes_edge/data): 512 byte tokens, 48,894 merges, start and end

# CLIP's image normalization (DESIGN.md section 2): the one place these numbers live.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# Sampling rate of the stream (DESIGN.md section 1: the benchmark samples 1 frame per second).
DEFAULT_FPS = 1.0
# Alert threshold on p = sigmoid(cos) when none was calibrated: sigmoid(0.28), about the cosine
# CLIP gives an image and a caption that matches it. Calibrate with `sdqes-edge eval --calibrate`.
DEFAULT_THRESHOLD = 0.57


@dataclass(frozen=True)
class VisionConfig:
    image_size: int = 224
    patch_size: int = 16
    width: int = 768
    layers: int = 12
    heads: int = 12
    mlp_activation: str = CLIP_MLP_ACTIVATION  # one of MLP_ACTIVATIONS

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        """Tokens per frame: the patch grid plus the class token (197 for ViT-B/16 at 224px)."""
        return self.grid_size**2 + 1


@dataclass(frozen=True)
class TextConfig:
    context_length: int = 77
    vocab_size: int = CLIP_VOCAB_SIZE
    width: int = 512
    layers: int = 12
    heads: int = 8
    mlp_activation: str = CLIP_MLP_ACTIVATION  # one of MLP_ACTIVATIONS


@dataclass(frozen=True)
class AdapterConfig:
    """Streaming temporal adapters inside every block of the image tower.

    Widths follow the reference code: a bottleneck of ``int(width * ratio)``.
    For the down-projecting QRNN (``qrnn_downsample``) the tokens are first
    projected to ``int(width * ratio)`` and the QRNN hidden size is
    ``int(width * qrnn_hidden_ratio)``; the plain QRNN reads the full-width
    tokens and has hidden size ``int(width * ratio)``.
    """

    kind: str = "none"
    per_block: int = 2  # 1: adapter1 before attention; 2: also adapter2 on the attention output
    ratio: float = 0.25
    lookback: int = 1  # frames of history a convolutional adapter sees besides the current one
    qrnn_layers: int = 1
    qrnn_downsample: bool = False
    qrnn_hidden_ratio: float = 0.25
    retnet_gamma: float = 0.5
    xpos_scale_base: int = 512

    def bottleneck(self, width: int) -> int:
        return int(width * self.ratio)

    def qrnn_hidden(self, width: int) -> int:
        return int(width * (self.qrnn_hidden_ratio if self.qrnn_downsample else self.ratio))


@dataclass(frozen=True)
class PreprocessConfig:
    """How a camera frame becomes the tower's input (CLIP's transform)."""

    resize_shorter_side: bool = True
    interpolation: str = "bicubic"
    center_crop: bool = True
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD


@dataclass(frozen=True)
class ModelConfig:
    name: str = "custom"
    embed_dim: int = 512
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)

    def __post_init__(self) -> None:
        validate(self)

    # --- JSON round trip -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        if not isinstance(data, dict):  # a list failed on a missing attribute ('list' object has no attribute 'get')
            raise UserError(f"model config is a JSON object of its fields, not a {type(data).__name__}; write it "
                            "with ModelConfig.to_json() or start from a preset (sdqes-edge info --list-presets)")
        try:
            pre = dict(data.get("preprocess", {}))
            for key in ("mean", "std"):
                if key in pre:
                    pre[key] = tuple(pre[key])
            return cls(
                name=data.get("name", "custom"),
                embed_dim=data["embed_dim"],
                vision=VisionConfig(**data["vision"]),
                text=TextConfig(**data["text"]),
                adapter=AdapterConfig(**data.get("adapter", {})),
                preprocess=PreprocessConfig(**pre),
            )
        except (KeyError, TypeError) as exc:
            raise UserError(
                f"model config is malformed ({exc}); write it with ModelConfig.to_json() "
                "or start from a preset (sdqes-edge info --list-presets)"
            ) from None

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        try:
            data = json.loads(text)
        except ValueError as exc:  # json's own error named no file and no fix
            raise UserError(f"model config is not JSON ({exc}); write it with ModelConfig.to_json()") from None
        return cls.from_dict(data)

    def with_adapter(self, kind: str, **changes: Any) -> "ModelConfig":
        """This model with another adapter kind (and optionally other adapter fields)."""
        adapter = dataclasses.replace(self.adapter, kind=kind, **changes)
        base = self.name.split("+")[0]
        return dataclasses.replace(self, adapter=adapter, name=base if kind == "none" else f"{base}+{kind}")


def receptive_field(cfg: ModelConfig) -> dict[str, Any]:
    """How many past frames can influence the current embedding.

    Stacked causal convolutions (``st``) see ``lookback`` more frames per
    adapter; recurrences (``qrnn``, ``retnet``) see the whole past, decayed.
    """
    a = cfg.adapter
    if a.kind in ("none", "mlp"):
        return {"frames": 1, "bounded": True}
    if a.kind == "st":
        return {"frames": 1 + cfg.vision.layers * a.per_block * a.lookback, "bounded": True}
    return {"frames": None, "bounded": False}


def validate(cfg: ModelConfig) -> None:
    """Refuse configurations the model cannot be built from, naming the field to fix."""
    v, t, a = cfg.vision, cfg.text, cfg.adapter
    problems = []
    if v.image_size % v.patch_size:
        problems.append(f"vision.image_size {v.image_size} is not a multiple of patch_size {v.patch_size}")
    if v.width % v.heads:
        problems.append(f"vision.width {v.width} is not divisible by vision.heads {v.heads}")
    if t.width % t.heads:
        problems.append(f"text.width {t.width} is not divisible by text.heads {t.heads}")
    for tower, tower_cfg in (("vision", v), ("text", t)):
        if tower_cfg.mlp_activation not in MLP_ACTIVATIONS:
            problems.append(f"{tower}.mlp_activation {tower_cfg.mlp_activation!r} is not one of "
                            f"{', '.join(MLP_ACTIVATIONS)}")
    if t.vocab_size < CLIP_VOCAB_SIZE:  # queries are read with CLIP's BPE; its ids would index past the table
        problems.append(f"text.vocab_size {t.vocab_size} is smaller than CLIP's BPE vocabulary ({CLIP_VOCAB_SIZE} "
                        "tokens), which sdqes-edge reads queries with: this text tower was trained with another "
                        "tokenizer")
    if a.kind not in ADAPTER_KINDS:
        problems.append(f"adapter.kind {a.kind!r} is not one of {', '.join(ADAPTER_KINDS)}")
    if a.per_block not in (1, 2):
        problems.append(f"adapter.per_block must be 1 or 2, not {a.per_block}")
    if a.lookback < 1:
        problems.append(f"adapter.lookback must be >= 1, not {a.lookback}")
    if a.qrnn_layers < 1:
        problems.append(f"adapter.qrnn_layers must be >= 1, not {a.qrnn_layers}")
    if a.kind != "none":
        if a.bottleneck(v.width) < 1:
            problems.append(f"adapter.ratio {a.ratio} leaves no bottleneck channels at width {v.width}")
        if a.kind == "qrnn" and a.qrnn_hidden(v.width) < 1:
            problems.append(f"the QRNN hidden size int(width * ratio) is 0 at width {v.width}")
        if a.kind == "retnet" and a.bottleneck(v.width) % 2:
            problems.append(
                f"the RetNet adapter width int({v.width} * {a.ratio}) = {a.bottleneck(v.width)} is odd; "
                "xPos rotates channel pairs, so pick a ratio giving an even width"
            )
        if a.kind == "retnet" and not 0.0 < a.retnet_gamma < 1.0:
            problems.append(f"adapter.retnet_gamma must lie in (0, 1), not {a.retnet_gamma}")
    if problems:
        raise UserError("invalid model config: " + "; ".join(problems))


# --- presets --------------------------------------------------------------

_CLIP_B16 = ModelConfig(name="clip-vit-b16")
# Small shapes for tests and CPU experiments. Widths are multiples of 64 so that
# CLIP's head-count convention (width // 64) infers them back from a checkpoint.
_TINY = ModelConfig(
    name="tiny",
    embed_dim=32,
    vision=VisionConfig(image_size=32, patch_size=8, width=128, layers=2, heads=2),
    text=TextConfig(context_length=77, vocab_size=49408, width=64, layers=1, heads=1),
)
# The model `sdqes-edge train` fits to synthetic event streams and `sdqes-edge demo` ships: big enough to
# see a 3-pixel ball at 64 px, small enough to train in minutes on two CPU cores and ship in a few MB
# (the text tower's 49408-token embedding table dominates its size).
_SYNTHETIC = ModelConfig(
    name="synthetic",
    embed_dim=64,
    vision=VisionConfig(image_size=64, patch_size=16, width=64, layers=4, heads=1),
    text=TextConfig(context_length=77, vocab_size=49408, width=32, layers=2, heads=1),
)

# The authors' adapter configurations (DESIGN.md section 2): two adapters per block.
AUTHORS_ADAPTERS = {
    "mlp": dict(per_block=2, ratio=0.5),
    "st": dict(per_block=2, ratio=0.25, lookback=1),
    "qrnn": dict(per_block=2, ratio=0.35, qrnn_downsample=True, qrnn_hidden_ratio=0.25, lookback=1),
    "retnet": dict(per_block=2, ratio=0.323),
}


def with_authors_adapter(base: ModelConfig, kind: str, **changes: Any) -> ModelConfig:
    """``base`` with the authors' configuration of adapter ``kind`` (plus ``changes``).

    RetNet needs an even width; where the authors' ratio gives an odd one at
    this width (small test models), ratio 0.25 is used instead.
    """
    fields = dict(AUTHORS_ADAPTERS.get(kind, {}), **changes)
    if kind == "retnet" and "ratio" not in changes and int(base.vision.width * fields["ratio"]) % 2:
        fields["ratio"] = 0.25
    return base.with_adapter(kind, **fields)


def _build_presets() -> dict[str, ModelConfig]:
    presets = {"clip-vit-b16": _CLIP_B16, "tiny": _TINY, "synthetic": _SYNTHETIC}
    for base in (_CLIP_B16, _TINY, _SYNTHETIC):
        for kind in AUTHORS_ADAPTERS:
            presets[f"{base.name}+{kind}"] = with_authors_adapter(base, kind)
    return presets


PRESETS: dict[str, ModelConfig] = _build_presets()


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
