"""What a checkpoint does not store, and where it comes from: a flag, else the model config that describes the
checkpoint, else CLIP's conventions, each choice said in one line that export prints and records.

No checkpoint stores its attention head counts, its MLP activation or how its images are prepared. open_clip
describes a model in a JSON config: "vision_cfg" with "head_width" (default 64), "text_cfg" with "heads" (default 8),
"quick_gelu" (default false: exact GELU), and on the Hugging Face hub a "preprocess_cfg" (mean, std, resize mode,
interpolation) beside "model_cfg" in open_clip_config.json; open_clip's own configs are <model name>.json. A
transformers CLIPModel keeps the first three in config.json (``transformers_layout.read_transformers_config``) and
the last in preprocessor_config.json.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint_files import TRANSFORMERS_FORMAT, is_torchscript
from .config import CLIP_MEAN, CLIP_MLP_ACTIVATION, CLIP_STD, ModelConfig, PreprocessConfig
from .errors import UserError
from .files import parse_json, user_text_encoding
from .path_checks import path_problem
from .transformers_layout import is_transformers_config, read_transformers_config

HEAD_WIDTH = 64  # CLIP's convention: heads = width // 64
OPEN_CLIP_CONFIG_NAMES = ("open_clip_config.json",)
TRANSFORMERS_CONFIG_NAME = "config.json"
TRANSFORMERS_PREPROCESSOR_NAME = "preprocessor_config.json"
OPEN_CLIP_HEAD_WIDTH, OPEN_CLIP_TEXT_HEADS = 64, 8
ACTIVATION_NAMES = {"quick_gelu": "QuickGELU", "gelu": "GELU"}
OPENAI_ARCHIVE = "openai-torchscript"
# open_clip's resize modes -> (resize the shorter side, center-crop); "longest" pads, which the runtime does not.
OPEN_CLIP_RESIZE_MODES = {"shortest": (True, True), "squash": (False, False)}
PIL_BICUBIC = 3  # transformers' "resample", a PIL filter number
UNSTORED_FLAGS = "--vision-heads/--text-heads and --mlp-activation"


@dataclass
class UnstoredChoices:
    """What a checkpoint does not store, each with where it came from (None: CLIP's convention)."""
    vision_heads: int | None  # None: CLIP's rule, width // 64
    text_heads: int | None
    mlp_activation: str | None  # None: CLIP's QuickGELU
    preprocess: PreprocessConfig | None  # None: CLIP's transform
    rule: str  # one line: where each came from

    def overrides(self) -> dict[str, Any]:
        """``checkpoints.infer_config``'s keyword arguments for the choices made."""
        chosen = (("vision_heads", self.vision_heads), ("text_heads", self.text_heads),
                  ("mlp_activation", self.mlp_activation), ("preprocess", self.preprocess))
        return {k: v for k, v in chosen if v is not None}


def model_config_beside(checkpoint: str, source_format: str | None = None) -> Path | None:
    """The model config that describes a checkpoint, in its folder: config.json beside a transformers checkpoint,
    else open_clip's open_clip_config.json or <checkpoint stem>.json (a hub repository can hold both kinds)."""
    folder, stem = Path(checkpoint).parent, Path(checkpoint).stem
    names = ([TRANSFORMERS_CONFIG_NAME] if source_format == TRANSFORMERS_FORMAT
             else [*OPEN_CLIP_CONFIG_NAMES, f"{stem}.json"])
    return next((folder / name for name in names if (folder / name).is_file()), None)


def _read_json(path: Path) -> Any:
    return parse_json(path.read_text(encoding=user_text_encoding(path)))


def _channels(values: Any, what: str, path: Path, positive: bool = False) -> tuple[float, float, float]:
    """Three finite numbers (an image mean or std)."""
    try:
        numbers = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        numbers = ()
    if len(numbers) != 3 or not all(math.isfinite(v) and (v > 0 or not positive) for v in numbers):
        raise UserError(f"{path}: {what} {values!r} is not three {'positive ' if positive else ''}numbers, one per "
                        "colour channel; fix the file")
    return numbers


def open_clip_preprocess(settings: Any, path: Path) -> PreprocessConfig | None:
    """CLIP's transform as open_clip's "preprocess_cfg" describes it (None: there is none)."""
    if not settings:
        return None
    if not isinstance(settings, dict):
        raise UserError(f"{path}: preprocess_cfg is not an object; fix the file")
    interpolation = settings.get("interpolation", "bicubic")
    resize_mode = settings.get("resize_mode", "shortest")
    if interpolation != "bicubic":
        raise UserError(f"{path}: preprocess_cfg.interpolation '{interpolation}'; sdqes-edge resizes frames bicubic, "
                        "as CLIP trains, and would prepare them otherwise than this model expects")
    if resize_mode not in OPEN_CLIP_RESIZE_MODES:
        raise UserError(f"{path}: preprocess_cfg.resize_mode '{resize_mode}'; sdqes-edge prepares frames as "
                        f"{' or '.join(OPEN_CLIP_RESIZE_MODES)} only")
    shorter_side, crop = OPEN_CLIP_RESIZE_MODES[resize_mode]
    return PreprocessConfig(resize_shorter_side=shorter_side, center_crop=crop,
                            mean=_channels(settings.get("mean", CLIP_MEAN), "preprocess_cfg.mean", path),
                            std=_channels(settings.get("std", CLIP_STD), "preprocess_cfg.std", path, positive=True))


def transformers_preprocess(path: Path) -> PreprocessConfig:
    """CLIP's transform as a transformers CLIPImageProcessor's preprocessor_config.json describes it."""
    try:
        settings = _read_json(path)
        if not isinstance(settings, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is not a readable preprocessor config ({exc}); fix it or move it away") from None
    if settings.get("resample", PIL_BICUBIC) != PIL_BICUBIC or settings.get("do_center_crop", True) is not True:
        raise UserError(f"{path}: resample {settings.get('resample')}, do_center_crop "
                        f"{settings.get('do_center_crop')}; sdqes-edge prepares frames as CLIP does (bicubic "
                        f"resample {PIL_BICUBIC}, center crop)")
    if settings.get("do_rescale", True) is not True or \
            not math.isclose(float(settings.get("rescale_factor", 1 / 255)), 1 / 255, rel_tol=1e-6):
        raise UserError(f"{path}: do_rescale {settings.get('do_rescale')}, rescale_factor "
                        f"{settings.get('rescale_factor')}; sdqes-edge scales 8-bit frames to [0, 1] (1/255) as CLIP "
                        "does")
    if settings.get("do_normalize", True) is not True:
        return PreprocessConfig(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    return PreprocessConfig(mean=_channels(settings.get("image_mean", CLIP_MEAN), "image_mean", path),
                            std=_channels(settings.get("image_std", CLIP_STD), "image_std", path, positive=True))


def read_model_config(config_path: str | Path) -> tuple[int, int, str, PreprocessConfig | None]:
    """(vision heads, text heads, MLP activation, preprocessing or None) from open_clip's model JSON, or from a
    transformers CLIP config.json (whose preprocessing, in another file, this leaves None)."""
    config_path = Path(config_path)
    try:
        config = _read_json(config_path)
        if isinstance(config, dict) and is_transformers_config(config):
            return (*read_transformers_config(config, config_path), None)
        model = config.get("model_cfg", config)
        vision, text = model["vision_cfg"], model["text_cfg"]
        vision_heads = int(vision["width"]) // int(vision.get("head_width", OPEN_CLIP_HEAD_WIDTH))
        text_heads = int(text.get("heads", OPEN_CLIP_TEXT_HEADS))
        activation = "quick_gelu" if model.get("quick_gelu", False) is True else "gelu"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{config_path} is neither an open_clip model config (vision_cfg.width and text_cfg) nor a "
                        f"transformers CLIP config.json ({type(exc).__name__}: {exc}); fix it or give "
                        f"{UNSTORED_FLAGS}") from None
    return vision_heads, text_heads, activation, open_clip_preprocess(config.get("preprocess_cfg"), config_path)


def check_unstored_flags(vision_heads: int | None = None, text_heads: int | None = None,
                         model_config: str | None = None) -> None:
    """The flags for what a checkpoint does not store, checked before the (possibly slow) checkpoint read."""
    for flag, value in (("--vision-heads", vision_heads), ("--text-heads", text_heads)):
        if value is not None and value < 1:
            raise UserError(f"{flag} {value}: a head count is a positive integer")
    problem = path_problem(Path(model_config), "file") if model_config else None
    if problem:
        raise UserError(f"--model-config {model_config} {problem}; give open_clip's JSON for this model (or a "
                        "transformers config.json)")


def _preprocess_words(preprocess: PreprocessConfig | None, source: Path | None, named: str | None = None) -> str:
    """Where the preprocessing came from, in the rule's words (``named``: a source that is no file of its own)."""
    name = named or (source.name if source else None)
    if preprocess is None and source is not None and source.is_file():
        return f"preprocessing: CLIP's (none in {name})"
    if preprocess is None:
        return f"preprocessing: CLIP's (no {name or 'model config'} beside the checkpoint)"
    if preprocess == PreprocessConfig():
        return f"preprocessing CLIP's (from {name})"
    resize = "shorter side resized, center-cropped" if preprocess.resize_shorter_side else "squashed to the square"
    return f"preprocessing mean {list(preprocess.mean)}, std {list(preprocess.std)}, {resize} (from {name})"


TRAINING_RECORD_SOURCE = "its training record"  # how the rule names a `sdqes-edge train` checkpoint's own config


def recorded_choices(training_record: dict | None) -> tuple[int, int, str, PreprocessConfig] | None:
    """(vision heads, text heads, MLP activation, preprocessing) from the model config `sdqes-edge train` recorded
    in its checkpoint: what the weights do not store, stored beside them; None where no readable one is."""
    try:
        cfg = ModelConfig.from_dict(training_record["model"])  # type: ignore[index]
    except (KeyError, TypeError, UserError):
        return None
    return cfg.vision.heads, cfg.text.heads, cfg.vision.mlp_activation, cfg.preprocess


def resolve_unstored(checkpoint: str, vision_heads: int | None = None, text_heads: int | None = None,
                     mlp_activation: str | None = None, model_config: str | None = None,
                     source_format: str | None = None, training_record: dict | None = None) -> UnstoredChoices:
    """Flags first, then a model config (given; else the one a `sdqes-edge train` checkpoint records, its
    ``training_record``; else one found beside the checkpoint), then CLIP's conventions.

    ``source_format`` (``LoadedCheckpoint.source_format``) says which config beside describes the file; without it
    the file is taken for CLIP's layout, and an OpenAI archive is told by its contents.
    """
    check_unstored_flags(vision_heads, text_heads, model_config)
    recorded = None if model_config else recorded_choices(training_record)
    config_path = (None if recorded else Path(model_config) if model_config
                   else model_config_beside(checkpoint, source_format))
    from_config = recorded or (read_model_config(config_path) if config_path else (None, None, None, None))
    config_name = TRAINING_RECORD_SOURCE if recorded else config_path.name if config_path else None
    preprocess, preprocess_source = from_config[3], config_path
    if source_format == TRANSFORMERS_FORMAT:  # transformers keeps the image processor's settings apart
        preprocess_source = Path(checkpoint).parent / TRANSFORMERS_PREPROCESSOR_NAME
        preprocess = transformers_preprocess(preprocess_source) if preprocess_source.is_file() else None
    if source_format is None and os.path.isfile(checkpoint) and is_torchscript(checkpoint):
        source_format = OPENAI_ARCHIVE
    activation_given_by = "--mlp-activation"
    if mlp_activation is None and source_format == OPENAI_ARCHIVE:
        # OpenAI's archives hold their model's code, QuickGELU: open_clip's ViT-B-16.json beside ViT-B-16.pt (the
        # same stem) gives the right head counts, but its missing quick_gelu would say GELU.
        mlp_activation, activation_given_by = CLIP_MLP_ACTIVATION, "an OpenAI CLIP TorchScript archive"
    chosen, words = [], []
    for what, given, given_by, config_value, convention in (
            ("vision", vision_heads, "--vision-heads", from_config[0], f"width // {HEAD_WIDTH} (CLIP's rule"),
            ("text", text_heads, "--text-heads", from_config[1], f"width // {HEAD_WIDTH} (CLIP's rule"),
            ("MLP activation", mlp_activation, activation_given_by, from_config[2], "QuickGELU (CLIP's")):
        value = given if given is not None else config_value
        chosen.append(value)
        shown = ACTIVATION_NAMES.get(value, value)  # a head count shows as itself
        if given is not None:
            words.append(f"{what} {shown} ({given_by})")
        elif config_value is not None:
            words.append(f"{what} {shown} (from {config_name})")
        else:
            words.append(f"{what}: {convention}; no model config beside the checkpoint)")
    from_record = TRAINING_RECORD_SOURCE if recorded else None  # no file to name (transformers' preprocessor is one)
    return UnstoredChoices(*chosen, preprocess, rule=f"attention heads: {words[0]}, {words[1]}; {words[2]}; "
                                                    f"{_preprocess_words(preprocess, preprocess_source, from_record)}")
