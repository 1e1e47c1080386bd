"""How a model's images are prepared is not in its checkpoint either: it comes from the model config that describes
the checkpoint (open_clip's preprocess_cfg, transformers' preprocessor_config.json), else CLIP's transform, and the
rule says which. A model normalised otherwise than CLIP was exported with CLIP's mean and std, with no word."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_config
from safetensors.torch import save_file

from sdqes_edge.checkpoints import load_resolving_unstored
from sdqes_edge.config import CLIP_MEAN, CLIP_STD, PreprocessConfig
from sdqes_edge.errors import UserError
from sdqes_edge.model import SDQESModel
from sdqes_edge.runtime.preprocess import Preprocessor

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers for this check")

HALVES = (0.5, 0.5, 0.5)  # the Inception normalisation some CLIP-family models train with
FRAME_RGB = np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8)
OPEN_CLIP_MODEL = {"embed_dim": 32, "quick_gelu": True, "vision_cfg": {"width": 128, "layers": 2, "patch_size": 8},
                   "text_cfg": {"width": 64, "heads": 1, "layers": 1}}


def open_clip_checkpoint(folder, preprocess_cfg: dict | None) -> str:
    path = folder / "open_clip_model.safetensors"
    save_file(SDQESModel(tiny_config("none")).clip_state_dict(), str(path))
    config = {"model_cfg": OPEN_CLIP_MODEL} | ({"preprocess_cfg": preprocess_cfg} if preprocess_cfg else {})
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    return str(path)


def test_open_clips_preprocess_cfg_gives_the_mean_std_and_resize_mode(tmp_path):
    path = open_clip_checkpoint(tmp_path, {"mean": HALVES, "std": HALVES, "resize_mode": "squash"})
    model, _, unstored = load_resolving_unstored(path)
    assert model.cfg.preprocess == PreprocessConfig(resize_shorter_side=False, center_crop=False, mean=HALVES,
                                                    std=HALVES)
    assert unstored.rule.endswith("; preprocessing mean [0.5, 0.5, 0.5], std [0.5, 0.5, 0.5], squashed to the "
                                  "square (from open_clip_config.json)")


def test_clips_own_values_and_a_config_without_preprocess_cfg_keep_clips_transform_and_say_where_from(tmp_path):
    path = open_clip_checkpoint(tmp_path, {"mean": CLIP_MEAN, "std": CLIP_STD, "interpolation": "bicubic"})
    model, _, unstored = load_resolving_unstored(path)
    assert model.cfg.preprocess == PreprocessConfig()
    assert unstored.rule.endswith("; preprocessing CLIP's (from open_clip_config.json)")
    path = open_clip_checkpoint(tmp_path, None)  # open_clip's own <model>.json has none: open_clip uses CLIP's
    assert load_resolving_unstored(path)[2].rule.endswith("; preprocessing: CLIP's (none in open_clip_config.json)")


@pytest.mark.parametrize("preprocess_cfg, refusal", [
    ({"interpolation": "bilinear"}, r"preprocess_cfg\.interpolation 'bilinear'; sdqes-edge resizes frames bicubic"),
    ({"resize_mode": "longest"}, r"preprocess_cfg\.resize_mode 'longest'; sdqes-edge prepares frames as shortest "
                                 r"or squash only"),
    ({"mean": [0.5, 0.5]}, r"preprocess_cfg\.mean \[0\.5, 0\.5\] is not three numbers, one per colour channel"),
    ({"std": [0.5, 0.0, 0.5]}, r"preprocess_cfg\.std \[0\.5, 0\.0, 0\.5\] is not three positive numbers"),
])
def test_a_preprocess_cfg_the_runtime_cannot_follow_is_refused_before_anything_is_exported(preprocess_cfg, refusal,
                                                                                           tmp_path):
    path = open_clip_checkpoint(tmp_path, preprocess_cfg)
    with pytest.raises(UserError, match=refusal):
        load_resolving_unstored(path)


def image_processor(**settings):
    """transformers' PIL image processor (named CLIPImageProcessorPil from transformers 5, which would otherwise warn
    that torchvision is missing)."""
    cls = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)
    return cls(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, **settings)


def test_preprocessor_config_json_gives_the_frames_transformers_own_processor_gives(tmp_path):
    from test_transformers_layout import transformers_clip

    transformers_clip().save_pretrained(tmp_path)
    processor = image_processor(image_mean=list(HALVES), image_std=list(HALVES))
    processor.save_pretrained(tmp_path)
    model, _, unstored = load_resolving_unstored(str(tmp_path / "model.safetensors"))
    assert unstored.rule.endswith("; preprocessing mean [0.5, 0.5, 0.5], std [0.5, 0.5, 0.5], shorter side resized, "
                                  "center-cropped (from preprocessor_config.json)")
    theirs = processor(images=FRAME_RGB, return_tensors="np")["pixel_values"][0]
    ours = Preprocessor.from_config(model.cfg)(np.ascontiguousarray(FRAME_RGB[:, :, ::-1]))
    # PIL rounds its resize to 8 bits and the runtime does not: a fraction of a grey level (CLIP's mean and std
    # would be off by 1.0)
    assert np.abs(ours - theirs).max() < 1 / 255 / 0.5


@pytest.mark.parametrize("settings, refusal", [
    ({"resample": 2}, r"resample 2, do_center_crop True; sdqes-edge prepares frames as CLIP does"),
    ({"do_rescale": False}, r"do_rescale False, rescale_factor .*; sdqes-edge scales 8-bit frames to \[0, 1\]"),
])
def test_a_preprocessor_config_the_runtime_cannot_follow_is_refused(settings, refusal, tmp_path):
    from test_transformers_layout import transformers_clip

    transformers_clip().save_pretrained(tmp_path)
    image_processor(**settings).save_pretrained(tmp_path)
    with pytest.raises(UserError, match=refusal):
        load_resolving_unstored(str(tmp_path / "model.safetensors"))


def test_export_writes_the_models_preprocessing_into_the_bundle_the_runtime_reads(tmp_path):
    from sdqes_edge.cli import run
    from sdqes_edge.runtime.bundle import load_bundle

    path = open_clip_checkpoint(tmp_path, {"mean": HALVES, "std": HALVES})
    assert run(["export", "--checkpoint", path, "--out", str(tmp_path / "bundle"), "--verify-frames", "16",
                 "--quiet"]) == 0
    bundle = load_bundle(tmp_path / "bundle")
    preprocessor = Preprocessor.from_description(bundle.image_size, bundle.manifest["preprocess"])  # as run reads it
    assert (preprocessor.mean, preprocessor.std) == (HALVES, HALVES)
    assert "preprocessing mean [0.5, 0.5, 0.5]" in bundle.manifest["checkpoint"]["heads"]["rule"]
