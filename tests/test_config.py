"""ModelConfig fully describes a model, survives JSON, and refuses impossible shapes."""

from __future__ import annotations

import pytest

from sdqes_edge.config import PRESETS, ModelConfig, preset
from sdqes_edge.errors import UserError


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_round_trips_through_json(name):
    cfg = PRESETS[name]
    assert ModelConfig.from_json(cfg.to_json()) == cfg


def test_clip_vit_b16_has_the_real_shapes():
    cfg = preset("clip-vit-b16")
    v, t = cfg.vision, cfg.text
    assert (v.image_size, v.patch_size, v.width, v.layers, v.heads, cfg.embed_dim) == (224, 16, 768, 12, 12, 512)
    assert (t.context_length, t.vocab_size, t.width, t.layers, t.heads) == (77, 49408, 512, 12, 8)
    assert v.num_tokens == 197


def test_authors_adapter_presets():
    assert preset("clip-vit-b16+qrnn").adapter.qrnn_downsample
    assert preset("clip-vit-b16+qrnn").adapter.qrnn_hidden(768) == 192
    assert preset("clip-vit-b16+qrnn").adapter.bottleneck(768) == 268
    assert preset("clip-vit-b16+retnet").adapter.bottleneck(768) == 248
    assert preset("clip-vit-b16+mlp").adapter.bottleneck(768) == 384
    assert all(preset(f"clip-vit-b16+{k}").adapter.per_block == 2 for k in ("mlp", "st", "qrnn", "retnet"))


def test_image_tower_parameter_count_matches_clip_b16():
    import torch

    from sdqes_edge.model import SDQESModel

    with torch.device("meta"):
        model = SDQESModel(preset("clip-vit-b16"))
    params = sum(p.numel() for p in model.visual.parameters())
    assert round(params / 1e6, 1) == 86.2


@pytest.mark.parametrize("change, message", [
    (dict(adapter={"kind": "lstm"}), "adapter.kind 'lstm'"),
    (dict(adapter={"kind": "mlp", "per_block": 3}), "per_block must be 1 or 2"),
    (dict(adapter={"kind": "retnet", "ratio": 0.323}), "RetNet adapter width .* is odd"),
    (dict(vision={"image_size": 30, "patch_size": 8, "width": 128, "layers": 2, "heads": 2}), "not a multiple"),
])
def test_impossible_configs_are_refused_naming_the_field(change, message):
    data = preset("tiny").to_dict()
    for key, value in change.items():
        data[key] = {**data[key], **value}
    with pytest.raises(UserError, match=message):
        ModelConfig.from_dict(data)


def test_malformed_config_json_is_a_user_error():
    with pytest.raises(UserError, match="model config is malformed"):
        ModelConfig.from_dict({"vision": {}})


def test_unknown_preset_lists_the_choices():
    with pytest.raises(UserError, match="choose one of: clip-vit-b16"):
        preset("vit-huge")


def test_a_model_made_from_a_presets_name_is_told_to_build_its_config_first():
    from sdqes_edge.model import SDQESModel

    with pytest.raises(UserError, match=r"^SDQESModel takes a ModelConfig, not a str: "
                                        r"SDQESModel\(preset\('tiny\+qrnn'\)\)$"):
        SDQESModel("tiny+qrnn")  # it failed with "'str' object has no attribute 'vision'"


@pytest.mark.parametrize("text, says", [
    ("[1, 2]", r"^model config is a JSON object of its fields, not a list; write it with ModelConfig.to_json\(\)"),
    ("{'embed_dim': 512}", r"^model config is not JSON \(Expecting property name enclosed in double quotes"),
    ("{}", r"^model config is malformed \('embed_dim'\)"),
])
def test_a_model_config_that_is_no_json_object_is_refused_in_one_line(text, says):
    """A list failed as "'list' object has no attribute 'get'", and text that is not JSON as json's own error."""
    with pytest.raises(UserError, match=says):
        ModelConfig.from_json(text)
