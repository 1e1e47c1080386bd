"""``sdqes-edge build-engine``: a TensorRT engine from a bundle's step graph, built on the device.

Engines are specific to the GPU architecture and the TensorRT version, so they
live under ``engines/<gpu-name>-sm<major><minor>-trt<version>/`` with a JSON
sidecar recording both (and the sha256 of the graph they came from); a timing
cache beside them makes rebuilding fast. Uses the named-tensor API of
TensorRT 8.5 and newer. int8 engines come from the bundle's QDQ graph
(explicit quantization), never from TensorRT's implicit calibration, which
TensorRT 10 deprecated and 11 removed.

Where an engine's precision comes from depends on what the TensorRT offers
(``plan_engine``). TensorRT 8.5 to 10 have weak typing: an fp16 engine is built
from the fp32 graph with the FP16 builder flag, TensorRT choosing fp16 kernels
layer by layer. TensorRT 11 removed those flags (every network is strongly
typed, the graph's own types decide), so there an fp16 engine is built from
the bundle's fp16 graph, which the exporter already made and checked against
fp32: its state is fp16 at the engine's boundary too, and the backends read
every binding's dtype from the engine.

Every engine is checked before it is kept: its stream against the bundle's fp32
graph under ONNX Runtime, the state carried, held to the tolerance of its
precision (TensorRT picks fp16 kernels layer by layer, and DESIGN.md warns that
fp16 LayerNorm can overflow). An engine that fails is not kept, so it never
replaces a good one.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection

import numpy as np

from sdqes_edge.contract import (
    ENGINES_FOLDER,
    FP16,
    FP32,
    INT8,
    PLAIN_ONNX_OPERATORS,
    PRECISIONS,
    STATE_DTYPES,
    engine_name,
)
from sdqes_edge.errors import WARNING_PREFIX, UserError
from sdqes_edge.files import file_sha256, flush_to_disk, make_folders, write_text_atomically
from sdqes_edge.package_builds import CUDA_PROVIDER, load_onnxruntime
from sdqes_edge.runtime.bundle import Bundle, inside_bundle, load_bundle
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.output_locks import hold_bundle, release
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.runtime.queries import text_encoder_for
from sdqes_edge.runtime.tensorrt_backend import (
    DeviceInfo,
    TensorRTStep,
    current_device,
    nvidia_gpu_present,
    require_tensorrt,
)
from sdqes_edge.sample import EXAMPLE_QUERIES, sample_streams
from sdqes_edge.tolerances import ENGINE_TOLERANCES, ENGINE_VERIFY_FRAMES

from .drift import VariantDriftError, VariantReport, compare_variant, run_stream
from .precision import SYMMETRIC_ACTIVATIONS
from .tensorrt_ops import LAYERNORM_OPSET, check_opset_readable, tensorrt_readable_bytes

__all__ = ["EnginePlan", "build_engine", "check_engine", "engine_dir", "nvidia_gpu_present", "plan_engine",
           "require_tensorrt"]

DEFAULT_WORKSPACE_MIB = 2048
# Weak typing (TensorRT 8.5-10): the graph each precision is built from, and the builder flags that let TensorRT
# pick lower-precision kernels. int8 also allows fp16 so the layers between Q/DQ pairs need not run in fp32.
WEAK_TYPING_GRAPHS = {FP32: FP32, FP16: FP32, INT8: INT8}
WEAK_TYPING_FLAGS = {FP32: (), FP16: ("FP16",), INT8: ("FP16", "INT8")}
# Strong typing (the only mode of TensorRT 11): each precision is built from its own graph, flags play no part.
STRONG_TYPING_GRAPHS = {FP32: FP32, FP16: FP16, INT8: INT8}


@dataclass(frozen=True)
class EnginePlan:
    """How TensorRT is asked for an engine of ``precision``: which of the bundle's step graphs it parses, and
    either the builder flags that let it choose reduced-precision kernels (weak typing) or none, the graph's
    own types deciding (strong typing)."""

    precision: str
    graph_precision: str
    strongly_typed: bool
    builder_flags: tuple[str, ...]

    @property
    def typing(self) -> str:
        return "strong" if self.strongly_typed else "weak"

    @property
    def state_dtype(self) -> str:
        """The dtype of the engine's state bindings: the network's I/O keeps the parsed graph's types."""
        return STATE_DTYPES[self.graph_precision]


def weak_typing_available(trt) -> bool:
    """True for TensorRT 8.5-10, whose builder still takes precision flags; TensorRT 11 removed them."""
    return hasattr(trt.BuilderFlag, "FP16")


def plan_engine(precision: str, available: Collection[str], weak_typing: bool, tensorrt_version: str,
                bundle_root: Path | str = "the bundle") -> EnginePlan:
    """The plan for ``precision`` given the step graphs ``available`` (their precisions), or a one-line UserError
    naming the graph to export."""
    graphs = WEAK_TYPING_GRAPHS if weak_typing else STRONG_TYPING_GRAPHS
    plan = EnginePlan(precision, graphs[precision], not weak_typing,
                      WEAK_TYPING_FLAGS[precision] if weak_typing else ())
    if plan.graph_precision not in available:
        why = ("" if plan.graph_precision == INT8 else
               f": TensorRT {tensorrt_version} types every network strictly, so an {precision} engine is built "
               f"from the bundle's {precision} graph")
        raise UserError(f"{bundle_root} has no {plan.graph_precision} graph{why}; re-export it with --precision "
                        f"{plan.graph_precision} (and any other precision it should keep)")
    return plan


TIMING_CACHE_NAME = "timing.cache"  # TensorRT's kernel timings, kept beside the engines of one device


def engine_dir(bundle: Bundle, device: DeviceInfo) -> Path:
    return inside_bundle(bundle.root, f"{ENGINES_FOLDER}/{device.folder}", named_by_manifest=False)


def network_flags(trt, plan: EnginePlan) -> int:
    creation = trt.NetworkDefinitionCreationFlag
    flags = 0
    if hasattr(creation, "EXPLICIT_BATCH") and int(trt.__version__.split(".")[0]) < 10:
        flags |= 1 << int(creation.EXPLICIT_BATCH)  # implicit from TensorRT 10
    if plan.strongly_typed and hasattr(creation, "STRONGLY_TYPED"):
        flags |= 1 << int(creation.STRONGLY_TYPED)  # required to ask for it in 10, accepted and implied in 11
    return flags


def build_serialized_engine(graph: Path, plan: EnginePlan, workspace_mib: int, cache_path: Path, operators: str,
                            log: Callable[[str], None] = print) -> tuple[bytes, float]:
    """Parse an ONNX graph (whose ``operators`` are its manifest entry's) and build a serialized engine with the
    timing cache at ``cache_path`` (updated)."""
    trt = require_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, plan))
    parser = trt.OnnxParser(network, logger)
    log(f"parsing {graph.name} ...")
    plain = tensorrt_readable_bytes(graph, operators)  # None: the file is plain ONNX already
    if not (parser.parse_from_file(str(graph)) if plain is None else parser.parse(plain, str(graph))):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"TensorRT {trt.__version__} cannot parse {graph.name}: {errors}. If it names "
                        "LayerNormalization, re-export with --opset 16")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    for flag in plan.builder_flags:  # int8 with the QDQ graph's nodes: explicit quantization
        config.set_flag(getattr(trt.BuilderFlag, flag))
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    started = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise UserError(f"TensorRT could not build an engine from {graph.name} (see its messages above); try "
                        f"a larger --workspace-mib than {workspace_mib}")
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    return bytes(serialized), time.perf_counter() - started


def _check_symmetric_activations(bundle) -> None:
    """TensorRT's explicit quantization takes int8 with zero point 0 only; an int8 graph made for the CPU (uint8
    activations with zero points) would fail deep in the build, so it is refused here, with the fix."""
    quantization = bundle.manifest["graphs"]["step"][INT8].get("quantization", {})
    # Bundles from before the choice existed were quantized symmetrically.
    activations = quantization.get("activations", SYMMETRIC_ACTIVATIONS)
    if activations != SYMMETRIC_ACTIVATIONS:
        raise UserError(f"{bundle.root}'s int8 graph has {activations} activations, which TensorRT cannot build; "
                        f"re-export with --precision int8 --int8-activations {SYMMETRIC_ACTIVATIONS}")


def _check_engines_writable(bundle: Bundle) -> None:
    """Refuse, before minutes of building, a bundle whose engines cannot be stored (a read-only mount, a file
    where the engines folder goes); nothing is created here."""
    engines = inside_bundle(bundle.root, ENGINES_FOLDER, named_by_manifest=False)  # no probe file made outside

    def refuse(why: str):
        raise UserError(f"cannot store engines in {engines} ({why}): engines live inside the bundle, so copy it to "
                        f"a folder you can write to (cp -r {bundle.root} DEST) and build there")

    if engines.exists() and not engines.is_dir():
        refuse("a file is in its place")
    try:
        tempfile.TemporaryFile(dir=engines if engines.is_dir() else bundle.root).close()
    except OSError as exc:
        refuse(exc.strerror or str(exc))


def build_engine(bundle_path: str | Path, precision: str = FP16, workspace_mib: int = DEFAULT_WORKSPACE_MIB,
                 verify_frames: int = ENGINE_VERIFY_FRAMES, log: Callable[[str], None] = print) -> Path:
    """Build (or rebuild) the engine for this device, check it against the fp32 graph over ``verify_frames``
    frames (0: kept unchecked, with a warning) and keep it only if it passes; returns its path."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision}")
    if workspace_mib < 64:
        raise UserError(f"--workspace-mib {workspace_mib} is too small; give at least 64 (default "
                        f"{DEFAULT_WORKSPACE_MIB})")
    if verify_frames < 0:
        raise UserError(f"--verify-frames {verify_frames} is negative; give 0 to skip the check, or a frame count "
                        f"(default {ENGINE_VERIFY_FRAMES})")
    # Held throughout: two builds for one device wrote one candidate file between them, and an export replacing the
    # bundle meanwhile took the engine away with the folder it replaced.
    lock = hold_bundle(bundle_path, "build-engine")
    try:
        return _build_checked_engine(load_bundle(bundle_path), precision, workspace_mib, verify_frames, log)
    finally:
        release(lock)


def _build_checked_engine(bundle: Bundle, precision: str, workspace_mib: int, verify_frames: int,
                          log: Callable[[str], None]) -> Path:
    if precision == INT8:  # the QDQ graph, whatever the TensorRT: said before looking for a GPU
        plan_engine(INT8, bundle.precisions, weak_typing=True, tensorrt_version="", bundle_root=bundle.root)
        _check_symmetric_activations(bundle)
    if bundle.manifest.get("query_count"):
        # The TensorRT backends (Python and C++) bind the frame, the state and the embedding; a fused graph's
        # query input would be left unbound and every step would fail.
        raise UserError(f"{bundle.root}'s step graph scores its queries inside (exported with --fuse-queries), "
                        "which the TensorRT backends do not bind; re-export "
                        "without --fuse-queries (queries are then scored by the runtime, added and removed live)")
    _check_engines_writable(bundle)
    device = current_device()  # refuses a machine without an NVIDIA GPU, TensorRT or pycuda
    plan = plan_engine(precision, bundle.precisions, weak_typing_available(require_tensorrt()),
                       device.tensorrt_version, bundle.root)
    check_opset_readable(int(bundle.manifest.get("opset", LAYERNORM_OPSET)), device.tensorrt_version, bundle.root)
    graph = bundle.step_graph(plan.graph_precision)
    out_dir = engine_dir(bundle, device)
    make_folders(out_dir)

    log(f"building the {precision} engine from {graph.name} ({plan.typing} typing) for {device.name} "
        f"(sm{device.compute_capability[0]}{device.compute_capability[1]}, TensorRT {device.tensorrt_version}); "
        "this takes minutes ...")
    timing_cache = inside_bundle(bundle.root, f"{ENGINES_FOLDER}/{device.folder}/{TIMING_CACHE_NAME}",
                                 named_by_manifest=False)  # read and rewritten: never through a symlink out
    operators = bundle.manifest["graphs"]["step"][plan.graph_precision].get("operators", PLAIN_ONNX_OPERATORS)
    serialized, seconds = build_serialized_engine(graph, plan, workspace_mib, timing_cache, operators, log)
    record = {"source_graph": graph.name, "source_graph_sha256": file_sha256(graph), "typing": plan.typing,
              "state_dtype": plan.state_dtype, "workspace_mib": workspace_mib, "build_seconds": round(seconds, 1)}
    engine_path = keep_checked_engine(bundle, serialized, precision, device, record, verify_frames, log)
    log(f"wrote {engine_path} ({engine_path.stat().st_size / 2**20:.1f} MiB), built in {seconds:.0f} s")
    return engine_path


def keep_checked_engine(bundle: Bundle, serialized: bytes, precision: str, device: DeviceInfo, record: dict,
                        verify_frames: int, log: Callable[[str], None],
                        open_engine: Callable[[Path, Bundle], object] = TensorRTStep.for_bundle) -> Path:
    """Write the engine beside any earlier one, check it (``check_engine``), and only then put it in place with
    its sidecar: an engine that fails its check is deleted, and the earlier engine stays as it was.

    ``open_engine(path, bundle)`` -> a step backend for the candidate file (TensorRT's, but any backend with the
    same interface checks the same way)."""
    engine_path = engine_dir(bundle, device) / engine_name(precision)
    make_folders(engine_path.parent)
    for written in (engine_path, engine_path.with_suffix(".json")):  # replaced where a link leads: it must not lead out
        inside_bundle(bundle.root, written.relative_to(bundle.root).as_posix(), named_by_manifest=False)
    candidate = engine_path.with_name(engine_path.name + ".tmp")
    candidate.write_bytes(serialized)
    try:
        verification = None
        if verify_frames:
            report = check_engine(open_engine(candidate, bundle), bundle, precision,
                                  engine_check_frames(bundle, verify_frames), log)
            log("  " + report.summary())
            if not report.passed:
                raise VariantDriftError(precision, _drift_words(bundle, precision, report, engine_path.exists()))
            verification = dict(report.to_dict(), frames_from="built-in sample")
        else:
            log(f"{WARNING_PREFIX}--verify-frames 0: the engine is kept without a check against the fp32 graph")
        flush_to_disk(candidate)  # a power cut after the rename leaves this engine, not an empty file
        candidate.replace(engine_path)
    finally:
        candidate.unlink(missing_ok=True)
    sidecar = dict(record, engine=engine_path.name, precision=precision, tensorrt_version=device.tensorrt_version,
                   gpu=device.name, compute_capability=list(device.compute_capability),
                   engine_sha256=file_sha256(engine_path), built=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   state=bundle.manifest["state"], verification=verification)
    write_text_atomically(engine_path.with_suffix(".json"), json.dumps(sidecar, indent=2))
    return engine_path


def _drift_words(bundle: Bundle, precision: str, report: VariantReport, earlier: bool) -> str:
    kept = "the earlier engine is unchanged" if earlier else "no engine was written"
    fixes = [] if precision == FP32 else ["build with --precision fp32"]
    if int(bundle.manifest.get("opset", 17)) < 17:
        fixes.append("re-export the bundle with --opset 17, where LayerNorm is one layer TensorRT keeps accurate")
    fix = "; " + ", or ".join(fixes) if fixes else "; please report this with the command you ran"
    return (f"the {precision} engine drifts from the bundle's fp32 graph beyond {report.tolerance}: "
            f"{report.summary()}; {kept}{fix}")


def engine_check_frames(bundle: Bundle, count: int) -> np.ndarray:
    """The built-in sample through the bundle's preprocessing: [count, batch, 3, R, R], staggered streams."""
    pre = Preprocessor.from_description(bundle.image_size, bundle.manifest["preprocess"])
    return sample_streams(pre, count, int(bundle.manifest["batch"]), pre.image_size)


def reference_device() -> str:
    """Where the fp32 reference runs: ONNX Runtime's CUDA EP where onnxruntime-gpu is installed, else the CPU."""
    ort = load_onnxruntime()
    return "cuda" if CUDA_PROVIDER in ort.get_available_providers() else "cpu"


def check_engine(engine_step, bundle: Bundle, precision: str, frames: np.ndarray, log: Callable[[str], None],
                 device: str | None = None) -> VariantReport:
    """``engine_step``'s stream against the bundle's fp32 graph under ONNX Runtime over ``frames``
    [T, B, 3, R, R], the state carried, judged by ``ENGINE_TOLERANCES[precision]``; alerts are compared on the
    bundle's queries (or the built-in examples)."""
    device = device or reference_device()
    reference = OnnxRuntimeStep(bundle.step_graph(FP32), device=device)
    shipped = bundle.queries()  # encoded at export; else the built-in examples, encoded by the bundle's text graph
    if shipped:
        query_embeddings = shipped[1]
    else:
        encoder = text_encoder_for(bundle, truncate_queries=True)
        query_embeddings = np.stack([encoder.encode(text) for text, _ in EXAMPLE_QUERIES])
    log(f"checking the {precision} engine against the fp32 graph (ONNX Runtime, {device}) over {len(frames)} "
        "frames, the state carried ...")
    expected = run_stream(reference, frames, "fp32 graph", show_progress=True)
    got = run_stream(engine_step, frames, f"{precision} engine", show_progress=True)
    return compare_variant(precision, expected, got, query_embeddings, bundle.default_threshold,
                           ENGINE_TOLERANCES[precision])
