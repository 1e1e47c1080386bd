"""The towers' MLP activation, which no checkpoint stores: OpenAI CLIP's QuickGELU, or the exact GELU of open_clip's
own models. An open_clip checkpoint loaded with QuickGELU gave other embeddings with no word; it now comes from the
model config beside the checkpoint (its ``quick_gelu``), or a flag, and the rule that chose it is said and recorded."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from conftest import tiny_config

from sdqes_edge.checkpoints import load_model
from sdqes_edge.config import ModelConfig
from sdqes_edge.errors import UserError
from sdqes_edge.model import SDQESModel
from sdqes_edge.model_configs import resolve_unstored

FRAMES = torch.randn(1, 4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
QUERY = "when I start cooking"
# open_clip's own config for the tiny model: no "quick_gelu" key, so exact GELU (open_clip's default).
OPEN_CLIP_GELU_CONFIG = {"embed_dim": 32,
                         "vision_cfg": {"image_size": 32, "layers": 2, "width": 128, "patch_size": 8},
                         "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1,
                                      "layers": 1}}


def gelu_model(kind: str = "qrnn") -> SDQESModel:
    """An open_clip-style model: both towers' MLPs with exact GELU."""
    cfg = tiny_config(kind)
    cfg = dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, mlp_activation="gelu"),
                              text=dataclasses.replace(cfg.text, mlp_activation="gelu"))
    torch.manual_seed(5)
    return SDQESModel(cfg).eval()


def outputs(model: SDQESModel) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return model.forward_clip(FRAMES), model.encode_text([QUERY])


def test_an_open_clip_config_without_quick_gelu_loads_the_checkpoint_with_gelu_and_says_so(tmp_path):
    original = gelu_model()
    path = tmp_path / "epoch_9.pt"
    torch.save(original.clip_state_dict(), path)
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_GELU_CONFIG}))
    unstored = resolve_unstored(str(path))
    assert unstored.mlp_activation == "gelu" and "MLP activation GELU (from open_clip_config.json)" in unstored.rule
    loaded, _ = load_model(str(path), **unstored.overrides())
    assert (loaded.cfg.vision.mlp_activation, loaded.cfg.text.mlp_activation) == ("gelu", "gelu")
    for got, expected in zip(outputs(loaded), outputs(original)):
        assert torch.equal(got, expected)


def test_without_a_model_config_clips_quickgelu_is_used_and_said_and_a_flag_overrides_it(tmp_path):
    original = gelu_model("none")
    path = tmp_path / "vit.pt"
    torch.save(original.clip_state_dict(), path)
    unstored = resolve_unstored(str(path))
    assert "MLP activation: QuickGELU (CLIP's; no model config beside the checkpoint)" in unstored.rule
    assumed, _ = load_model(str(path), **unstored.overrides())
    assert not torch.allclose(outputs(assumed)[0], outputs(original)[0], atol=1e-3)  # why it must be said
    flagged = resolve_unstored(str(path), mlp_activation="gelu")
    assert "MLP activation GELU (--mlp-activation)" in flagged.rule
    loaded, _ = load_model(str(path), **flagged.overrides())
    assert torch.equal(outputs(loaded)[0], outputs(original)[0])


def test_an_openai_archive_keeps_quickgelu_beside_open_clips_config_of_the_same_name(tmp_path):
    """open_clip's ViT-B-16.json lacks quick_gelu (its own models use GELU); beside OpenAI's ViT-B-16.pt it gives the
    head counts, and the archive, which holds its model's code, the activation."""
    from test_checkpoints import ClipLayoutModule

    original = SDQESModel(tiny_config("none")).eval()
    torch.jit.save(torch.jit.trace(ClipLayoutModule(original), torch.randn(1, 3, 32, 32), check_trace=False),
                   str(tmp_path / "ViT-B-16.pt"))
    (tmp_path / "ViT-B-16.json").write_text(json.dumps(OPEN_CLIP_GELU_CONFIG))
    unstored = resolve_unstored(str(tmp_path / "ViT-B-16.pt"))
    assert unstored.mlp_activation == "quick_gelu" and "vision 2 (from ViT-B-16.json)" in unstored.rule
    assert "MLP activation QuickGELU (an OpenAI CLIP TorchScript archive)" in unstored.rule
    loaded, _ = load_model(str(tmp_path / "ViT-B-16.pt"), **unstored.overrides())
    assert torch.equal(outputs(loaded)[0], outputs(original)[0])


def test_a_config_of_an_unknown_activation_is_refused_and_an_old_one_reads_as_clips():
    with pytest.raises(UserError, match="vision.mlp_activation 'relu' is not one of quick_gelu, gelu"):
        dataclasses.replace(tiny_config("none"), vision=dataclasses.replace(tiny_config("none").vision,
                                                                            mlp_activation="relu"))
    described = tiny_config("none").to_dict()
    for tower in ("vision", "text"):  # a manifest written before the field
        del described[tower]["mlp_activation"]
    assert ModelConfig.from_dict(described).vision.mlp_activation == "quick_gelu"


def test_a_gelu_checkpoint_exports_to_a_bundle_that_matches_pytorch_and_records_its_activation(tmp_path):
    path = tmp_path / "epoch_9.pt"
    torch.save(gelu_model().clip_state_dict(), path)
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_GELU_CONFIG}))
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "export", "--checkpoint", str(path), "--out",
                           str(tmp_path / "b"), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr  # the export's own check: ONNX against PyTorch, step against window
    assert "MLP activation GELU (from open_clip_config.json)" in done.stdout
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["model"]["vision"]["mlp_activation"] == manifest["model"]["text"]["mlp_activation"] == "gelu"
    assert "GELU" in manifest["checkpoint"]["heads"]["rule"]
