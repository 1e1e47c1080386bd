"""A bundle's int8 step graph made again from its own fp32 graph, without the checkpoint.

For bundles whose int8 graph an earlier version made (8-bit weights, which ONNX Runtime's x86 kernels without
VNNI saturate: ``precision.INT8_WEIGHT_BITS``). The quantizer, the drift check and the manifest entry are the
export's own; every other file of the bundle is kept as it is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from sdqes_edge.config import ModelConfig
from sdqes_edge.contract import ENGINES_FOLDER, INT8, MANIFEST_NAME, REFERENCE_PRECISION, engine_name
from sdqes_edge.errors import WARNING_PREFIX
from sdqes_edge.files import staged_directory
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.output_locks import BUNDLE, hold_folder, release
from sdqes_edge.sample import EXAMPLE_QUERIES

from . import graphs
from .drift import VariantReport
from .exporter import _add_variants, _encode_queries, _file_list, _Traced
from .options import ExportOptions, Query, check_options, check_target


def requantize_int8(bundle_dir: str | Path, out: str | Path, options: ExportOptions | None = None, *,
                    log: Callable[[str], None] = print) -> VariantReport:
    """Make a bundle's int8 step graph again from its own fp32 graph, with this version's quantizer and the
    export's drift check, into ``out`` (which may be the bundle itself); every other file is kept as it is.

    For a bundle whose int8 graph an earlier version made (8-bit weights, which saturate on CPUs without VNNI)
    when its checkpoint is not at hand. ``options`` gives the int8 and drift settings; the batch, the fused
    queries and the threshold are the bundle's. Nothing is written unless the new graph passes. ``out`` is held
    throughout (runtime/output_locks.py), as an export holds its bundle: one program at a time replaces a bundle.
    """
    lock = hold_folder(out, "--out", BUNDLE)
    try:
        return _requantize_into(bundle_dir, Path(out), options, log)
    finally:
        release(lock)


def _requantize_into(bundle_dir: str | Path, out: Path, options: ExportOptions | None,
                     log: Callable[[str], None]) -> VariantReport:
    from sdqes_edge.runtime.bundle import load_bundle

    bundle = load_bundle(bundle_dir)  # its hashes checked: the fp32 graph quantized is the one it shipped
    manifest = bundle.manifest
    cfg = ModelConfig.from_dict(manifest["model"])
    pre_encoded = bundle.queries()
    queries = tuple(Query(q["text"], q.get("response", ""), q.get("label"), q.get("threshold"))
                    for q in pre_encoded[0]) if pre_encoded else ()
    options = check_options(dataclasses.replace(
        options or ExportOptions(), precisions=(REFERENCE_PRECISION, INT8), batch=int(manifest["batch"]),
        threshold=float(manifest["thresholds"]["default"]), queries=queries,
        fuse_queries=manifest.get("query_count") is not None), lambda m: log(f"{WARNING_PREFIX}{m}"),
        cfg.text.context_length)
    if out.resolve() != bundle.root.resolve():  # another folder is replaced whole: never one of the user's
        check_target(out)
    with staged_directory(out) as staging:
        _copy_regular_files(bundle.root, staging, log)
        previous = manifest["graphs"]["step"].pop(INT8, None)
        if previous is not None:
            (staging / previous["file"]).unlink()
        for stale in (staging / ENGINES_FOLDER).glob(f"*/{Path(engine_name(INT8)).stem}.*"):
            log(f"removing {stale.relative_to(staging)}: built from the int8 graph being replaced")
            stale.unlink()
        step = staging / manifest["graphs"]["step"][REFERENCE_PRECISION]["file"]
        text = staging / manifest["graphs"]["text"]["file"]
        traced = _Traced(step, graphs.read_metadata(step), text, graphs.read_metadata(text))
        texts = [q.text for q in queries] or [t for t, _ in EXAMPLE_QUERIES]
        _, query_embeddings = _encode_queries(text, texts, truncate=True, context_length=cfg.text.context_length)
        fused = query_embeddings if options.fuse_queries else None
        [report] = _add_variants(None, cfg, [INT8], manifest["graphs"]["step"], staging, traced, options,
                                 traced.description.get("checkpoint_sha256"), OnnxRuntimeStep(step), fused,
                                 query_embeddings, log)
        manifest["files"] = _file_list(staging)
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return report


def _copy_regular_files(root: Path, staging: Path, log: Callable[[str], None]) -> None:
    """Copy the bundle's files into ``staging``, never through a symbolic link: a bundle is someone else's data,
    and a link in it could lead anywhere."""
    for folder, subfolders, files in os.walk(root):  # does not descend into linked folders
        here = Path(folder)
        target = staging / here.relative_to(root)
        target.mkdir(parents=True, exist_ok=True)
        for name in files + [d for d in subfolders if (here / d).is_symlink()]:
            source = here / name
            if source.is_symlink():
                log(f"not copied: {source.relative_to(root)} is a symbolic link")
            else:
                shutil.copy2(source, target / name)
