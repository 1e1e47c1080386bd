"""Checkpoint loading: the model's configuration inferred from a checkpoint's keys and shapes, and the weights
loaded strictly. The files themselves are read by ``checkpoint_files``; what no checkpoint stores (head counts, MLP
activation, preprocessing) is resolved by ``model_configs``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import torch

from .checkpoint_files import SHARD_INDEX_SUFFIX, LoadedCheckpoint, read_checkpoint
from .config import (
    CLIP_MLP_ACTIVATION,
    AdapterConfig,
    ModelConfig,
    PreprocessConfig,
    TextConfig,
    VisionConfig,
    validate,
)
from .errors import UserError
from .model.sdqes_model import SDQESModel
from .model_configs import (
    HEAD_WIDTH,
    TRAINING_RECORD_SOURCE,
    UnstoredChoices,
    check_unstored_flags,
    recorded_choices,
    resolve_unstored,
)
from .path_checks import as_path

VISION_BLOCK = "visual.transformer.resblocks."


# --- config inference ---------------------------------------------------------

def _count_blocks(state: dict, prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in state if k.startswith(prefix)})


def _ratio_for(dim: int, width: int) -> float:
    """A ratio r with int(width * r) == dim, preferring a short decimal (the reference stores widths as ratios)."""
    for digits in (2, 3, 4, 6):
        r = round(dim / width, digits)
        if int(width * r) == dim:
            return r
    return (dim + 0.5) / width


def detect_adapter_kind(keys: list[str], slot: str = "adapter1") -> str:
    """The adapter kind a checkpoint's first block carries, from its parameter names."""
    prefix = f"{VISION_BLOCK}0.{slot}."
    names = {k[len(prefix):] for k in keys if k.startswith(prefix)}
    if not names:
        return "none"
    if any(n.startswith("retention.") for n in names):
        return "retnet"
    if any(n.startswith("qrnn.") for n in names):
        return "qrnn"
    if "conv.weight" in names:
        return "st"
    if "D_fc1.weight" in names:
        return "mlp"
    return "unknown"


def _infer_adapter(state: dict, width: int, overrides: dict[str, Any]) -> AdapterConfig:
    keys = list(state)
    kind = detect_adapter_kind(keys)
    if kind == "unknown":
        sample = sorted(k for k in keys if ".adapter1." in k)[:4]
        raise UserError(f"unrecognised adapter parameters {sample}; supported kinds: mlp, st, qrnn, retnet")
    if any(".tokent1d_" in k for k in keys):
        raise UserError("the checkpoint uses TokenT1D temporal shifts, which sdqes-edge does not support")
    if kind == "none":
        return dataclasses.replace(AdapterConfig(kind="none"), **overrides)
    per_block = 2 if detect_adapter_kind(keys, "adapter2") != "none" else 1
    a = f"{VISION_BLOCK}0.adapter1."
    fields: dict[str, Any] = dict(kind=kind, per_block=per_block)
    if kind in ("mlp", "st", "retnet"):
        fields["ratio"] = _ratio_for(state[a + "D_fc1.weight"].shape[0], width)
    if kind == "st":
        fields["lookback"] = state[a + "conv.weight"].shape[2] - 1
    if kind == "qrnn":
        conv = state[a + "qrnn.layers.0.conv1d_z.weight"]  # [hidden, in, lookback + 1]
        fields["lookback"] = conv.shape[2] - 1  # streaming needs lookahead 0: the whole kernel looks back
        fields["qrnn_layers"] = _count_blocks(state, a + "qrnn.layers.")
        if a + "qrnn_down.weight" in state:
            fields["qrnn_downsample"] = True
            fields["ratio"] = _ratio_for(state[a + "qrnn_down.weight"].shape[0], width)
            fields["qrnn_hidden_ratio"] = _ratio_for(conv.shape[0], width)
        else:
            fields["ratio"] = _ratio_for(conv.shape[0], width)
    fields.update(overrides)
    return AdapterConfig(**fields)


REQUIRED_CLIP_KEYS = ("visual.conv1.weight", "visual.positional_embedding", "visual.proj",
                      "token_embedding.weight", "positional_embedding", "ln_final.weight", "text_projection")


def infer_config(state: dict[str, torch.Tensor], name: str = "checkpoint", vision_heads: int | None = None,
                 text_heads: int | None = None, mlp_activation: str = CLIP_MLP_ACTIVATION,
                 preprocess: PreprocessConfig | None = None, **adapter_overrides: Any) -> ModelConfig:
    """Every dimension of the model, read off a CLIP-layout state dict.

    What a checkpoint cannot tell is taken from CLIP's conventions and can be overridden: head counts
    (width // 64), the towers' MLP activation (QuickGELU), the image preprocessing (CLIP's transform) and the
    RetNet decay (``retnet_gamma``).
    """
    missing = [k for k in REQUIRED_CLIP_KEYS if k not in state]
    if missing:
        raise UserError(
            f"not a CLIP ViT checkpoint: missing {', '.join(missing)}; sdqes-edge reads OpenAI CLIP / open_clip "
            "ViT checkpoints and checkpoints saved by the SDQES authors' training code"
        )
    conv1 = state["visual.conv1.weight"]  # [width, 3, patch, patch]
    width, patch = conv1.shape[0], conv1.shape[-1]
    grid = round((state["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    text_width = state["ln_final.weight"].shape[0]
    vision = VisionConfig(
        image_size=patch * grid, patch_size=patch, width=width,
        layers=_count_blocks(state, VISION_BLOCK), heads=vision_heads or max(1, width // HEAD_WIDTH),
        mlp_activation=mlp_activation,
    )
    text = TextConfig(
        context_length=state["positional_embedding"].shape[0], vocab_size=state["token_embedding.weight"].shape[0],
        width=text_width, layers=_count_blocks(state, "transformer.resblocks."),
        heads=text_heads or max(1, text_width // HEAD_WIDTH), mlp_activation=mlp_activation,
    )
    cfg = ModelConfig(name=name, embed_dim=state["text_projection"].shape[1], vision=vision, text=text,
                      adapter=_infer_adapter(state, width, adapter_overrides),
                      preprocess=preprocess or PreprocessConfig())
    validate(cfg)
    return cfg


# --- loading into a model --------------------------------------------------------

def _likely_cause(missing: list[str], unexpected: list[str], wrong_shape: list[str], cfg: ModelConfig,
                  checkpoint_keys: list[str]) -> str:
    found_kind = detect_adapter_kind(checkpoint_keys)
    if found_kind != cfg.adapter.kind:
        return (f"wrong adapter kind: the checkpoint has '{found_kind}' adapters, the config expects "
                f"'{cfg.adapter.kind}' (drop the config to infer it from the checkpoint)")
    has_second = detect_adapter_kind(checkpoint_keys, "adapter2") != "none"
    if found_kind != "none" and has_second != (cfg.adapter.per_block == 2):  # a model without adapters has no count
        return (f"wrong adapter count: the checkpoint has {2 if has_second else 1} adapter(s) per block, "
                f"the config {cfg.adapter.per_block}")
    if wrong_shape and all(".adapter" in k for k in wrong_shape):
        return "wrong adapter ratio or lookback: adapter shapes differ from the config's bottleneck widths"
    blocks = ("visual.transformer.resblocks.", "text.transformer.resblocks.")
    if any(k.startswith(blocks) for k in missing + unexpected):
        return "different number of layers: the checkpoint is another model size than the config"
    if wrong_shape and all(".mlp.c_" in k for k in wrong_shape):
        return ("an MLP width other than 4 times the model width (open_clip's ViT-g-14 and ViT-bigG-14 use 4.92), "
                "which sdqes-edge does not build: it builds CLIP's 4x")
    if wrong_shape:
        return "different model size: tensor shapes differ from the config's widths"
    return "the checkpoint's layout differs from the model (was it saved by another architecture?)"


def _listing(keys: list[str], limit: int = 6) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def load_state_dict_strict(model: SDQESModel, clip_state: dict[str, torch.Tensor]) -> None:
    """Load CLIP-layout weights; any missing, unexpected or mis-shaped key is an error naming the cause."""
    own = model.state_dict()
    given = SDQESModel.from_clip_keys(clip_state)
    missing = sorted(k for k in own if k not in given)
    unexpected = sorted(k for k in given if k not in own)
    wrong_shape = sorted(k for k in own if k in given and tuple(given[k].shape) != tuple(own[k].shape))
    if missing or unexpected or wrong_shape:
        cause = _likely_cause(missing, unexpected, wrong_shape, model.cfg, list(clip_state))
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s): {_listing(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} key(s): {_listing(unexpected)}")
        if wrong_shape:
            shapes = [f"{k} {tuple(given[k].shape)} vs {tuple(own[k].shape)}" for k in wrong_shape]
            parts.append(f"{len(wrong_shape)} shape mismatch(es): {_listing(shapes, 3)}")
        raise UserError(f"checkpoint does not fit the model ({cause}); " + "; ".join(parts))
    model.load_state_dict(given, strict=True)


def refuse_non_finite_weights(weights: dict[str, torch.Tensor], holder: str, fix: str) -> None:
    """Refuse weights with a NaN or an infinity, naming them: one makes every score NaN, and the exporter's check
    then blamed the graph it had made ("the exported graph does not match the model")."""
    broken = [k for k, v in weights.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if broken:
        raise UserError(f"{holder} holds NaN or infinite weights in {_listing(broken)}: every score the model would "
                        f"give is NaN; {fix}")


# The file names hub repositories give every model's weights: the folder names the model instead.
HUB_FILE_STEMS = ("model", "pytorch_model", "open_clip_model", "open_clip_pytorch_model")
HUB_CACHE_SNAPSHOT = re.compile(r"models--[^/]+--(?P<name>[^/]+)/snapshots/[0-9a-f]{40}$")  # huggingface_hub's cache


def model_name(path: str) -> str:
    """A model's name from its checkpoint's path: the file's stem (ViT-B-16.pt, epoch=9.ckpt), or for a hub file
    (model.safetensors) its folder's name, the repository's for a file in huggingface_hub's cache."""
    # Sharded weights are named by their index: model.safetensors.index.json as model.safetensors.
    text = str(path)
    file = Path(text[: -len(SHARD_INDEX_SUFFIX)] if text.endswith(SHARD_INDEX_SUFFIX) else text).absolute()
    if file.stem not in HUB_FILE_STEMS:
        return file.stem
    cached = HUB_CACHE_SNAPSHOT.search(file.parent.as_posix())
    return cached["name"] if cached else (file.parent.name or file.stem)


def model_from_checkpoint(ckpt: LoadedCheckpoint, path: str, config: ModelConfig | None = None,
                          **infer_overrides: Any) -> SDQESModel:
    """The model a read checkpoint describes (or ``config``, checked against it), its weights loaded."""
    if config is None:
        config = infer_config(ckpt.state_dict, name=model_name(path), **infer_overrides)
    model = SDQESModel(config)
    load_state_dict_strict(model, ckpt.state_dict)
    refuse_non_finite_weights(ckpt.state_dict, f"checkpoint {path}",
                              "was it saved after training diverged? Give a checkpoint whose weights are finite")
    return model.eval()


def load_model(path: str | os.PathLike, config: ModelConfig | None = None,
               **infer_overrides: Any) -> tuple[SDQESModel, LoadedCheckpoint]:
    """Build the model a checkpoint describes (or ``config``, checked against it) and load its weights. What the
    weights do not store comes from ``infer_overrides``, else from a `sdqes-edge train` checkpoint's record, else
    from CLIP's conventions."""
    path = str(as_path(path, "load_model takes"))  # the model is named after it
    ckpt = read_checkpoint(path)
    recorded = recorded_choices(ckpt.training_record) if config is None else None
    if recorded:
        infer_overrides = {**UnstoredChoices(*recorded, rule=TRAINING_RECORD_SOURCE).overrides(), **infer_overrides}
    return model_from_checkpoint(ckpt, path, config, **infer_overrides), ckpt


def load_resolving_unstored(path: str, vision_heads: int | None = None, text_heads: int | None = None,
                            mlp_activation: str | None = None,
                            model_config: str | None = None) -> tuple[SDQESModel, LoadedCheckpoint, UnstoredChoices]:
    """What the command line loads: the flags checked, the file read, what it does not store resolved from the
    flags or the config that describes its layout, and the model built."""
    check_unstored_flags(vision_heads, text_heads, model_config)
    ckpt = read_checkpoint(path)
    unstored = resolve_unstored(path, vision_heads, text_heads, mlp_activation, model_config, ckpt.source_format,
                                ckpt.training_record)
    return model_from_checkpoint(ckpt, path, **unstored.overrides()), ckpt, unstored
