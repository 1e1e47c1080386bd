"""Hugging Face transformers' ``CLIPModel`` layout: CLIP's weights under other names, read into CLIP's layout.

``openai/clip-vit-base-patch16`` on the hub (``model.safetensors`` or ``pytorch_model.bin`` beside ``config.json``)
is OpenAI's ViT-B/16, the paper's model, with the same tensors renamed: the towers live under ``vision_model.`` and
``text_model.``, each attention keeps its query, key and value projections as three Linear layers where CLIP keeps
one ``in_proj``, and the towers' output projections are Linear weights, stored transposed. Its ``config.json`` says
what a CLIP checkpoint does not store: the head counts and the MLP activation.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .errors import UserError

TRANSFORMERS_TOWERS = {"vision_model.": "visual.", "text_model.": ""}  # transformers prefix -> CLIP prefix
RENAMED = {
    "vision_model.embeddings.class_embedding": "visual.class_embedding",
    "vision_model.embeddings.patch_embedding.weight": "visual.conv1.weight",
    "vision_model.embeddings.position_embedding.weight": "visual.positional_embedding",
    "vision_model.pre_layrnorm.weight": "visual.ln_pre.weight",  # sic: transformers' own spelling
    "vision_model.pre_layrnorm.bias": "visual.ln_pre.bias",
    "vision_model.post_layernorm.weight": "visual.ln_post.weight",
    "vision_model.post_layernorm.bias": "visual.ln_post.bias",
    "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
    "text_model.embeddings.position_embedding.weight": "positional_embedding",
    "text_model.final_layer_norm.weight": "ln_final.weight",
    "text_model.final_layer_norm.bias": "ln_final.bias",
}
PROJECTIONS = {"visual_projection.weight": "visual.proj", "text_projection.weight": "text_projection"}  # [E, W]
BLOCK_KEY = re.compile(r"^(vision_model\.|text_model\.)encoder\.layers\.(\d+)\.(.+)$")
BLOCK_PARTS = {"layer_norm1.": "ln_1.", "layer_norm2.": "ln_2.", "mlp.fc1.": "mlp.c_fc.", "mlp.fc2.": "mlp.c_proj.",
               "self_attn.out_proj.": "attn.out_proj."}
QKV = ("q_proj", "k_proj", "v_proj")  # concatenated in this order into CLIP's in_proj (nn.MultiheadAttention's)
QKV_PART = re.compile(r"self_attn\.([qkv]_proj)\.(weight|bias)")
UNUSED = ("logit_scale",)  # and the position_ids buffers older files keep
UNUSED_SUFFIXES = (".position_ids",)


def is_transformers_layout(state: dict[str, torch.Tensor]) -> bool:
    return "visual.conv1.weight" not in state and any(k.startswith(tuple(TRANSFORMERS_TOWERS)) for k in state)


def _block_part(part: str) -> str | None:
    """CLIP's name, within a block, of a transformers block parameter other than q/k/v (None: CLIP has none)."""
    for old, new in BLOCK_PARTS.items():
        if part.startswith(old):
            return new + part[len(old):]
    return None


def to_clip_layout(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(CLIP-layout state, keys dropped as unused) from a transformers CLIPModel state dict."""
    if not any(k.startswith("text_model.") for k in state):
        raise UserError("this checkpoint is a transformers CLIP vision tower alone (vision_model.* without "
                        "text_model.*); sdqes-edge reads queries with the text tower too: give the whole CLIPModel's "
                        "checkpoint (model.safetensors of the same hub repository)")
    clip, dropped, unknown = {}, [], []
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}  # (CLIP block prefix, weight|bias) -> q/k/v
    for key, value in state.items():
        if key in UNUSED or key.endswith(UNUSED_SUFFIXES):
            dropped.append(key)
        elif key in RENAMED:
            clip[RENAMED[key]] = value
        elif key in PROJECTIONS:
            clip[PROJECTIONS[key]] = value.t().contiguous()  # Linear's [E, W]; CLIP computes x @ proj, [W, E]
        elif (block_match := BLOCK_KEY.match(key)) is None:
            unknown.append(key)
        else:
            tower, index, part = block_match.groups()
            block = f"{TRANSFORMERS_TOWERS[tower]}transformer.resblocks.{index}."
            if projection := QKV_PART.fullmatch(part):
                qkv.setdefault((block, projection.group(2)), {})[projection.group(1)] = value
            elif (renamed := _block_part(part)) is not None:
                clip[block + renamed] = value
            else:
                unknown.append(key)
    if unknown:
        raise UserError(f"a transformers CLIP checkpoint with parameters CLIP has no place for: "
                        f"{', '.join(sorted(unknown)[:4])}; sdqes-edge reads the CLIPModel architecture only")
    for (block, kind), parts in qkv.items():
        absent = [p for p in QKV if p not in parts]
        if absent:
            raise UserError(f"a transformers CLIP checkpoint without the {'/'.join(absent)}.{kind} of {block[:-1]}; "
                            "is the file complete?")
        clip[f"{block}attn.in_proj_{kind}"] = torch.cat([parts[p] for p in QKV], dim=0)
    return clip, dropped


# --- config.json: what the weights do not say ------------------------------------------------------------------
# Where a key is absent, transformers takes its config class's default, and so does this reader:
# CLIPVisionConfig 12 heads, CLIPTextConfig 8, both quick_gelu and LayerNorm eps 1e-5.
DEFAULT_HEADS = {"vision_config": 12, "text_config": 8}
DEFAULT_ACTIVATION = "quick_gelu"
CLIP_LAYER_NORM_EPS = 1e-5  # what sdqes-edge's towers use, as CLIP's do
ACTIVATIONS = ("quick_gelu", "gelu")  # transformers' ACT2FN names, which are also sdqes-edge's


def is_transformers_config(config: dict) -> bool:
    return "vision_config" in config or "text_config" in config or config.get("model_type") == "clip"


def read_transformers_config(config: dict, path: str | Path) -> tuple[int, int, str]:
    """(vision heads, text heads, MLP activation) from a transformers CLIPConfig's dictionary."""
    fix = "fix it, or give --vision-heads/--text-heads and --mlp-activation"
    if config.get("model_type", "clip") != "clip":
        raise UserError(f"{path} is a transformers config for a '{config['model_type']}' model, not CLIP; {fix}")
    heads, activations = [], set()
    for tower in ("vision_config", "text_config"):
        # Configs written before transformers 4.27 may hold "<tower>_dict", which transformers reads instead.
        settings = config.get(f"{tower}_dict") or config.get(tower) or {}
        if not isinstance(settings, dict):
            raise UserError(f"{path}: {tower} is not an object; {fix}")
        heads.append(int(settings.get("num_attention_heads", DEFAULT_HEADS[tower])))
        act = settings.get("hidden_act", DEFAULT_ACTIVATION)
        if act not in ACTIVATIONS:
            raise UserError(f"{path}: {tower}.hidden_act '{act}' is not an activation sdqes-edge builds "
                            f"({' or '.join(ACTIVATIONS)})")
        activations.add(act)
        eps = float(settings.get("layer_norm_eps", CLIP_LAYER_NORM_EPS))
        if eps != CLIP_LAYER_NORM_EPS:
            raise UserError(f"{path}: {tower}.layer_norm_eps {eps:g}; sdqes-edge's towers use CLIP's "
                            f"{CLIP_LAYER_NORM_EPS:g}")
    if len(activations) > 1:
        raise UserError(f"{path}: the towers use different MLP activations ({' and '.join(sorted(activations))}); "
                        "sdqes-edge takes one for both")
    return heads[0], heads[1], activations.pop()

