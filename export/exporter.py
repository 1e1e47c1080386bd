"""From a model to a verified deployment bundle: the ``sdqes-edge export`` job as a Python API.

Everything is written into a staging directory beside the target and moved
into place only after every graph has been checked and verified, so a failed
export never touches an existing bundle.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from sdqes_edge.checkpoints import refuse_non_finite_weights
from sdqes_edge.config import ModelConfig
from sdqes_edge.contract import (
    BUNDLE_FORMAT,
    BUNDLE_FORMAT_VERSION,
    FP16,
    INT8,
    MANIFEST_NAME,
    QUERIES_NAME,
    QUERY_EMBEDDINGS_NAME,
    REFERENCE_PRECISION,
    STATE_DTYPES,
    TEXT_GRAPH_NAME,
    TOKEN_INPUT,
    TOKENIZER_FOLDER,
    TRAINING_RECORD_NAME,
    step_graph_name,
)
from sdqes_edge.errors import WARNING_PREFIX, UserError
from sdqes_edge.files import file_sha256, staged_directory
from sdqes_edge.model import SDQESModel
from sdqes_edge.package_builds import load_onnxruntime
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.ort_sessions import session_options
from sdqes_edge.runtime.output_locks import BUNDLE, hold_folder, release
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.sample import (
    EXAMPLE_QUERIES,
    preprocessed_streams,
    sample_streams,
)
from sdqes_edge.tokenizer import default_tokenizer, vocab_path

from . import graphs
from .bundle_complexity import kernels_in_form, manifest_complexity
from .drift import VariantDriftError, VariantReport, VerificationError, compare_variant, max_abs_error, run_stream
from .options import ExportOptions, Query, check_options, check_target, left_behind
from .precision import (
    AUTO_FLOAT_BLOCKS,
    BACKBONE_POLICY,
    MAX_AUTO_FLOAT_BLOCKS,
    QuantizationPolicyError,
    quantize_int8,
)
from .verify import StepVerification, verify_step_graph


@dataclass
class ExportResult:
    out: Path
    manifest: dict[str, Any]
    verification: StepVerification
    variants: list[VariantReport] = field(default_factory=list)
    seconds: float = 0.0


def _frames(model_cfg: ModelConfig, count: int, batch: int, video: Path | None = None,
            progress: str | None = None) -> np.ndarray:
    """[count, batch, 3, R, R]: ``batch`` staggered streams (``sample.staggered_streams``) of the built-in sample
    or of ``video``; ``progress``: a progress bar's title while they are made or read."""
    pre = Preprocessor.from_config(model_cfg)
    if video is None:
        return sample_streams(pre, count, batch, pre.image_size, progress=progress)
    from sdqes_edge.runtime.sources import frames_spread_over

    def read(needed: int):
        frames = frames_spread_over(video, needed)
        first = next(frames, None)
        if first is None:
            raise UserError(f"--calibration-video {video} gave no frame; check it plays, or re-encode it")
        return itertools.chain([first], frames)

    return preprocessed_streams(read, pre, count, batch, pre.image_size, source=str(video), progress=progress)


def _encode_queries(text_graph: Path, texts: Sequence[str], truncate: bool,
                    context_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(token ids [Q, context_length], embeddings [Q, E] from the exported text graph)."""
    ort = load_onnxruntime()
    ids = default_tokenizer(context_length).tokenize(list(texts), on_overflow="truncate" if truncate else "error")
    session = ort.InferenceSession(str(text_graph), session_options(), providers=["CPUExecutionProvider"])
    return ids, session.run(None, {TOKEN_INPUT: ids})[0]


def export_bundle(model: SDQESModel, out: str | Path, options: ExportOptions | None = None, *,
                  checkpoint: dict[str, Any] | None = None, training_record: dict[str, Any] | None = None,
                  random_weights: dict[str, Any] | None = None, log: Callable[[str], None] = print) -> ExportResult:
    """Export, verify and write a bundle to ``out``; returns what was written and measured.

    ``checkpoint`` (path, sha256, source_format) is recorded in the manifest and the graph metadata;
    ``training_record`` (what `sdqes-edge train` recorded in it) is written beside them, listed with the bundle's
    files, so that the runtime can say what the model was trained on. ``random_weights`` ({"preset", "seed"}): the
    model is a preset's, its weights drawn at random (to measure), and the runtime says its alerts mean nothing.
    """
    started = time.perf_counter()
    if not isinstance(model, SDQESModel):  # a state dict or a checkpoint's path failed on a missing attribute
        raise UserError(f"export_bundle takes an SDQESModel, not a {type(model).__name__}; from a checkpoint: "
                        "model, _ = sdqes_edge.checkpoints.load_model(path)")
    refuse_non_finite_weights(model.state_dict(), "the model",
                              "did its training diverge? Export it from before its weights turned NaN")
    out = Path(out)
    options = check_options(options or ExportOptions(), lambda m: log(f"{WARNING_PREFIX}{m}"),
                            model.cfg.text.context_length)
    check_target(out)
    for dropped in left_behind(out):
        log(f"{WARNING_PREFIX}{dropped}")
    cfg: ModelConfig = model.cfg
    was_training = model.training  # a model exported between training steps goes back to training
    # One export into a folder at a time: of two at once, each said it wrote the bundle, and the one that ended last
    # replaced the other's without a word.
    lock = hold_folder(out, "--out", BUNDLE)
    try:
        model.eval()
        with staged_directory(out) as staging:
            if training_record is not None:
                (staging / TRAINING_RECORD_NAME).write_text(json.dumps(training_record, indent=2, allow_nan=False))
            provenance = {"checkpoint": checkpoint} | ({"random_weights": random_weights} if random_weights else {})
            result = _export_into(model, cfg, staging, out, options, provenance, log)
    finally:
        release(lock)
        model.train(was_training)
    result.seconds = time.perf_counter() - started
    return result


@dataclass
class _Traced:
    """The fp32 step graph and the text graph in the staging folder, with their descriptions."""
    step: Path
    description: dict[str, Any]
    text: Path
    text_description: dict[str, Any]


def _export_into(model: SDQESModel, cfg: ModelConfig, staging: Path, out: Path, options: ExportOptions,
                 provenance: dict[str, Any], log: Callable[[str], None]) -> ExportResult:
    sha = (provenance["checkpoint"] or {}).get("sha256")
    traced = _trace(model, staging, options, sha, log)
    # Queries: the user's (pre-encoded into the bundle), else the built-in examples (only to count alert changes).
    queries = options.queries or tuple(Query(t, r) for t, r in EXAMPLE_QUERIES)
    token_ids, query_embeddings = _encode_queries(traced.text, [q.text for q in queries], options.truncate_queries,
                                                  cfg.text.context_length)
    fused = query_embeddings if options.fuse_queries else None
    fp32, verification = _verify_fp32(model, traced.step, token_ids, query_embeddings, fused, options, log)
    step_entries = {REFERENCE_PRECISION: {"file": traced.step.name, "inputs": traced.description["inputs"],
                                          "outputs": traced.description["outputs"],
                                          "state_dtype": STATE_DTYPES[REFERENCE_PRECISION],
                                          "operators": traced.description["operators"],
                                          "verification": verification.to_dict()}}
    reduced = [p for p in options.precisions if p != REFERENCE_PRECISION]
    variants = _add_variants(model, cfg, reduced, step_entries, staging, traced, options, sha, fp32, fused,
                             query_embeddings, log)
    _write_tokenizer(staging)
    queries_entry = _write_queries(staging, options.queries, query_embeddings)
    # Of the plain graph's arithmetic, whatever form the fp32 graph is written in below.
    complexity = manifest_complexity(model, traced.step, traced.text, options, log)
    if options.fp32_operators != traced.description["operators"]:  # after int8, which is quantized from it
        verification = _fp32_in_form(model, traced, token_ids, query_embeddings, fused, options, sha, log)
        step_entries[REFERENCE_PRECISION] |= {"operators": options.fp32_operators,
                                              "verification": verification.to_dict()}
        # The kernels of the graph the bundle holds, not of the plain one it replaced (the MACs are the same).
        complexity["kernels"] = kernels_in_form(model, traced.step, options)
    manifest = _manifest(cfg, options, traced, step_entries, queries_entry, provenance, complexity, staging)
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False))
    return ExportResult(out, manifest, verification, variants)


def _add_variants(model: SDQESModel | None, cfg: ModelConfig, precisions: list[str], step_entries: dict,
                  staging: Path, traced: _Traced, options: ExportOptions, sha: str | None, fp32: OnnxRuntimeStep,
                  fused: np.ndarray | None, query_embeddings: np.ndarray,
                  log: Callable[[str], None]) -> list[VariantReport]:
    """Make each reduced-precision graph in ``staging``, check its drift against the fp32 graph and add its
    manifest entry to ``step_entries``; the drift reports. ``model`` is needed only to trace fp16."""
    if not precisions:
        return []
    # Drift is measured on the deployment's own frames when the user gives them: a reduced precision is
    # judged on the stream it will see (a recurrent state can leave its calibrated range on other footage).
    drift_source = "built-in sample" if options.calibration_video is None else options.calibration_video.name
    log(f"measuring drift against fp32 over {options.drift_frames} frames of the {drift_source} ...")
    drift_frames = _frames(cfg, options.drift_frames, options.batch, options.calibration_video,
                           progress="drift frames" if options.show_progress else None)
    reference = run_stream(fp32, drift_frames, "fp32 stream", options.show_progress, fused)
    reports = []
    for precision in precisions:
        path, quantization, report = _checked_variant(model, cfg, precision, staging, traced, options, sha, fused,
                                                      drift_frames, reference, query_embeddings, log)
        reports.append(report)
        step_entries[precision] = {"file": path.name, "inputs": traced.description["inputs"],
                                   "outputs": traced.description["outputs"],
                                   "state_dtype": STATE_DTYPES[precision],
                                   "operators": (options.fp16_operators if precision == FP16
                                                 else traced.description["operators"]),  # int8: fp32's
                                   "verification": dict(report.to_dict(), frames_from=drift_source)}
        if quantization is not None:
            step_entries[precision]["quantization"] = quantization.to_dict()
    return reports


def _trace(model: SDQESModel, staging: Path, options: ExportOptions, sha: str | None,
           log: Callable[[str], None]) -> _Traced:
    log(f"tracing the step graph (batch {options.batch}, opset {options.opset}) ...")
    step_path = staging / step_graph_name(REFERENCE_PRECISION)
    description = graphs.export_step_graph(model, step_path, batch=options.batch, opset=options.opset,
                                           precision=REFERENCE_PRECISION, query_count=_query_count(options),
                                           fps=options.fps, checkpoint_sha256=sha)
    graphs.check_graph(step_path)
    log("tracing the text encoder ...")
    text_path = staging / TEXT_GRAPH_NAME
    text_description = graphs.export_text_graph(model, text_path, opset=options.opset)
    graphs.check_graph(text_path)
    return _Traced(step_path, description, text_path, text_description)


def _query_count(options: ExportOptions) -> int | None:
    """Queries fused into the step graph (a fixed count), or None when the runtime scores them."""
    return len(options.queries) if options.fuse_queries else None


def _verify_fp32(model: SDQESModel, step_path: Path, token_ids: np.ndarray, query_embeddings: np.ndarray,
                 fused: np.ndarray | None, options: ExportOptions,
                 log: Callable[[str], None]) -> tuple[OnnxRuntimeStep, StepVerification]:
    """The fp32 step graph against PyTorch (window and step form) with the state carried, and the text graph."""
    log(f"verifying fp32 against PyTorch over {options.verify_frames} frames ...")
    fp32 = OnnxRuntimeStep(step_path)
    frames = _frames(model.cfg, options.verify_frames, options.batch)
    verification = verify_step_graph(model, fp32, frames, query_embeddings=fused, show_progress=options.show_progress)
    with torch.no_grad():
        reference = model.encode_text(torch.from_numpy(token_ids)).numpy()
    verification.text_max_error = max_abs_error(query_embeddings, reference)
    if not verification.passed:
        raise VerificationError(f"the exported graph does not match the model: {verification.summary()}; "
                                "nothing was written (please report this with the command you ran)")
    log("  " + verification.summary())
    return fp32, verification


def _fp32_in_form(model: SDQESModel, traced: _Traced, token_ids: np.ndarray, query_embeddings: np.ndarray,
                  fused: np.ndarray | None, options: ExportOptions, sha: str | None,
                  log: Callable[[str], None]) -> StepVerification:
    """Trace the fp32 graph again with ``options.fp32_operators``, verify it against PyTorch as the plain one was,
    and put it in the plain one's place (which verified every other precision); its verification."""
    log(f"tracing the fp32 step graph with --fp32-operators {options.fp32_operators} ...")
    path = traced.step.with_name(f"{traced.step.stem}.{options.fp32_operators}.onnx")
    graphs.export_step_graph(model, path, batch=options.batch, opset=options.opset, precision=REFERENCE_PRECISION,
                             query_count=_query_count(options), fps=options.fps, checkpoint_sha256=sha,
                             operators=options.fp32_operators)
    graphs.check_graph(path)
    _, verification = _verify_fp32(model, path, token_ids, query_embeddings, fused, options, log)
    path.replace(traced.step)
    return verification


def _float_block_tries(cfg: ModelConfig, precision: str, options: ExportOptions) -> list[int]:
    """How many leading tower blocks to keep float, in the order to try them: one count when given (or when
    nothing is quantized by blocks), else from 0 up to MAX_AUTO_FLOAT_BLOCKS (below the tower's depth)."""
    if precision != INT8 or options.int8_policy != BACKBONE_POLICY:
        return [0]
    if options.int8_float_blocks != AUTO_FLOAT_BLOCKS:
        return [int(options.int8_float_blocks)]
    return list(range(min(MAX_AUTO_FLOAT_BLOCKS, cfg.vision.layers - 1) + 1))


def _checked_variant(model: SDQESModel | None, cfg: ModelConfig, precision: str, staging: Path, traced: _Traced,
                     options: ExportOptions, sha: str | None, fused: np.ndarray | None, drift_frames: np.ndarray,
                     reference, query_embeddings: np.ndarray, log: Callable[[str], None]):
    """(path, quantization or None, drift report) of the first variant that passes the drift check: under
    --int8-float-blocks auto, each failed int8 graph is made again with one more leading block float."""
    tries = _float_block_tries(cfg, precision, options)
    # Read and preprocessed once, whatever the number of tries.
    calibration = (_frames(cfg, options.calibration_frames, options.batch, options.calibration_video,
                           progress="calibration frames" if options.show_progress else None)
                   if precision == INT8 else None)
    for float_blocks in tries:
        path, quantization = _make_variant(model, precision, staging, traced, options, sha, fused, log,
                                           calibration, float_blocks)
        stream = run_stream(OnnxRuntimeStep(path), drift_frames, f"{precision} stream", options.show_progress, fused)
        report = compare_variant(precision, reference, stream, query_embeddings, options.threshold)
        log("  " + report.summary())
        if report.passed:
            return path, quantization, report
        if float_blocks != tries[-1]:
            log(f"  beyond tolerance {report.tolerance}; quantizing again with {float_blocks + 1} leading "
                "block(s) float")
    kept = f" with up to {tries[-1]} leading block(s) float" if len(tries) > 1 else ""
    raise VariantDriftError(precision,
                            f"the {precision} graph drifts beyond its tolerance {report.tolerance}{kept}: "
                            f"{report.summary()}; nothing was written (export without --precision {precision})")


def _make_variant(model: SDQESModel | None, precision: str, staging: Path, traced: _Traced, options: ExportOptions,
                  sha: str | None, fused: np.ndarray | None, log: Callable[[str], None],
                  calibration: np.ndarray | None = None, float_blocks: int = 0):
    """(path, quantization or None): the fp16 graph traced again at fp16, or the int8 graph quantized from fp32
    on ``calibration`` frames."""
    path = staging / step_graph_name(precision)
    quantization = None
    if precision == FP16:
        log("tracing the fp16 step graph ...")
        graphs.export_step_graph(model, path, batch=options.batch, opset=options.opset, precision=FP16,
                                 query_count=_query_count(options), fps=options.fps, checkpoint_sha256=sha,
                                 operators=options.fp16_operators)
    else:
        source = "the built-in sample" if options.calibration_video is None else options.calibration_video
        log(f"quantizing to int8 (QDQ, {options.int8_policy} policy), calibrated on "
            f"{options.calibration_frames} frames of {source} ...")
        try:
            quantization = quantize_int8(traced.step, path, calibration, fused, policy=options.int8_policy,
                                         method=options.calibration_method, activations=options.int8_activations,
                                         float_blocks=float_blocks)
        except QuantizationPolicyError as exc:
            raise UserError(f"int8: {exc}") from exc
        log("  " + quantization.summary())
        graphs.attach_metadata(path, dict(traced.description, precision=INT8, quantization=quantization.to_dict()))
    graphs.check_graph(path)
    return path, quantization


def _write_tokenizer(staging: Path) -> None:
    tokenizer_dir = staging / TOKENIZER_FOLDER
    tokenizer_dir.mkdir()
    shutil.copy2(vocab_path(), tokenizer_dir / vocab_path().name)
    licence = vocab_path().parent / "LICENSE-clip-bpe-vocab.txt"
    if licence.is_file():
        shutil.copy2(licence, tokenizer_dir / licence.name)


def _write_queries(staging: Path, queries: tuple[Query, ...], embeddings: np.ndarray) -> dict[str, Any] | None:
    """The user's queries with their alert messages and embeddings [Q, E]; the manifest entry (None: no queries)."""
    if not queries:
        return None
    items = [{"text": q.text, "response": q.response, **({"label": q.label} if q.label else {}),
              **({"threshold": float(q.threshold)} if q.threshold is not None else {})} for q in queries]
    (staging / QUERIES_NAME).write_text(json.dumps(items, indent=2))
    np.save(staging / QUERY_EMBEDDINGS_NAME, embeddings.astype(np.float32))
    return {"file": QUERIES_NAME, "embeddings": QUERY_EMBEDDINGS_NAME, "count": len(queries)}


def _manifest(cfg: ModelConfig, options: ExportOptions, traced: _Traced, step_entries: dict,
              queries_entry: dict | None, provenance: dict, complexity: dict, staging: Path) -> dict:
    """The manifest (``bundle_manifest.schema.json``), with the sha256 of every file already in ``staging``;
    ``provenance``: its "checkpoint" entry, and "random_weights" where the weights are a preset's random ones."""
    description = traced.description
    return {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_FORMAT_VERSION,
        "model": cfg.to_dict(),
        "preprocess": description["preprocess"],
        "image_size": cfg.vision.image_size,
        "embed_dim": cfg.embed_dim,
        "batch": options.batch,
        "fps": options.fps,
        "opset": options.opset,
        "query_count": _query_count(options),
        "state": description["state"],
        "state_bytes": description["state_bytes"],
        "receptive_field": description["receptive_field"],
        "graphs": {"step": step_entries,
                   "text": {"file": traced.text.name, "inputs": traced.text_description["inputs"],
                            "outputs": traced.text_description["outputs"]}},
        "tokenizer": {"file": f"{TOKENIZER_FOLDER}/{vocab_path().name}", "context_length": cfg.text.context_length},
        "queries": queries_entry,
        "thresholds": {"default": options.threshold},
        **provenance,
        "complexity": complexity,
        "tool_versions": description["tool_versions"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": _file_list(staging),
    }


def _file_list(staging: Path) -> dict[str, dict]:
    """The manifest's ``files``: the sha256 and size of every file in ``staging`` but the manifest."""
    return {path.relative_to(staging).as_posix(): {"sha256": file_sha256(path), "bytes": path.stat().st_size}
            for path in sorted(p for p in staging.rglob("*") if p.is_file())
            if path.relative_to(staging).as_posix() != MANIFEST_NAME}
