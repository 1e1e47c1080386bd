"""Hugging Face transformers' CLIPModel layout (``openai/clip-vit-base-patch16``'s ``model.safetensors`` beside its
``config.json``: the paper's model under other names) loads as the same model: embeddings equal transformers' own
``CLIPModel``, with the head counts and the activation from its config.json. It was refused as another layout."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from sdqes_edge.checkpoints import load_resolving_unstored
from sdqes_edge.errors import UserError
from sdqes_edge.tokenizer import default_tokenizer

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers for this check")

QUERIES = ["when I start cooking", "when I open the fridge"]
PIXELS = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))  # normalized images


def transformers_clip(hidden_act: str = "quick_gelu", seed: int = 0):
    """A small CLIPModel whose head counts CLIP's rule (width // 64) would get wrong: 4 and 2, not 2 and 1."""
    config = transformers.CLIPConfig(
        text_config=dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                         max_position_embeddings=77, vocab_size=49408, hidden_act=hidden_act),
        vision_config=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8, hidden_act=hidden_act),
        projection_dim=32)
    torch.manual_seed(seed)
    return transformers.CLIPModel(config).eval()


def features(output) -> torch.Tensor:
    """transformers 4 returns the projected features; 5 an output whose pooler_output holds them."""
    tensor = output if isinstance(output, torch.Tensor) else output.pooler_output
    return tensor / tensor.norm(dim=-1, keepdim=True)


def reference_embeddings(model) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.from_numpy(default_tokenizer().tokenize(QUERIES)).long()
    with torch.no_grad():
        return features(model.get_image_features(pixel_values=PIXELS)), features(model.get_text_features(input_ids=ids))


def our_embeddings(model) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return model.forward_clip(PIXELS[:, None])[:, 0], model.encode_text(QUERIES)


@pytest.mark.parametrize("hidden_act", ["quick_gelu", "gelu"])
def test_a_transformers_checkpoint_gives_transformers_own_embeddings_with_its_config_json(hidden_act, tmp_path):
    reference = transformers_clip(hidden_act)
    reference.save_pretrained(tmp_path)  # model.safetensors and config.json, as on the hub
    model, loaded, unstored = load_resolving_unstored(str(tmp_path / "model.safetensors"))
    assert loaded.source_format == "transformers-clip" and "logit_scale" in loaded.dropped_keys
    assert (model.cfg.vision.heads, model.cfg.text.heads) == (4, 2)
    assert (model.cfg.vision.mlp_activation, model.cfg.text.mlp_activation) == (hidden_act, hidden_act)
    shown = {"quick_gelu": "QuickGELU", "gelu": "GELU"}[hidden_act]
    assert unstored.rule == (f"attention heads: vision 4 (from config.json), text 2 (from config.json); "
                             f"MLP activation {shown} (from config.json); "
                             "preprocessing: CLIP's (no preprocessor_config.json beside the checkpoint)")
    for ours, theirs in zip(our_embeddings(model), reference_embeddings(reference)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)


def test_pytorch_model_bin_loads_as_model_safetensors_does(tmp_path):
    reference = transformers_clip(seed=1)
    reference.config.to_json_file(str(tmp_path / "config.json"))
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")  # the hub's older file, position_ids and all
    model, loaded, _ = load_resolving_unstored(str(tmp_path / "pytorch_model.bin"))
    assert loaded.source_format == "transformers-clip"
    for ours, theirs in zip(our_embeddings(model), reference_embeddings(reference)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)


def test_each_checkpoint_of_a_hub_repository_holding_both_layouts_reads_its_own_config(tmp_path):
    """laion's hub repositories hold open_clip's files and transformers' side by side: open_clip_config.json
    describes open_clip_model.safetensors, config.json describes model.safetensors."""
    reference = transformers_clip("gelu")
    reference.save_pretrained(tmp_path)
    open_clip_config = {"model_cfg": {"embed_dim": 32, "quick_gelu": True,
                                      "vision_cfg": {"width": 128, "head_width": 16, "layers": 2},
                                      "text_cfg": {"width": 64, "heads": 4, "layers": 2}}}
    (tmp_path / "open_clip_config.json").write_text(json.dumps(open_clip_config))
    model, _, unstored = load_resolving_unstored(str(tmp_path / "model.safetensors"))
    assert (model.cfg.vision.heads, model.cfg.text.heads, model.cfg.vision.mlp_activation) == (4, 2, "gelu")
    clip_layout = tmp_path / "open_clip_model.safetensors"
    save_file(model.clip_state_dict(), str(clip_layout))
    model, _, unstored = load_resolving_unstored(str(clip_layout))
    assert (model.cfg.vision.heads, model.cfg.text.heads, model.cfg.vision.mlp_activation) == (8, 4, "quick_gelu")
    assert "(from open_clip_config.json)" in unstored.rule


def test_without_config_json_clips_conventions_are_used_and_said(tmp_path):
    reference = transformers_clip()
    save_file(reference.state_dict(), str(tmp_path / "model.safetensors"))
    model, _, unstored = load_resolving_unstored(str(tmp_path / "model.safetensors"))
    assert (model.cfg.vision.heads, model.cfg.text.heads) == (2, 1)  # width // 64: why config.json matters
    assert "no model config beside the checkpoint" in unstored.rule
    model, _, unstored = load_resolving_unstored(str(tmp_path / "model.safetensors"), vision_heads=4, text_heads=2)
    for ours, theirs in zip(our_embeddings(model), reference_embeddings(reference)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)


def test_a_vision_tower_alone_is_refused_for_the_whole_model(tmp_path):
    vision_only = {k: v for k, v in transformers_clip().state_dict().items() if not k.startswith("text_")}
    save_file(vision_only, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match=r"^this checkpoint is a transformers CLIP vision tower alone .*give the whole "
                                        r"CLIPModel's checkpoint"):
        load_resolving_unstored(str(tmp_path / "model.safetensors"))


def test_a_part_clip_has_no_place_for_is_named(tmp_path):
    state = dict(transformers_clip().state_dict())
    state["vision_model.encoder.layers.0.self_attn.rotary.weight"] = torch.zeros(4)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match=r"parameters CLIP has no place for: vision_model\.encoder\.layers\.0\."
                                        r"self_attn\.rotary\.weight; sdqes-edge reads the CLIPModel architecture"):
        load_resolving_unstored(str(tmp_path / "model.safetensors"))
    del state["vision_model.encoder.layers.0.self_attn.rotary.weight"]
    del state["text_model.encoder.layers.1.self_attn.k_proj.bias"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match=r"without the k_proj\.bias of transformer\.resblocks\.1; is the file "):
        load_resolving_unstored(str(tmp_path / "model.safetensors"))


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu_new"}, r"vision_config\.hidden_act 'gelu_new' is not an activation sdqes-edge builds "
                                 r"\(quick_gelu or gelu\)"),
    ({"layer_norm_eps": 1e-6}, r"vision_config\.layer_norm_eps 1e-06; sdqes-edge's towers use CLIP's 1e-05"),
])
def test_a_config_json_describing_what_sdqes_edge_does_not_build_is_refused(change, message, tmp_path):
    transformers_clip().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["vision_config"].update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=message):
        load_resolving_unstored(str(tmp_path / "model.safetensors"))


def test_info_describes_a_transformers_checkpoint_with_the_rule_from_its_config(tmp_path):
    transformers_clip().save_pretrained(tmp_path)
    result = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "info", "--checkpoint",
                             str(tmp_path / "model.safetensors")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "(transformers-clip, sha256 " in result.stdout
    assert "attention heads: vision 4 (from config.json), text 2 (from config.json)" in result.stdout


@pytest.mark.parametrize("path, name", [
    ("downloads/ViT-B-16.pt", "ViT-B-16"),
    ("lightning_logs/epoch=9.ckpt", "epoch=9"),
    ("clip-vit-base-patch16/model.safetensors", "clip-vit-base-patch16"),
    ("hub/models--openai--clip-vit-base-patch16/snapshots/" + "57c216476eefef5ab752ec549e440a49ae4ae5f3"
     "/model.safetensors", "clip-vit-base-patch16"),
    ("laion/open_clip_pytorch_model.bin", "laion"),
])
def test_a_model_is_named_for_its_file_or_for_a_hub_files_folder(path, name):
    """Every hub repository names its weights model.safetensors: a bundle named "model" tells nobody which."""
    from sdqes_edge.checkpoints import model_name

    assert model_name(path) == name


def test_a_hub_folder_given_as_the_checkpoint_names_the_weights_inside_it(tmp_path):
    transformers_clip().save_pretrained(tmp_path)
    with pytest.raises(UserError, match=r"^checkpoint .* is a folder; pass the \.pt/\.ckpt/\.safetensors file inside "
                                        r"it \(it holds model\.safetensors\)$"):
        load_resolving_unstored(str(tmp_path))


def test_an_older_config_json_with_tower_dicts_is_read_as_transformers_reads_it(tmp_path):
    """Configs from before transformers 4.27 (openai/clip-vit-base-patch16's among them) carry vision_config_dict
    and text_config_dict, which transformers takes over vision_config and text_config."""
    reference = transformers_clip()
    reference.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["vision_config_dict"] = {"hidden_size": 128, "num_attention_heads": 4}
    config["text_config_dict"] = {"hidden_size": 64, "num_attention_heads": 2}
    config["vision_config"]["num_attention_heads"] = config["text_config"]["num_attention_heads"] = 16  # overridden
    (tmp_path / "config.json").write_text(json.dumps(config))
    model, _, _ = load_resolving_unstored(str(tmp_path / "model.safetensors"))
    assert (model.cfg.vision.heads, model.cfg.text.heads) == (4, 2)


def test_a_config_json_given_as_the_checkpoint_is_named_with_the_weights_beside_it(tmp_path):
    transformers_clip().save_pretrained(tmp_path)
    with pytest.raises(UserError, match=r"^cannot read checkpoint .*config\.json: it is a JSON file \(a model "
                                        r"config\?\), not the weights; the folder holds model\.safetensors; expected"):
        load_resolving_unstored(str(tmp_path / "config.json"))
