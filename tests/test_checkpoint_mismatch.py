"""Weights that do not fit the model they are loaded into are refused in one line that names the likely cause
and the keys. A CLIP checkpoint without adapters carrying one key the model lacks was blamed on "wrong adapter
count: the checkpoint has 1 adapter(s) per block, the config 2", for a model that has no adapters at all."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import random_model

from sdqes_edge.checkpoints import load_state_dict_strict
from sdqes_edge.config import preset
from sdqes_edge.errors import UserError
from sdqes_edge.model import SDQESModel


def refusal(model: SDQESModel, state: dict) -> str:
    with pytest.raises(UserError) as caught:
        load_state_dict_strict(model, state)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_key_a_model_without_adapters_lacks_is_named_without_blaming_adapters():
    state = SDQESModel(preset("tiny")).clip_state_dict()
    state["positional_embedding_res"] = torch.zeros(3)  # e.g. Long-CLIP's second table, read without its reader
    assert refusal(SDQESModel(preset("tiny")), state) == (
        "checkpoint does not fit the model (the checkpoint's layout differs from the model (was it saved by another "
        "architecture?)); unexpected 1 key(s): text.positional_embedding_res")


def test_adapters_of_another_kind_or_count_are_named():
    qrnn = random_model("qrnn").clip_state_dict()
    assert "wrong adapter kind: the checkpoint has 'qrnn' adapters, the config expects 'st'" in refusal(
        random_model("st"), qrnn)
    one_per_block = random_model("qrnn", per_block=1)
    assert "wrong adapter count: the checkpoint has 2 adapter(s) per block, the config 1" in refusal(
        one_per_block, qrnn)


def test_another_model_size_is_named():
    cfg = preset("tiny")
    deeper = SDQESModel(dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, layers=cfg.vision.layers + 1)))
    assert "different number of layers" in refusal(deeper, SDQESModel(cfg).clip_state_dict())
    longer_text = SDQESModel(dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, layers=cfg.text.layers + 1)))
    assert "different number of layers" in refusal(longer_text, SDQESModel(cfg).clip_state_dict())


def test_an_mlp_wider_than_clips_four_times_is_named():
    """open_clip's ViT-g-14 and ViT-bigG-14 widen their MLPs to 4.92 times the width; the model builds CLIP's 4."""
    state = SDQESModel(preset("tiny")).clip_state_dict()
    for key in [k for k in state if ".mlp.c_fc." in k or ".mlp.c_proj.weight" in k]:
        grown = list(state[key].shape)
        grown[0 if ".c_fc." in key else 1] = grown[0 if ".c_fc." in key else 1] * 5 // 4
        state[key] = torch.zeros(grown)
    assert "an MLP width other than 4 times the model width" in refusal(SDQESModel(preset("tiny")), state)
