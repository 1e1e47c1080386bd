"""From a model to a verified deployment bundle: the ``sdqes-edge export`` job as a Python API.

Everything is written into a staging directory beside the target and moved
into place only after every graph has been checked and verified, so a failed
export never touches an existing bundle.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..config import DEFAULT_FPS, DEFAULT_THRESHOLD, ModelConfig
from ..errors import UserError
from ..files import file_sha256, replace_directory, staging_directory
from ..model import SDQESModel
from ..runtime.bundle import BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, MANIFEST_NAME, PRECISIONS
from ..runtime.onnxruntime_backend import OnnxRuntimeStep
from ..runtime.preprocess import Preprocessor
from ..sample import EXAMPLE_QUERIES, sample_frames
from ..tokenizer import default_tokenizer, vocab_path
from ..tolerances import DRIFT_FRAMES, VERIFY_FRAMES
from . import graphs
from .complexity import GraphComplexity, adapter_count, count_graph, graph_kernels, kernel_summary
from .precision import (CALIBRATION_METHODS, DEFAULT_CALIBRATION_FRAMES, DEFAULT_CALIBRATION_METHOD, DEFAULT_INT8_POLICY,
                        INT8_POLICIES, QuantizationPolicyError, quantize_int8)
from .verify import (StepVerification, VariantReport, VerificationError, compare_variant, max_abs_error, run_stream,
                     verify_step_graph)

MIN_VERIFY_FRAMES = 16


@dataclass(frozen=True)
class Query:
    text: str
    response: str  # the alert message shown when the event starts


@dataclass
class ExportOptions:
    batch: int = 1
    opset: int = graphs.DEFAULT_OPSET
    precisions: tuple[str, ...] = ("fp32",)
    fuse_queries: bool = False  # query_embeddings [Q,E] in, logits [B,Q] out, Q fixed at export
    queries: tuple[Query, ...] = ()  # pre-encoded into the bundle
    fps: float = DEFAULT_FPS
    threshold: float = DEFAULT_THRESHOLD
    verify_frames: int = VERIFY_FRAMES
    drift_frames: int = DRIFT_FRAMES
    calibration_video: Path | None = None
    calibration_frames: int = DEFAULT_CALIBRATION_FRAMES
    int8_policy: str = DEFAULT_INT8_POLICY
    calibration_method: str = DEFAULT_CALIBRATION_METHOD
    truncate_queries: bool = False
    show_progress: bool = True


def check_options(options: ExportOptions, warn: Callable[[str], None]) -> ExportOptions:
    """Refuse impossible options up front; resolve conflicts with a warning. Returns the options to use."""
    problems = []
    if options.batch < 1:
        problems.append(f"--batch must be >= 1, not {options.batch}")
    if options.opset not in graphs.SUPPORTED_OPSETS:
        problems.append(f"--opset must be one of {graphs.SUPPORTED_OPSETS} (17 keeps LayerNormalization one node; "
                        "16 for TensorRT older than 8.6), not {options.opset}".replace("{options.opset}",
                                                                                      str(options.opset)))
    unknown = [p for p in options.precisions if p not in PRECISIONS]
    if unknown:
        problems.append(f"unknown precision {', '.join(unknown)}; choose from {', '.join(PRECISIONS)}")
    if options.fuse_queries and not options.queries:
        problems.append("--fuse-queries fixes the number of queries in the graph: give them with --query or "
                        "--queries-file")
    if options.verify_frames < MIN_VERIFY_FRAMES:
        problems.append(f"--verify-frames must be >= {MIN_VERIFY_FRAMES} so the state is exercised, "
                        f"not {options.verify_frames}")
    if not 0.0 < options.threshold < 1.0:
        problems.append(f"--threshold is a probability sigmoid(cos) in (0, 1), not {options.threshold}")
    if options.fps <= 0:
        problems.append(f"--fps must be positive, not {options.fps}")
    if options.int8_policy not in INT8_POLICIES:
        problems.append(f"unknown --int8-policy {options.int8_policy}; choose from {', '.join(INT8_POLICIES)}")
    if options.calibration_method not in CALIBRATION_METHODS:
        problems.append(f"unknown --calibration-method {options.calibration_method}; choose from "
                        f"{', '.join(CALIBRATION_METHODS)}")
    if options.calibration_frames < 1:
        problems.append(f"--calibration-frames must be >= 1, not {options.calibration_frames}")
    if options.drift_frames < MIN_VERIFY_FRAMES:
        problems.append(f"--drift-frames must be >= {MIN_VERIFY_FRAMES}, not {options.drift_frames}")
    if options.calibration_video is not None and not Path(options.calibration_video).is_file():
        problems.append(f"calibration video {options.calibration_video} does not exist")
    if problems:
        raise UserError("; ".join(problems))
    # The queries as the runtime will take them (one function: empty or too long is refused the same way).
    default_tokenizer().tokenize([q.text for q in options.queries],
                                 on_overflow="truncate" if options.truncate_queries else "error")
    precisions = tuple(p for p in PRECISIONS if p in options.precisions)
    if "fp32" not in precisions:
        warn("fp32 is always exported: it is the reference the other precisions are verified against")
        precisions = ("fp32",) + precisions
    if options.calibration_video is not None and "int8" not in precisions:
        warn("--calibration-video is only used for int8; ignoring it")
    if len(precisions) > 1 and options.drift_frames < DRIFT_FRAMES:
        warn(f"drift is measured over {options.drift_frames} frames; a recurrent state needs {DRIFT_FRAMES} or "
             "more to show drift (and fp16 LayerNorm overflow)")
    int8_flags = (options.int8_policy != DEFAULT_INT8_POLICY or options.calibration_method != DEFAULT_CALIBRATION_METHOD)
    if int8_flags and "int8" not in precisions:
        warn("--int8-policy and --calibration-method are only used for int8; ignoring them")
    return dataclasses.replace(options, precisions=precisions)


@dataclass
class ExportResult:
    out: Path
    manifest: dict[str, Any]
    verification: StepVerification
    variants: list[VariantReport] = field(default_factory=list)
    seconds: float = 0.0


def _frames(model_cfg: ModelConfig, count: int, batch: int, video: Path | None = None) -> np.ndarray:
    """[count, batch, 3, R, R]: stream b starts 3 frames after stream b-1, so the streams differ."""
    pre = Preprocessor.from_config(model_cfg)
    if video is not None:
        from ..runtime.sources import frames_spread_over

        raw = frames_spread_over(video, count + 3 * (batch - 1))
        raw = [raw[i % len(raw)] for i in range(count + 3 * (batch - 1))]
    else:
        raw = sample_frames(count + 3 * (batch - 1))
    processed = pre.batch(raw)
    return np.stack([processed[3 * b : 3 * b + count] for b in range(batch)], axis=1)


def _backbone_counts(model: SDQESModel, batch: int, opset: int) -> tuple[GraphComplexity, dict]:
    """The same image tower without adapters, counted the same way (adapters = total - this):
    its complexity and the kernels its step executes."""
    cfg = model.cfg.with_adapter("none")
    backbone = SDQESModel(cfg).eval()
    weights = {k: v for k, v in model.state_dict().items() if ".adapter" not in k}
    backbone.load_state_dict(weights, strict=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "backbone.onnx"
        graphs.export_step_graph(backbone, path, batch=batch, opset=opset)
        return count_graph(path), graph_kernels(path)


def _encode_queries(text_graph: Path, texts: Sequence[str], truncate: bool) -> tuple[np.ndarray, np.ndarray]:
    """(token ids [Q, 77], embeddings [Q, E] from the exported text graph)."""
    import onnxruntime as ort

    ids = default_tokenizer().tokenize(list(texts), on_overflow="truncate" if truncate else "error")
    session = ort.InferenceSession(str(text_graph), providers=["CPUExecutionProvider"])
    return ids, session.run(None, {graphs.TOKEN_INPUT: ids})[0]


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory path for the bundle")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
        raise UserError(f"--out {out} is a non-empty directory that is not a bundle; choose a new path "
                        "(export only replaces an earlier bundle)")


def export_bundle(model: SDQESModel, out: str | Path, options: ExportOptions | None = None, *,
                  checkpoint: dict[str, Any] | None = None, log: Callable[[str], None] = print) -> ExportResult:
    """Export, verify and write a bundle to ``out``; returns what was written and measured.

    ``checkpoint`` (path, sha256, source_format) is recorded in the manifest and the graph metadata.
    """
    started = time.perf_counter()
    out = Path(out)
    options = check_options(options or ExportOptions(), lambda m: log(f"warning: {m}"))
    _check_target(out)
    model = model.eval()
    cfg: ModelConfig = model.cfg
    staging = staging_directory(out)
    try:
        result = _export_into(model, cfg, staging, out, options, checkpoint, log)
        replace_directory(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result.seconds = time.perf_counter() - started
    return result


def _export_into(model: SDQESModel, cfg: ModelConfig, staging: Path, out: Path, options: ExportOptions,
                 checkpoint: dict[str, Any] | None, log: Callable[[str], None]) -> ExportResult:
    sha = checkpoint.get("sha256") if checkpoint else None
    query_count = len(options.queries) if options.fuse_queries else None
    step_entries: dict[str, dict[str, Any]] = {}

    log(f"tracing the step graph (batch {options.batch}, opset {options.opset}) ...")
    fp32_path = staging / "step.fp32.onnx"
    description = graphs.export_step_graph(model, fp32_path, batch=options.batch, opset=options.opset,
                                           precision="fp32", query_count=query_count, fps=options.fps,
                                           checkpoint_sha256=sha)
    graphs.check_graph(fp32_path)
    log("tracing the text encoder ...")
    text_path = staging / "text.onnx"
    text_description = graphs.export_text_graph(model, text_path, opset=options.opset)
    graphs.check_graph(text_path)

    # Queries: the user's (pre-encoded into the bundle), else the built-in examples (only to count alert changes).
    queries = options.queries or tuple(Query(t, r) for t, r in EXAMPLE_QUERIES)
    token_ids, query_embeddings = _encode_queries(text_path, [q.text for q in queries], options.truncate_queries)
    fused = query_embeddings if options.fuse_queries else None

    log(f"verifying fp32 against PyTorch over {options.verify_frames} frames ...")
    fp32 = OnnxRuntimeStep(fp32_path)
    frames = _frames(cfg, options.verify_frames, options.batch)
    verification = verify_step_graph(model, fp32, frames, query_embeddings=fused, show_progress=options.show_progress)
    with torch.no_grad():
        reference = model.encode_text(torch.from_numpy(token_ids)).numpy()
    verification.text_max_error = max_abs_error(query_embeddings, reference)
    if not verification.passed:
        raise VerificationError(f"the exported graph does not match the model: {verification.summary()}; "
                                "nothing was written (please report this with the command you ran)")
    log("  " + verification.summary())
    step_entries["fp32"] = {"file": fp32_path.name, "inputs": description["inputs"],
                            "outputs": description["outputs"], "verification": verification.to_dict()}

    variants: list[VariantReport] = []
    reduced = [p for p in options.precisions if p != "fp32"]
    if reduced:
        # Drift is measured on the deployment's own frames when the user gives them: a reduced precision is
        # judged on the stream it will see (a recurrent state can leave its calibrated range on other footage).
        drift_frames = _frames(cfg, options.drift_frames, options.batch, options.calibration_video)
        reference = run_stream(fp32, drift_frames, "fp32 stream", options.show_progress, fused)
        for precision in reduced:
            path = staging / f"step.{precision}.onnx"
            if precision == "fp16":
                log("tracing the fp16 step graph ...")
                graphs.export_step_graph(model, path, batch=options.batch, opset=options.opset, precision="fp16",
                                         query_count=query_count, fps=options.fps, checkpoint_sha256=sha)
            else:
                source = "the built-in sample" if options.calibration_video is None else options.calibration_video
                log(f"quantizing to int8 (QDQ, {options.int8_policy} policy), calibrated on "
                    f"{options.calibration_frames} frames of {source} ...")
                calibration = _frames(cfg, options.calibration_frames, options.batch, options.calibration_video)
                try:
                    quantization = quantize_int8(fp32_path, path, calibration, fused, policy=options.int8_policy,
                                                 method=options.calibration_method)
                except QuantizationPolicyError as exc:
                    raise UserError(f"int8: {exc} (--int8-policy all-weights)") from exc
                log("  " + quantization.summary())
                graphs.attach_metadata(path, dict(description, precision="int8",
                                                  quantization=quantization.to_dict()))
            graphs.check_graph(path)
            stream = run_stream(OnnxRuntimeStep(path), drift_frames, f"{precision} stream", options.show_progress,
                                fused)
            report = compare_variant(precision, reference, stream, query_embeddings, options.threshold)
            if not report.passed:
                raise VerificationError(f"the {precision} graph drifts beyond its tolerance "
                                        f"{report.tolerance}: {report.summary()}; nothing was written "
                                        f"(export without --precision {precision})")
            log("  " + report.summary())
            variants.append(report)
            drift_source = "built-in sample" if options.calibration_video is None else options.calibration_video.name
            step_entries[precision] = {"file": path.name, "inputs": description["inputs"],
                                       "outputs": description["outputs"],
                                       "verification": dict(report.to_dict(), frames_from=drift_source)}
            if precision == "int8":
                step_entries[precision]["quantization"] = quantization.to_dict()

    tokenizer_dir = staging / "tokenizer"
    tokenizer_dir.mkdir()
    shutil.copy2(vocab_path(), tokenizer_dir / vocab_path().name)
    licence = vocab_path().parent / "LICENSE-clip-bpe-vocab.txt"
    if licence.is_file():
        shutil.copy2(licence, tokenizer_dir / licence.name)

    queries_entry = None
    if options.queries:
        (staging / "queries.json").write_text(json.dumps(
            [{"text": q.text, "response": q.response} for q in options.queries], indent=2))
        np.save(staging / "query_embeddings.npy", query_embeddings.astype(np.float32))
        queries_entry = {"file": "queries.json", "embeddings": "query_embeddings.npy", "count": len(options.queries)}

    log("counting parameters and MACs ...")
    step_count = count_graph(fp32_path)
    step_kernels = graph_kernels(fp32_path)
    backbone, backbone_kernels = (_backbone_counts(model, options.batch, options.opset) if cfg.adapter.kind != "none"
                                  else (step_count, step_kernels))
    text_count = count_graph(text_path)
    complexity = {
        "per_frame": {"batch": options.batch, "image_tower": backbone.to_dict(), "step_graph": step_count.to_dict(),
                      "adapters": {"parameters": step_count.parameters - backbone.parameters,
                                   "macs": step_count.macs - backbone.macs,
                                   "flops": step_count.flops - backbone.flops}},
        "per_query": {"text_graph": text_count.to_dict()},
        "kernels": kernel_summary(step_kernels, backbone_kernels, adapter_count(cfg)),
    }

    files = {}
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        files[path.relative_to(staging).as_posix()] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
    manifest = {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_FORMAT_VERSION,
        "model": cfg.to_dict(),
        "preprocess": description["preprocess"],
        "image_size": cfg.vision.image_size,
        "embed_dim": cfg.embed_dim,
        "batch": options.batch,
        "fps": options.fps,
        "opset": options.opset,
        "query_count": query_count,
        "state": description["state"],
        "state_bytes": description["state_bytes"],
        "receptive_field": description["receptive_field"],
        "graphs": {"step": step_entries,
                   "text": {"file": text_path.name, "inputs": text_description["inputs"],
                            "outputs": text_description["outputs"]}},
        "tokenizer": {"file": f"tokenizer/{vocab_path().name}", "context_length": cfg.text.context_length},
        "queries": queries_entry,
        "thresholds": {"default": options.threshold},
        "checkpoint": checkpoint,
        "complexity": complexity,
        "tool_versions": description["tool_versions"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return ExportResult(out, manifest, verification, variants)
