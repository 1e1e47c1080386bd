"""Every checkpoint layout round-trips into the same model; a wrong one is refused with a reason."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections import OrderedDict

import numpy as np
import pytest
import torch
from conftest import ADAPTER_CASES, case_id, random_model, tiny_config

from sdqes_edge.checkpoints import infer_config, load_model, read_checkpoint
from sdqes_edge.config import preset
from sdqes_edge.errors import UserError
from sdqes_edge.model import SDQESModel

FRAMES = torch.randn(1, 4, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def adapter_shape(cfg) -> tuple:
    """What a checkpoint determines about the adapters (a ratio is only known up to the width it gives)."""
    a, width = cfg.adapter, cfg.vision.width
    return (a.kind, a.per_block, a.lookback, a.qrnn_layers, a.qrnn_downsample,
            a.bottleneck(width), a.qrnn_hidden(width))


def same_outputs(a: SDQESModel, b: SDQESModel) -> bool:
    with torch.no_grad():
        images = torch.equal(a.forward_clip(FRAMES), b.forward_clip(FRAMES))
        texts = torch.equal(a.encode_text(["when I start cooking"]), b.encode_text(["when I start cooking"]))
    return images and texts


class ClipLayoutModule(torch.nn.Module):
    """OpenAI CLIP's module layout: ``visual`` plus the text tower's parts at the top level."""

    def __init__(self, model: SDQESModel):
        super().__init__()
        self.visual = model.visual
        self.token_embedding = model.text.token_embedding
        self.positional_embedding = model.text.positional_embedding
        self.transformer = model.text.transformer
        self.ln_final = model.text.ln_final
        self.text_projection = model.text.text_projection
        self.logit_scale = torch.nn.Parameter(torch.tensor(4.6052))

    def forward(self, image):
        return self.visual.forward_clip(image[:, None])


def test_openai_torchscript_archive_loads_into_the_plain_model(tmp_path):
    original = random_model("none")
    archive = torch.jit.trace(ClipLayoutModule(original), torch.randn(1, 3, 32, 32), check_trace=False)
    path = str(tmp_path / "ViT-tiny.pt")
    torch.jit.save(archive, path)
    loaded, info = load_model(path)
    assert info.source_format == "openai-torchscript"
    assert "logit_scale" in info.dropped_keys
    assert loaded.cfg.vision == original.cfg.vision and loaded.cfg.text == original.cfg.text
    assert loaded.cfg.adapter.kind == "none"
    assert same_outputs(loaded, original)


def test_openai_fp16_state_dict_loads_as_fp32(tmp_path):
    original = random_model("none")
    state = {k: v.half() for k, v in original.clip_state_dict().items()}
    state.update(input_resolution=torch.tensor(32), context_length=torch.tensor(77), vocab_size=torch.tensor(49408))
    path = str(tmp_path / "clip_fp16.pt")
    torch.save(state, path)
    loaded, info = load_model(path)
    assert info.source_format == "state-dict"
    assert all(p.dtype == torch.float32 for p in loaded.parameters())


def test_open_clip_training_checkpoint_with_ddp_prefix(tmp_path):
    original = random_model("none")
    state = {"module." + k: v for k, v in original.clip_state_dict().items()}
    state["module.logit_scale"] = torch.tensor(4.6)
    path = str(tmp_path / "epoch_3.pt")
    torch.save({"epoch": 3, "name": "ViT-tiny", "state_dict": state}, path)
    loaded, info = load_model(path)
    assert info.source_format == "open_clip-training"
    assert same_outputs(loaded, original)


@pytest.mark.parametrize("name, prefix", [("open_clip_model.safetensors", ""), ("renamed.bin", "module.")])
def test_a_safetensors_file_from_the_hub_loads_whatever_its_name_and_a_cut_one_is_one_line(name, prefix, tmp_path):
    """open_clip's hub repositories ship open_clip_model.safetensors; torch.load called it corrupt."""
    from safetensors.torch import save_file

    original = random_model("none")
    state = {prefix + k: v.contiguous() for k, v in original.clip_state_dict().items()}
    save_file({**state, prefix + "logit_scale": torch.tensor(4.6)}, str(tmp_path / name))
    loaded, info = load_model(str(tmp_path / name))
    assert info.source_format == "safetensors" and info.dropped_keys == ["logit_scale"]
    assert same_outputs(loaded, original)
    whole = (tmp_path / name).read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match=r"^cannot read safetensors file .*cut.safetensors \(.+\); is the file "
                                        r"complete\?$"):
        load_model(str(tmp_path / "cut.safetensors"))


def lightning_checkpoint(model: SDQESModel, path: str) -> str:
    """The SDQES authors' layout: a LightningModule with the model under ``backbone.``."""
    state = OrderedDict(("backbone." + k, v) for k, v in model.clip_state_dict().items())
    state["classifier.temperature"] = torch.ones(1)  # a head outside the backbone
    torch.save({
        "epoch": 7, "global_step": 1234, "pytorch-lightning_version": "2.1.3",
        "state_dict": state,
        "hyper_parameters": argparse.Namespace(lr=1e-4, backbone="qrnn_adapter_clip"),
    }, path)
    return path


@pytest.mark.parametrize("case", ADAPTER_CASES, ids=case_id)
def test_sdqes_lightning_checkpoint_round_trips_with_inferred_adapters(case, tmp_path):
    kind, fields = case
    original = random_model(kind, **fields)
    loaded, info = load_model(lightning_checkpoint(original, str(tmp_path / "last.ckpt")))
    assert info.source_format == "sdqes-lightning"
    assert info.dropped_keys == ["classifier.temperature"]
    assert adapter_shape(loaded.cfg) == adapter_shape(original.cfg)
    assert same_outputs(loaded, original)


def test_authors_b16_shapes_are_inferred_from_keys():
    # Building four B/16 models is slow; infer from a state dict of meta tensors instead.
    for kind in ("mlp", "st", "qrnn", "retnet"):
        cfg = preset(f"clip-vit-b16+{kind}")
        with torch.device("meta"):
            state = SDQESModel(cfg).clip_state_dict()
        inferred = infer_config(state, name=cfg.name)
        assert inferred.adapter == cfg.adapter, kind
        assert inferred.vision == cfg.vision and inferred.text == cfg.text


def test_wrong_adapter_kind_is_refused_naming_the_cause(tmp_path):
    path = lightning_checkpoint(random_model("retnet"), str(tmp_path / "r.ckpt"))
    with pytest.raises(UserError, match=r"wrong adapter kind: the checkpoint has 'retnet'.*expects 'qrnn'"):
        load_model(path, config=tiny_config("qrnn"))


def test_wrong_ratio_is_refused_naming_the_cause(tmp_path):
    path = lightning_checkpoint(random_model("mlp"), str(tmp_path / "m.ckpt"))
    with pytest.raises(UserError, match="wrong adapter ratio.*shape mismatch"):
        load_model(path, config=tiny_config("mlp", ratio=0.25))


def test_missing_keys_are_listed(tmp_path):
    state = random_model("none").clip_state_dict()
    del state["visual.ln_post.weight"]
    path = str(tmp_path / "broken.pt")
    torch.save(state, path)
    with pytest.raises(UserError, match=r"missing 1 key\(s\): visual.ln_post.weight"):
        load_model(path)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_checkpoint_with_nan_or_infinite_weights_is_refused_naming_them(value, tmp_path):
    """Saved after training diverged: the exporter built its graph, then blamed it ("the exported graph does not
    match the model ... please report this"), since NaN matches nothing."""
    state = random_model("qrnn").clip_state_dict()
    state["visual.ln_pre.bias"][3] = value
    state["visual.transformer.resblocks.0.adapter1.qrnn_down.weight"][0, 0] = value
    path = str(tmp_path / "diverged.pt")
    torch.save(state, path)
    named = r"visual.ln_pre.bias, visual.transformer.resblocks.0.adapter1.qrnn_down.weight"
    with pytest.raises(UserError, match=rf"^checkpoint {path} holds NaN or infinite weights in {named}: .*finite$"):
        load_model(path)


def test_a_checkpoint_that_is_not_clip_is_refused(tmp_path):
    path = str(tmp_path / "resnet.pt")
    torch.save({"conv1.weight": torch.zeros(3, 3, 7, 7), "fc.weight": torch.zeros(10, 5)}, path)
    with pytest.raises(UserError, match="not a CLIP ViT checkpoint: missing visual.conv1.weight"):
        load_model(path)


def test_a_corrupt_file_a_missing_file_and_a_folder_are_refused(tmp_path):
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"\x80\x04garbage" * 100)
    with pytest.raises(UserError, match="truncated or corrupt"):
        read_checkpoint(str(corrupt))
    with pytest.raises(UserError, match="checkpoint not found"):
        read_checkpoint(str(tmp_path / "nope.ckpt"))
    with pytest.raises(UserError, match="is a folder; pass the .pt/.ckpt/.safetensors file inside it"):
        read_checkpoint(str(tmp_path))


@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_a_damaged_checkpoint_is_named_in_one_sentence_without_torchs_advice(damage, tmp_path):
    """torch's own message for a cut-short archive runs to four sentences of miniz advice, and a text file
    gives pickle's KeyError naming an opcode byte: the user gets the fault and what to do, nothing else."""
    whole = tmp_path / "whole.pt"
    torch.save({"w": torch.zeros(64)}, whole)
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2] if damage == "truncated" else b"hello world")
    with pytest.raises(UserError) as refused:
        read_checkpoint(str(damaged))
    message = str(refused.value)
    assert "\n" not in message and ("truncated or corrupt" if damage == "truncated" else "it is a text file") in message
    assert "miniz" not in message and "(101)" not in message


def test_a_file_of_another_kind_given_as_a_checkpoint_is_named_for_what_it_is(tmp_path):
    """torch answered a NumPy archive with "[enforce fail at inline_container.cc:180]" and a CSV with "pop from
    empty list", then guessed the file was corrupt."""
    import numpy as np

    np.savez(tmp_path / "state.npz", x=np.zeros(3))
    (tmp_path / "annotations.csv").write_text("split,source,video_uid\nval,moments,v1\n")
    (tmp_path / "empty.pt").write_bytes(b"")
    for name, says in (("state.npz", "it is a NumPy .npz archive (a state snapshot or a score trace?), not a "
                                     "checkpoint;"),
                       ("annotations.csv", "it is a text file, not a checkpoint;"), ("empty.pt", "it is empty;")):
        with pytest.raises(UserError, match=re.escape(f"cannot read checkpoint {tmp_path / name}: {says}")):
            read_checkpoint(str(tmp_path / name))


def test_a_bundle_or_its_onnx_graph_given_as_the_checkpoint_is_named_as_an_export(tmp_path):
    """A bundle folder was "a folder; pass the .pt/.ckpt/.safetensors file inside it" (it holds none), and its
    graph "not a readable torch checkpoint (Unsupported operand 8); is the file truncated or corrupt?"."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    (bundle / "step.fp32.onnx").write_bytes(b"\x08\x08\x12\x07pytorch\x1a\x052.13.0")  # how ONNX files begin
    with pytest.raises(UserError, match=re.escape(f"checkpoint {bundle} is a bundle made by `sdqes-edge export`, not "
                                                  "a checkpoint; give the .pt/.ckpt/.safetensors file it was exported "
                                                  f"from (`sdqes-edge inspect {bundle}` describes the bundle)")):
        read_checkpoint(str(bundle))
    with pytest.raises(UserError, match=re.escape(f"cannot read checkpoint {bundle / 'step.fp32.onnx'}: it is an ONNX "
                                                  "graph (what an export writes, never read back), not a checkpoint;")):
        read_checkpoint(str(bundle / "step.fp32.onnx"))


def test_a_binary_file_is_not_called_text_and_a_text_file_cut_mid_character_still_is(tmp_path):
    """Control bytes decode as UTF-8, so a binary file (a video, here) was named "a text file"; and the 4 KiB read
    to tell could end inside a character, so a CSV with accents was not."""
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x01" * 100)
    (tmp_path / "notes.csv").write_text("a" * 4095 + "é" * 10, encoding="utf-8")  # 4,096 bytes end inside é
    with pytest.raises(UserError) as binary:
        read_checkpoint(str(tmp_path / "clip.mp4"))
    assert "text file" not in str(binary.value) and "\n" not in str(binary.value)
    with pytest.raises(UserError, match="it is a text file, not a checkpoint;"):
        read_checkpoint(str(tmp_path / "notes.csv"))


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch should-never-exist",))


def test_a_pickle_that_would_run_code_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    state = random_model("none").clip_state_dict()
    path = str(tmp_path / "evil.ckpt")
    torch.save({"state_dict": state, "payload": RunsCode()}, path)
    with pytest.raises(UserError, match="posix.system.*refused"):
        read_checkpoint(path)
    assert not (tmp_path / "should-never-exist").exists()


def test_unknown_classes_become_inert_placeholders(tmp_path):
    """A Lightning checkpoint's hyper-parameter objects are read as data, never imported or executed."""
    path = lightning_checkpoint(random_model("mlp"), str(tmp_path / "h.ckpt"))
    info = read_checkpoint(path)
    assert info.source_format == "sdqes-lightning"
    assert "visual.conv1.weight" in info.state_dict


def heads_not_64_wide(kind: str = "qrnn") -> SDQESModel:
    """Like open_clip's ViT-H/14 (16 heads of 80): heads that CLIP's width // 64 rule gets wrong."""
    import dataclasses

    cfg = tiny_config(kind)
    cfg = dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, heads=4),  # 128 wide: 4 x 32, not 2
                              text=dataclasses.replace(cfg.text, heads=2))  # 64 wide: 2 x 32, not 1
    torch.manual_seed(3)
    return SDQESModel(cfg).eval()


OPEN_CLIP_CONFIG = {"embed_dim": 32, "quick_gelu": True,  # the models of these tests are CLIP's, QuickGELU
                    "vision_cfg": {"image_size": 32, "layers": 2, "width": 128, "head_width": 32, "patch_size": 8},
                    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1}}


@pytest.mark.parametrize("where", ["open_clip_config.json", "STEM.json", "flags"])
def test_head_counts_come_from_flags_or_the_model_config_beside_the_checkpoint(where, tmp_path):
    import json

    from sdqes_edge.model_configs import resolve_unstored

    original = heads_not_64_wide()
    path = str(tmp_path / "vit-odd.pt")
    torch.save(original.clip_state_dict(), path)
    flags = {}
    if where == "flags":
        flags = {"vision_heads": 4, "text_heads": 2, "mlp_activation": "quick_gelu"}
    else:
        config = {"model_cfg": OPEN_CLIP_CONFIG} if where == "open_clip_config.json" else OPEN_CLIP_CONFIG
        # STEM.json as a Windows editor saves it, a byte-order mark first (json refused it: no model config)
        (tmp_path / where.replace("STEM", "vit-odd")).write_text(
            json.dumps(config), encoding="utf-8-sig" if where == "STEM.json" else "utf-8")
    heads = resolve_unstored(path, **flags)
    assert heads.overrides() == {"vision_heads": 4, "text_heads": 2, "mlp_activation": "quick_gelu"}
    assert ("--vision-heads" if where == "flags" else where.replace("STEM", "vit-odd")) in heads.rule
    loaded, _ = load_model(path, **heads.overrides())
    assert (loaded.cfg.vision.heads, loaded.cfg.text.heads) == (4, 2)
    assert same_outputs(loaded, original)


def test_without_a_model_config_the_width_rule_is_used_and_said(tmp_path):
    from sdqes_edge.model_configs import resolve_unstored

    original = heads_not_64_wide()
    path = str(tmp_path / "vit-odd.pt")
    torch.save(original.clip_state_dict(), path)
    heads = resolve_unstored(path)
    assert heads.overrides() == {} and "width // 64 (CLIP's rule" in heads.rule
    loaded, _ = load_model(path, **heads.overrides())
    assert loaded.cfg.vision.heads == 2 and not same_outputs(loaded, original)  # why the rule must be said


def test_export_records_the_head_counts_and_their_rule_in_the_manifest(tmp_path):
    import json
    import subprocess
    import sys

    path = tmp_path / "vit-odd.pt"
    torch.save(heads_not_64_wide("none").clip_state_dict(), path)
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_CONFIG}))
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "export", "--checkpoint", str(path), "--out",
                           str(tmp_path / "b"), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "attention heads: vision 4 (from open_clip_config.json), text 2 (from open_clip_config.json)" in done.stdout
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert (manifest["model"]["vision"]["heads"], manifest["model"]["text"]["heads"]) == (4, 2)
    heads = manifest["checkpoint"]["heads"]
    assert heads["vision"] == 4 and "open_clip_config.json" in heads["rule"]
    bad = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "export", "--checkpoint", str(path), "--out",
                          str(tmp_path / "c"), "--vision-heads", "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "not divisible by vision.heads 3" in bad.stderr, bad.stderr


def test_a_text_tower_of_another_context_length_reads_queries_at_its_own_length_in_torch_and_in_the_bundle(
        tmp_path):
    """The model tokenized at CLIP's 77 whatever its positional table held: a 64-position text tower failed its
    export with a traceback ("index: 1 Got: 77 Expected: 64")."""
    from sdqes_edge.export import ExportOptions, export_bundle
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.detector import text_encoder_for

    cfg = tiny_config("none")
    original = SDQESModel(dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, context_length=64))).eval()
    torch.save(original.clip_state_dict(), tmp_path / "short-text.pt")
    loaded, _ = load_model(str(tmp_path / "short-text.pt"))
    assert loaded.cfg.text.context_length == 64 and same_outputs(loaded, original)
    export_bundle(loaded, tmp_path / "bundle", ExportOptions(verify_frames=16), log=lambda line: None)
    with torch.no_grad():
        expected = loaded.encode_text(["when I start cooking"])[0].numpy()
    got = text_encoder_for(load_bundle(tmp_path / "bundle")).encode("when I start cooking")
    assert np.abs(got - expected).max() < 1e-5


def test_a_text_tower_with_a_smaller_vocabulary_than_clips_bpe_is_refused_naming_it(tmp_path):
    """Its token table cannot hold the ids CLIP's tokenizer gives: the export ended in torch's IndexError."""
    state = SDQESModel(tiny_config("none")).clip_state_dict()
    state["token_embedding.weight"] = state["token_embedding.weight"][:1000]
    torch.save(state, tmp_path / "other-tokenizer.pt")
    with pytest.raises(UserError, match=r"^invalid model config: text\.vocab_size 1000 is smaller than CLIP's BPE "
                                        r"vocabulary \(49408 tokens\), which sdqes-edge reads queries with"):
        load_model(str(tmp_path / "other-tokenizer.pt"))
