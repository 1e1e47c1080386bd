"""Checkpoint files read into CLIP key layout: OpenAI CLIP, open_clip, safetensors, the SDQES authors' training code.

Formats read:
- OpenAI CLIP: a TorchScript archive (``ViT-B-16.pt``) or a plain state dict.
- open_clip: a state dict, or a training checkpoint ``{"state_dict": {"module.visual...": ...}}``.
- safetensors: a state dict in CLIP layout (open_clip's ``open_clip_model.safetensors`` on the Hugging Face hub).
- Hugging Face transformers: a ``CLIPModel``'s ``model.safetensors`` or ``pytorch_model.bin``, renamed into CLIP
  layout by ``transformers_layout``; weights sharded by ``save_pretrained`` through the index that lists their
  shards (``model.safetensors.index.json``).
- Long-CLIP: a state dict whose text positions come in two tables, joined on reading (``LONG_CLIP_FORMAT``).
- sdqes_baselines (PyTorch Lightning): ``{"state_dict": {"backbone.visual...": ...}, ...}``.

All reach the same CLIP key layout (``visual.*`` plus the text tower at the
top level), from which ``checkpoints.infer_config`` reads every dimension. Nothing
is unpickled beyond tensors and plain containers: ``torch.load(weights_only=True)``,
with any other class the file names (a Lightning ``AttributeDict``, an
``argparse.Namespace``) replaced by an inert placeholder whose code never runs;
a safetensors file holds tensors alone by its format.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import struct
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .contract import MANIFEST_NAME
from .errors import UserError, first_line, install_command
from .files import file_sha256, parse_json
from .path_checks import as_path
from .train_options import CHECKPOINT_RECORD_KEY
from .transformers_layout import is_transformers_layout, to_clip_layout

# Keys a CLIP-layout checkpoint may carry that the model does not use.
IGNORED_KEYS = ("logit_scale", "input_resolution", "context_length", "vocab_size")
IGNORED_SUFFIXES = ("attn_mask",)
# Prefixes under which a training checkpoint nests the model.
LIGHTNING_PREFIX = "backbone."  # the SDQES authors' LightningModule
DDP_PREFIX = "module."  # open_clip training checkpoints
# What the weights files of CLIP models are called: named when a folder is given for one.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")
# Weights that save_pretrained split: shards model-00001-of-00003.safetensors ..., each tensor's shard named in an
# index beside them (model.safetensors.index.json, pytorch_model.bin.index.json), which stands for the checkpoint.
SHARD_INDEX_SUFFIX = ".index.json"
SHARD_NAME = re.compile(r"-\d{5}-of-\d{5}\.(safetensors|bin)$")
TRANSFORMERS_FORMAT = "transformers-clip"  # Hugging Face transformers' CLIPModel, renamed into CLIP's layout
# Long-CLIP (Zhang et al., ECCV 2024) stretches CLIP's text positions from 77 to 248. Its encode_text adds
# ``positional_embedding`` to the first 20 tokens and ``positional_embedding_res`` to the others (two masks made in
# its __init__, never saved): one position table, which CLIP's text tower takes as it is, so the two are joined on
# reading. Adding the masked-out table's zeros changes no bit, so the join is exact.
LONG_CLIP_FORMAT = "long-clip"
LONG_CLIP_RESIDUAL_KEY = "positional_embedding_res"
LONG_CLIP_KEPT_POSITIONS = 20


@dataclass
class LoadedCheckpoint:
    state_dict: dict[str, torch.Tensor]  # CLIP layout
    source_format: str  # "openai-torchscript" | "state-dict" | "safetensors" | "open_clip-training"
    #                     | "sdqes-lightning" | "sdqes-edge-training" | "transformers-clip" | "long-clip"
    sha256: str
    dropped_keys: list[str]  # training-only keys outside the model (Lightning heads, logit_scale...)
    training_record: dict | None = None  # what `sdqes-edge train` recorded in its checkpoints (train_options)


class _Opaque(dict):
    """Stand-in for a class a checkpoint names but we will not import: it records, never runs code."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()
        self.args, self.kwargs, self.items_appended = args, kwargs, []

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def append(self, item: Any) -> None:
        self.items_appended.append(item)

    def extend(self, items: Any) -> None:
        self.items_appended.extend(items)


def is_torchscript(path: str | os.PathLike) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("constants.pkl") or "/code/" in name for name in archive.namelist())


# The safetensors format: an 8-byte little-endian length, that many bytes of JSON header (at most 100 MB, the
# format's own cap), then the tensors' bytes.
SAFETENSORS_LENGTH = struct.Struct("<Q")
SAFETENSORS_HEADER_LIMIT = 100_000_000


def is_safetensors(path: str | os.PathLike) -> bool:
    """True where the file starts as a safetensors file does (its suffix aside: hub files are renamed)."""
    with open(path, "rb") as fh:
        head = fh.read(SAFETENSORS_LENGTH.size + 1)
    if len(head) <= SAFETENSORS_LENGTH.size:
        return False
    (length,) = SAFETENSORS_LENGTH.unpack(head[: SAFETENSORS_LENGTH.size])
    fits = 0 < length <= min(SAFETENSORS_HEADER_LIMIT, os.path.getsize(path) - SAFETENSORS_LENGTH.size)
    return fits and head[SAFETENSORS_LENGTH.size:] == b"{"


def _read_safetensors(path: str) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise UserError(f"{path} is a safetensors file, which needs the safetensors package: "
                        f"{install_command('safetensors')}") from None
    try:
        return load_file(path, device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise UserError(f"cannot read safetensors file {path} ({first_line(exc)}); is the file complete?") from None


def _safe_load(path: str) -> Any:
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # an old (non-zip) pickle: the loader below reports what it meets
        unsafe = []
    placeholders = [(type(name.rsplit(".", 1)[-1], (_Opaque,), {}), name) for name in unsafe]
    try:
        with torch.serialization.safe_globals(placeholders):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(
            f"cannot read checkpoint {path}: {_other_kind(path) or _essential_line(exc)}; expected a file written "
            "by torch.save (a state dict or a Lightning/open_clip checkpoint), an OpenAI CLIP TorchScript archive "
            "or a safetensors file"
        ) from None


def _other_kind(path: str | os.PathLike) -> str | None:
    """What a file given as a checkpoint is instead, where that is plain: torch's own words for a NumPy archive
    ("[enforce fail at inline_container.cc:180]") or a CSV ("pop from empty list") told nobody."""
    if str(path).lower().endswith(".onnx"):
        return "it is an ONNX graph (what an export writes, never read back), not a checkpoint"
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
            if names and all(name.endswith(".npy") for name in names):
                return "it is a NumPy .npz archive (a state snapshot or a score trace?), not a checkpoint"
            return None
        with open(path, "rb") as fh:
            head = fh.read(4096)
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # the read may end inside a character
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError):
        return None
    if b"\0" in head:  # control bytes are UTF-8 too; a NUL marks a binary file (as git and grep tell)
        return None
    if head.lstrip().startswith(b"{"):  # config.json or open_clip_config.json, beside the weights
        holds = _weights_named(os.path.dirname(os.path.abspath(path)))
        return f"it is a JSON file (a model config?), not the weights{'; the folder ' + holds if holds else ''}"
    return "it is a text file, not a checkpoint" if head else "it is empty"


def _essential_line(exc: Exception) -> str:
    """The line of torch's long multi-paragraph load error that says what was wrong."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if "GLOBAL" in line or "blocked" in line:
            return line.replace("Trying to load unsupported", "it refers to the code").rstrip(".") + \
                " (loading it could run arbitrary code, so it is refused)"
    # Skip torch's generic advice about weights_only; what remains names the actual fault, in its first sentence
    # (the rest is miniz's advice). Pickle's KeyError names only an opcode byte ('101'), which tells no one anything.
    specific = [line for line in lines if "weights_only" not in line and "documentation" not in line]
    fault = specific[0].split(". ")[0].rstrip(".") if specific and not isinstance(exc, KeyError) else ""
    detail = f" ({fault})" if fault else ""
    return f"not a readable torch checkpoint{detail}; is the file truncated or corrupt?"


def _weights_named(folder: str) -> str:
    """"holds model.safetensors, ..." for the weights files in a folder ("" when none)."""
    try:
        inside = sorted(name for name in os.listdir(folder) if name.endswith(CHECKPOINT_SUFFIXES))
    except OSError:
        return ""
    return f"holds {', '.join(inside[:4])}{' ...' if len(inside) > 4 else ''}" if inside else ""


def read_checkpoint(path: str | os.PathLike) -> LoadedCheckpoint:
    """Read any supported checkpoint into CLIP key layout (tensors only)."""
    path = str(as_path(path, "a checkpoint is"))  # a pathlib.Path failed on str methods (no attribute 'endswith')
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            raise UserError(f"checkpoint {path} is a bundle made by `sdqes-edge export`, not a checkpoint; give the "
                            f".pt/.ckpt/.safetensors file it was exported from (`sdqes-edge inspect {path}` "
                            "describes the bundle)")
        if index := _shard_index_in(path):
            raise UserError(f"checkpoint {path} is a folder of sharded weights; pass the index that lists the "
                            f"shards, {index}")
        holds = _weights_named(path)
        raise UserError(f"checkpoint {path} is a folder; pass the .pt/.ckpt/.safetensors file inside it"
                        f"{f' (it {holds})' if holds else ''}")
    if not os.path.isfile(path):
        raise UserError(f"checkpoint not found: {path}; pass the path of a .pt/.ckpt/.safetensors file")
    if path.endswith(SHARD_INDEX_SUFFIX):
        return _plain_state(*_read_shards(path))
    if SHARD_NAME.search(os.path.basename(path)):  # alone it lacks most tensors: "missing visual.proj" told nothing
        index = _shard_index_in(os.path.dirname(os.path.abspath(path)))
        raise UserError(f"{path} is one shard of sharded weights; pass the index that lists them all"
                        f"{f', {index}' if index else ' (model.safetensors.index.json, saved beside the shards)'}")
    sha = file_sha256(path)
    if is_safetensors(path):
        state = _read_safetensors(path)
        prefix = DDP_PREFIX if state and all(k.startswith(DDP_PREFIX) for k in state) else ""
        return _plain_state(state, "safetensors", sha, prefix=prefix)
    if is_torchscript(path):
        try:
            with warnings.catch_warnings():  # torch.jit.load is deprecated, but OpenAI ships TorchScript archives
                warnings.simplefilter("ignore", DeprecationWarning)
                state = dict(torch.jit.load(path, map_location="cpu").state_dict())
        except Exception as exc:
            raise UserError(f"cannot read TorchScript archive {path}: {exc}; is the file complete?") from None
        return _normalize(state, "openai-torchscript", sha)
    obj = _safe_load(path)
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        state = obj["state_dict"]
        if CHECKPOINT_RECORD_KEY in obj:  # written by `sdqes-edge train`, in CLIP layout
            loaded = _normalize(state, "sdqes-edge-training", sha)
            record = obj[CHECKPOINT_RECORD_KEY]
            loaded.training_record = record if isinstance(record, dict) else None
            return loaded
        if any(k.startswith(LIGHTNING_PREFIX) for k in state):
            return _normalize(state, "sdqes-lightning", sha, prefix=LIGHTNING_PREFIX)
        if all(k.startswith(DDP_PREFIX) for k in state):
            return _normalize(state, "open_clip-training", sha, prefix=DDP_PREFIX)
        return _normalize(state, "open_clip-training", sha)
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return _plain_state(obj, "state-dict", sha)
    raise UserError(
        f"{path} holds no model weights (found {type(obj).__name__}); expected a state dict, "
        "a checkpoint with a 'state_dict' entry, an OpenAI CLIP TorchScript archive or a safetensors file"
    )


def _shard_index_in(folder: str) -> str | None:
    """The path of the one shard index in ``folder`` (None when there is none, or several)."""
    try:
        found = [name for name in os.listdir(folder) if name.endswith(SHARD_INDEX_SUFFIX)]
    except OSError:
        return None
    return os.path.join(folder, found[0]) if len(found) == 1 else None


def _read_shards(index_path: str) -> tuple[dict[str, torch.Tensor], str, str]:
    """Every shard an index lists, merged -> (state dict, format, sha256 of the index and of each shard in turn).
    A shard is a file beside the index, by its plain name: nothing else is read."""
    try:
        weight_map = parse_json(Path(index_path).read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"cannot read the shard index {index_path}: expected JSON with a 'weight_map' from each "
                        "tensor to its shard, as save_pretrained writes it; download it again") from None
    folder, digest, state, formats = os.path.dirname(os.path.abspath(index_path)), hashlib.sha256(), {}, set()
    digest.update(Path(index_path).read_bytes())
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(folder, shard)
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            raise UserError(f"the shard index {index_path} names {shard!r}, which is not a file beside it; shards "
                            "are read from the index's folder only")
        if not os.path.isfile(path):
            raise UserError(f"shard {shard}, listed in {index_path}, is missing; download every file the index lists")
        safetensors = is_safetensors(path)
        part = _read_safetensors(path) if safetensors else _safe_load(path)
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise UserError(f"shard {path} holds no plain tensors (found {type(part).__name__}); download it again")
        formats.add("safetensors" if safetensors else "state-dict")
        digest.update(file_sha256(path).encode())
        state.update(part)
    if absent := sorted(set(weight_map) - set(state)):
        raise UserError(f"{index_path} lists {len(absent)} tensor(s) that its shards lack ({absent[0]} first); a "
                        "shard is incomplete or from another save: download the shards again")
    return state, "safetensors" if formats == {"safetensors"} else "state-dict", digest.hexdigest()


def _plain_state(state: dict, fmt: str, sha: str, prefix: str = "") -> LoadedCheckpoint:
    """A bare state dict: CLIP's layout as it is, or transformers' renamed into it."""
    if not is_transformers_layout(state):
        return _normalize(state, fmt, sha, prefix=prefix)
    clip, dropped = to_clip_layout(state)
    loaded = _normalize(clip, TRANSFORMERS_FORMAT, sha)
    loaded.dropped_keys += dropped
    return loaded


def _normalize(state: dict, fmt: str, sha: str, prefix: str = "") -> LoadedCheckpoint:
    kept, dropped = {}, []
    for key, value in state.items():
        if prefix and not key.startswith(prefix):
            dropped.append(key)  # e.g. a Lightning module's heads beside the backbone
            continue
        key = key[len(prefix):]
        if key in IGNORED_KEYS or key.endswith(IGNORED_SUFFIXES) or not isinstance(value, torch.Tensor):
            dropped.append(key)
            continue
        kept[key] = value.float()  # OpenAI ships fp16 weights; the model is defined in fp32
    if LONG_CLIP_RESIDUAL_KEY in kept:
        kept["positional_embedding"], fmt = _long_clip_positions(kept), LONG_CLIP_FORMAT
    return LoadedCheckpoint(kept, fmt, sha, dropped)


def _long_clip_positions(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """Long-CLIP's two text position tables as the one its encode_text adds (``LONG_CLIP_RESIDUAL_KEY``)."""
    kept, stretched = state.get("positional_embedding"), state.pop(LONG_CLIP_RESIDUAL_KEY)
    if kept is None or kept.shape != stretched.shape or kept.shape[0] <= LONG_CLIP_KEPT_POSITIONS:
        raise UserError(f"a Long-CLIP checkpoint has positional_embedding and {LONG_CLIP_RESIDUAL_KEY} of one shape, "
                        f"over {LONG_CLIP_KEPT_POSITIONS} positions; this one has "
                        f"{None if kept is None else tuple(kept.shape)} and {tuple(stretched.shape)}: is it complete?")
    return torch.cat([kept[:LONG_CLIP_KEPT_POSITIONS], stretched[LONG_CLIP_KEPT_POSITIONS:]])


