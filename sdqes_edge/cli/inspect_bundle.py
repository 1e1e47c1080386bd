"""``inspect``: check a bundle as the runtime loads it, stream sample frames through it, and count the kernels one
step executes (ONNX Runtime's profiler, on the CPU)."""

from __future__ import annotations

import argparse
import time

import sdqes_edge
from sdqes_edge.cli.common import PROG, add_subcommand, at_least, path_text, run_hint, show
from sdqes_edge.contract import FP16, FUSED_OPS, ONNX_RUNTIME_OPERATORS, PRECISIONS, REFERENCE_PRECISION
from sdqes_edge.errors import UserError, install_command, module_absent
from sdqes_edge.files import format_bytes
from sdqes_edge.package_builds import load_onnxruntime
from sdqes_edge.progress import with_progress


def cmd_inspect(args: argparse.Namespace) -> int:
    import numpy as np

    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
    from sdqes_edge.runtime.preprocess import Preprocessor
    from sdqes_edge.sample import iter_sample_frames

    load_onnxruntime()  # before the first line of the report: on an install without it, the one line saying so
    bundle = load_bundle(args.bundle)
    m = bundle.manifest
    # Before the report: a --precision the bundle lacks or an --ort-ops that is no library came after half of it.
    runner = OnnxRuntimeStep(bundle.step_graph(args.precision), fused_ops=args.ort_ops)
    # The manifest is someone else's data: its control characters shown, not obeyed.
    show(f"bundle     {bundle.root}  (format {m['format_version']}, made by sdqes-edge "
         f"{m['tool_versions'].get(sdqes_edge.__name__)}, all {len(m['files'])} files match their sha256)")
    show(f"model      {m['model']['name']}, adapter {m['model']['adapter']['kind']}, "
         f"{m['image_size']}px, embed {m['embed_dim']}, batch {m['batch']}, opset {m.get('opset')}")
    show(f"weights    {_weights_words(bundle)}")
    labels = bundle.label_thresholds
    show(f"stream     {m['fps']} fps, default threshold {m['thresholds']['default']:.4f}"
         + (f" ({len(labels)} query labels with their own)" if labels else "")
         + f", state {len(m['state'])} tensors ({format_bytes(m['state_bytes'])})")
    fused_ops = [p for p in bundle.precisions if m["graphs"]["step"][p].get("operators") == ONNX_RUNTIME_OPERATORS]
    fused_words = f" ({', '.join(fused_ops)} with ONNX Runtime's fused operators)" if fused_ops else ""
    show(f"graphs     step: {', '.join(bundle.precisions)}{fused_words}; text encoder: {m['graphs']['text']['file']} "
         f"(queries up to {m['tokenizer']['context_length']} tokens)")
    queries = bundle.queries()
    if queries:
        fused = " (fused into the graph)" if m.get("query_count") else ""
        show(f"queries    {len(queries[0])} pre-encoded{fused}")
    pre = Preprocessor.from_description(bundle.image_size, m["preprocess"])
    state = runner.initial_state()
    q = queries[1] if (queries and runner.fused_queries) else None
    stepping = 0.0  # the steps alone, not the drawing and preprocessing of the sample
    frames = with_progress(iter_sample_frames(args.frames), "stepping", "frame", total=args.frames)
    for k, image in enumerate(frames):  # one at a time: 100000 frames held 23 GB
        batch = np.repeat(pre(image)[None], m["batch"], axis=0)
        started = time.perf_counter()
        result = runner.step(batch, state, q)
        stepping += time.perf_counter() - started
        state = result.state
        _refuse_non_finite(result.embedding, k, args.precision)
    ms = stepping / args.frames * 1e3
    print(f"ran        {args.frames} sample frames through the {args.precision} graph with ONNX Runtime (CPU): "
          f"{ms:.1f} ms/frame, embedding norm {float(np.linalg.norm(result.embedding[0])):.4f}")
    _print_kernels(bundle, args.precision, runner.fused_ops)
    precision = "" if args.precision == REFERENCE_PRECISION else f" --precision {args.precision}"
    precision += f" --ort-ops {args.ort_ops}" if args.ort_ops else ""  # as it was inspected
    # The TensorRT engines bind no query input: a graph that scores its queries (--fuse-queries) runs on ORT alone.
    engine = "" if m.get("query_count") else f"   (on an NVIDIA device: {PROG} build-engine {args.bundle})"
    show(f"\nnext: {run_hint(args.bundle, m, '--source VIDEO' + precision)}{engine}")
    return 0


def _weights_words(bundle) -> str:
    """Where the model's weights came from, as far as the bundle says: a preset's random ones, a checkpoint (and what
    its training record says it was trained on), or nothing said (an export through the Python API that named no
    checkpoint, or one made before exports recorded a preset's random weights)."""
    from sdqes_edge.train_options import random_weights_words, training_data_words

    if random := random_weights_words(bundle.manifest):
        return f"{random}: its scores and alerts mean nothing"
    checkpoint = bundle.manifest.get("checkpoint")
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("file"), str):
        return "not recorded (the manifest names no checkpoint, and no preset's random weights)"
    trained_on = training_data_words(bundle.training_record)
    return (f"checkpoint {checkpoint['file']} ({checkpoint.get('source_format', 'format not recorded')})"
            + (f", trained on {trained_on}" if trained_on else ""))


def _refuse_non_finite(embedding, frame: int, precision: str) -> None:
    """A NaN or Inf embedding is a failed check, not a figure to print (ONNX Runtime 1.17-1.18 gave NaN from
    fp16 graphs with their memory plan on, and inspect printed 'embedding norm nan' and exit 0)."""
    import numpy as np

    if not np.isfinite(embedding).all():
        raise UserError(f"the {precision} graph gave a non-finite embedding at sample frame {frame} on ONNX Runtime "
                        f"{load_onnxruntime().__version__}; run another precision (--precision fp32), or another ONNX "
                        "Runtime, and if fp32 fails too, re-export the bundle")


def _print_kernels(bundle, precision: str, fused_ops=None) -> None:
    """Kernels one step executes (ONNX Runtime's profiler, CPU), the graph's own node and Cast counts, and per
    adapter where the manifest says; with ``fused_ops`` (this project's kernel library), a step's kernels with it."""
    from sdqes_edge.export.complexity import graph_kernels
    from sdqes_edge.runtime.kernels import count_kernels

    path = bundle.step_graph(precision)
    has_onnx = not module_absent("onnx")
    # ONNX Runtime alone counts the kernels; the graph's own nodes need the onnx package, which a device lacks.
    live = graph_kernels(path) if has_onnx else count_kernels(path).to_dict()
    top = ", ".join(f"{op} {n}" for op, n in list(live["by_op"].items())[:6])
    print(f"kernels    {live['per_step']} per step on ONNX Runtime CPU ({live['views']} of them views), {precision} "
          f"graph: {top}, ...")
    cpu_casts = " (ONNX Runtime's CPU adds its own around ops it has no fp16 kernel for)" if precision == FP16 else ""
    if has_onnx:
        print(f"           the graph: {live['onnx_nodes']} ONNX nodes, {live['graph_casts']} Cast(s) a step runs"
              f"{cpu_casts}")
    else:
        print(f"           (the graph's ONNX node and Cast counts need onnx: {install_command('onnx')})")
    recorded = bundle.manifest.get("complexity", {}).get("kernels")
    if fused_ops is not None:
        fused = count_kernels(path, fused_ops=fused_ops)
        ops = ", ".join(f"{op} {n}" for op, n in fused.by_op.items() if op in FUSED_OPS) or "none of its operators"
        # Per adapter where the manifest counted the image tower alone in this very graph's form (fp32 written with
        # ONNX Runtime's operators); the fp16 graph's tower was not counted.
        graph_form = bundle.manifest["graphs"]["step"][precision].get("operators")
        per_adapter = (f"; {(fused.per_step - recorded['image_tower']['per_step']) / recorded['adapters']:.1f} per "
                       "adapter over the image tower alone" if precision == REFERENCE_PRECISION and recorded
                       and recorded.get("adapters") and recorded.get("operators") == graph_form else "")
        print(f"           with {fused_ops.path.name}: {fused.per_step} per step ({ops}){per_adapter}")
    if recorded and recorded.get("per_adapter"):
        per = recorded["per_adapter"]
        tower = recorded["image_tower"]
        form = " with ONNX Runtime's fused operators" if recorded.get("operators") == ONNX_RUNTIME_OPERATORS else ""
        print(f"           fp32{form} at export: image tower alone {tower['per_step']} kernels "
              f"({tower['onnx_nodes']} ONNX nodes); per adapter {per['kernels']:.1f} kernels "
              f"({per['computing']:.1f} computing), {per['onnx_nodes']:.1f} ONNX nodes, "
              f"{recorded['adapters']} adapters")




def add_parser(sub: argparse._SubParsersAction) -> None:
    inspect = add_subcommand(sub, "inspect", "check a bundle (manifest, sha256 of every file) and run it",
                             "Load a bundle as the runtime does (schema, hashes, state wiring) and stream a few "
                             "sample frames through its step graph with ONNX Runtime; count the kernels one step "
                             "executes.", examples=("bundles/qrnn", "bundles/qrnn --precision int8"))
    inspect.add_argument("bundle", type=path_text, help="bundle directory made by `sdqes-edge export`")
    inspect.add_argument("--precision", default=REFERENCE_PRECISION, choices=PRECISIONS,
                         help="step graph to run (default %(default)s)")
    inspect.add_argument("--frames", type=at_least(1), default=8, help="sample frames to stream (default %(default)s)")
    inspect.add_argument("--ort-ops", type=path_text, metavar="LIBRARY",
                         help="also run and count with this project's ONNX Runtime kernels (sdqes-edge build-ort-ops)")
    inspect.set_defaults(func=cmd_inspect)
