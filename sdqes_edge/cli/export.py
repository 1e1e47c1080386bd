"""Export commands: ``export`` (a verified bundle) and ``build-engine``; ``inspect`` (check and run one) is
registered between them from ``inspect_bundle``.

Parsers are built without importing torch; the handlers import what they need.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sdqes_edge.cli import inspect_bundle
from sdqes_edge.cli.common import (
    PROG,
    UniqueValues,
    add_adapter_option,
    add_subcommand,
    finite_number,
    frames_per_second,
    given_flags,
    model_from_args,
    path_text,
    progress_log,
    run_hint,
    seed_number,
    show,
    unique_queries,
    warn,
)
from sdqes_edge.cli.queries_file import QUERIES_FILE_HELP, QueryLine, read_queries_file
from sdqes_edge.config import DEFAULT_FPS, DEFAULT_THRESHOLD, MLP_ACTIVATIONS
from sdqes_edge.contract import (
    DEFAULT_OPSET,
    FP16,
    GRAPH_OPERATORS,
    ONNX_RUNTIME_OPERATORS,
    PLAIN_ONNX_OPERATORS,
    PRECISIONS,
    REFERENCE_PRECISION,
)
from sdqes_edge.export.precision import (
    AUTO_FLOAT_BLOCKS,
    BACKBONE_POLICY,
    CALIBRATION_METHODS,
    DEFAULT_CALIBRATION_FRAMES,
    DEFAULT_CALIBRATION_METHOD,
    DEFAULT_INT8_ACTIVATIONS,
    DEFAULT_INT8_FLOAT_BLOCKS,
    DEFAULT_INT8_POLICY,
    INT8_ACTIVATIONS,
    INT8_POLICIES,
    MAX_AUTO_FLOAT_BLOCKS,
)
from sdqes_edge.export.tensorrt_engine import DEFAULT_WORKSPACE_MIB
from sdqes_edge.files import format_bytes
from sdqes_edge.tokenizer import CONTEXT_LENGTH
from sdqes_edge.tolerances import DRIFT_FRAMES, ENGINE_VERIFY_FRAMES, VERIFY_FRAMES
from sdqes_edge.train_options import trained_deployment

# --- export ---------------------------------------------------------------------------

def _warn_model_conflicts(args: argparse.Namespace) -> None:
    """Model options the other way of giving a model fixes: each named in a warning and dropped."""
    if args.checkpoint and args.adapter:
        warn("--adapter is ignored with --checkpoint (the checkpoint determines its adapters)")
        args.adapter = None
    if args.checkpoint and args.seed is not None:  # it seeds random weights, and a checkpoint brings its own
        warn("--seed is ignored with --checkpoint (it seeds a preset's random weights)")
    unstored_flags = given_flags(args, "vision_heads", "text_heads", "mlp_activation", "model_config")
    if args.preset and unstored_flags:
        warn(f"{', '.join(unstored_flags)} ignored with --preset (the preset fixes its head counts and activation)")


def cmd_export(args: argparse.Namespace) -> int:
    from sdqes_edge.export.exporter import ExportOptions, Query, check_options, check_target, export_bundle

    queries = [QueryLine(q, q) for q in args.query or []]
    if args.queries_file:
        queries += read_queries_file(args.queries_file)
    queries = unique_queries(queries)
    _warn_model_conflicts(args)
    options = ExportOptions(
        batch=args.batch, opset=args.opset, precisions=tuple(args.precision), fuse_queries=args.fuse_queries,
        queries=tuple(Query(*line) for line in queries), fps=args.fps or DEFAULT_FPS,
        threshold=DEFAULT_THRESHOLD if args.threshold is None else args.threshold,
        verify_frames=args.verify_frames, drift_frames=args.drift_frames,
        calibration_video=Path(args.calibration_video) if args.calibration_video else None,
        calibration_frames=args.calibration_frames, int8_policy=args.int8_policy,
        calibration_method=args.calibration_method, int8_activations=args.int8_activations,
        int8_float_blocks=args.int8_float_blocks, truncate_queries=args.truncate_queries,
        show_progress=not args.quiet, fp16_operators=args.fp16_operators, fp32_operators=args.fp32_operators)
    # Before the (possibly slow) checkpoint load; a query's length is checked once its text positions are known.
    check_options(options, lambda message: None, context_length=None if args.checkpoint else CONTEXT_LENGTH)
    check_target(Path(args.out))
    checkpoint = training_record = random_weights = None
    if args.checkpoint:
        from sdqes_edge.checkpoints import load_resolving_unstored

        model, loaded, unstored = load_resolving_unstored(args.checkpoint, args.vision_heads, args.text_heads,
                                                          args.mlp_activation, args.model_config)
        print(unstored.rule)  # once the checkpoint has loaded: a file that cannot be read gets its error alone
        source = f"{args.checkpoint} ({loaded.source_format})"
        checkpoint = {"file": Path(args.checkpoint).name, "sha256": loaded.sha256,
                      "source_format": loaded.source_format,
                      "heads": {"vision": model.cfg.vision.heads, "text": model.cfg.text.heads, "rule": unstored.rule}}
        training_record = loaded.training_record  # `sdqes-edge train`'s, where it made the checkpoint
        options = _as_trained(options, args, training_record)
    else:
        from sdqes_edge.model.init import randomize_adapters

        model, source = model_from_args(args)
        randomize_adapters(model, seed=args.seed or 0)  # so the state paths carry signal through verification
        random_weights = {"preset": model.cfg.name, "seed": args.seed or 0}  # `run` says its alerts mean nothing
    if not args.quiet:
        show(f"exporting {model.cfg.name} from {source} to {args.out}")
    result = export_bundle(model, args.out, options, checkpoint=checkpoint, training_record=training_record,
                           random_weights=random_weights, log=progress_log(args.quiet))
    show(f"\nwrote {result.out} in {result.seconds:.1f} s:")
    for name, entry in sorted(result.manifest["files"].items()):
        print(f"  {name:40s} {format_bytes(entry['bytes']):>10s}")
    complexity = result.manifest["complexity"]["per_frame"]
    tower, adapters = complexity["image_tower"], complexity["adapters"]
    print(f"per frame: image tower {tower['parameters'] / 1e6:.2f}M params, {tower['macs'] / 1e9:.3g} GMACs; "
          f"adapters {adapters['parameters'] / 1e6:.2f}M params, {adapters['macs'] / 1e9:.3g} GMACs; "
          f"state {format_bytes(result.manifest['state_bytes'])}")
    print(f"verified: {result.verification.summary()}")
    for report in result.variants:
        print(f"          {report.summary()}")
    show(f"\nnext: {PROG} inspect {args.out}      then: {run_hint(args.out, result.manifest)}")
    return 0


def _as_trained(options, args: argparse.Namespace, record: dict | None):
    """``options`` with what a checkpoint of `sdqes-edge train` says of its deployment, where the command line does
    not: the threshold calibrated on its validation streams (the default 0.57 had left such a model's bundle
    uncalibrated, and `accuracy` printed its export without one) and the rate it was trained at."""
    from dataclasses import replace

    threshold, fps = trained_deployment(record)
    if args.threshold is None and threshold is not None:
        options = replace(options, threshold=threshold)
        if not args.quiet:
            print(f"threshold {threshold:.4f}: calibrated on validation streams when this model was trained (its "
                  "record); --threshold gives another")
    if fps is not None and args.fps is None and fps != options.fps:
        options = replace(options, fps=fps)
        if not args.quiet:
            print(f"stream rate {fps:g} fps: the rate this model was trained at (its record); --fps gives another")
    elif fps is not None and args.fps is not None and fps != args.fps:
        warn(f"--fps {args.fps:g} is not the {fps:g} fps this model was trained at (its record): its adapters "
             f"learnt how frames {1 / fps:g} s apart follow each other, and at another rate their memory spans "
             f"another time; give --fps {fps:g}, or train at this rate (train --fps {args.fps:g})")
    return options


# --- build-engine ---------------------------------------------------------------------

def cmd_build_engine(args: argparse.Namespace) -> int:
    from sdqes_edge.export.tensorrt_engine import build_engine
    from sdqes_edge.runtime.bundle import load_bundle

    build_engine(args.bundle, precision=args.precision, workspace_mib=args.workspace_mib,
                 verify_frames=args.verify_frames, log=progress_log(quiet=False))
    manifest = load_bundle(args.bundle, verify_hashes=False).manifest  # checked by build_engine
    show(f"\nnext: {run_hint(args.bundle, manifest, f'--backend trt --precision {args.precision} --source 0')}")
    return 0


# --- parsers --------------------------------------------------------------------------

def add_parsers(sub: argparse._SubParsersAction) -> None:
    _add_export_parser(sub)
    inspect_bundle.add_parser(sub)

    engine = add_subcommand(sub, "build-engine", "build a TensorRT engine for this NVIDIA device",
                            "Build a TensorRT engine from a bundle's step graph on this device and store it under "
                            "BUNDLE/engines/<gpu>-sm<cc>-trt<version>/ with a JSON sidecar and a timing cache. The "
                            "engine is kept only if its stream follows the bundle's fp32 graph (ONNX Runtime) within "
                            "its precision's tolerance, the state carried; an engine that fails never replaces an "
                            "earlier one. Needs an NVIDIA GPU, TensorRT >= 8.5 and pycuda.",
                            examples=("bundles/qrnn --precision fp16",))
    engine.add_argument("bundle", type=path_text, help="bundle directory made by `sdqes-edge export`")
    engine.add_argument("--precision", default=FP16, choices=PRECISIONS,
                        help="int8 from the bundle's QDQ graph; fp16 and fp32 from the fp32 graph on TensorRT "
                             "8.5-10, from their own graphs on TensorRT 11 (fp16 then needs a bundle exported with "
                             "--precision fp16) (default %(default)s)")
    engine.add_argument("--workspace-mib", type=int, default=DEFAULT_WORKSPACE_MIB,
                        help="builder workspace limit (default %(default)s)")
    engine.add_argument("--verify-frames", type=int, default=ENGINE_VERIFY_FRAMES, metavar="N",
                        help="frames of the built-in sample over which the engine is checked against the fp32 "
                             "graph, the state carried; 0 keeps it unchecked (default %(default)s)")
    engine.set_defaults(func=cmd_build_engine)


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    export = add_subcommand(
        sub, "export", "export a model to a verified deployment bundle (ONNX graphs + manifest)",
        "Trace the model's single-step form into a stateful ONNX graph (state_in.* -> state_out.*), export the "
        "text encoder, verify both with ONNX Runtime against PyTorch over a stream with the state carried, "
        "optionally add fp16/int8 variants measured against fp32, and write a bundle directory. Nothing is written "
        "unless verification passes; an existing bundle at --out is replaced only then.",
        examples=("--checkpoint epoch=9.ckpt --out bundles/qrnn",
                  "--preset tiny --adapter qrnn --precision fp16 int8 --out /tmp/tiny",
                  "--preset clip-vit-b16 --adapter qrnn --query 'When I start cooking, remind me to wash my hands.' "
                  "--out bundles/b16"))
    _add_model_options(export)
    export.add_argument("--out", type=path_text,
                        required=True, help="bundle directory to write (replaced only after verification)")
    export.add_argument("--batch", type=int, default=1, help="streams per step, fixed in the graph (default "
                                                             "%(default)s)")
    export.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                        help="ONNX opset: 17 keeps LayerNormalization one node, 16 for TensorRT < 8.6 (default "
                             "%(default)s)")
    export.add_argument("--precision", nargs="+", action=UniqueValues, default=[REFERENCE_PRECISION],
                        choices=PRECISIONS,
                        help=f"graphs to write; {REFERENCE_PRECISION} is always written and is the reference "
                             "(default %(default)s)")
    export.add_argument("--query", action="append", metavar="TEXT", help="a query to pre-encode (repeatable)")
    export.add_argument("--queries-file", type=path_text, help=QUERIES_FILE_HELP)
    export.add_argument("--fuse-queries", action="store_true",
                        help="score queries inside the step graph (query_embeddings in, logits out): as many "
                             "at once as given here, any texts")
    export.add_argument("--fps", type=frames_per_second,
                        help=f"sampling rate of the stream (default: the rate a checkpoint of `{PROG} train` was "
                             f"trained at, else {DEFAULT_FPS:g})")
    export.add_argument("--threshold", type=finite_number,
                        help=f"default alert threshold on sigmoid(cos) (default: the one a checkpoint of `{PROG} "
                             f"train` was calibrated at, else {DEFAULT_THRESHOLD:g})")
    export.add_argument("--verify-frames", type=int, default=VERIFY_FRAMES,
                        help="frames of the fp32 check against PyTorch (default %(default)s)")
    export.add_argument("--drift-frames", type=int, default=DRIFT_FRAMES,
                        help="frames over which fp16/int8 are streamed beside fp32 with the state carried and "
                             "refused if they drift (default %(default)s)")
    export.add_argument("--fp16-operators", choices=GRAPH_OPERATORS, default=ONNX_RUNTIME_OPERATORS,
                        help="operators of the fp16 graph: onnxruntime runs each block's attention and each "
                             "residual Add + LayerNorm as ONNX Runtime's fused kernels (fewer GPU kernels; "
                             "build-engine writes them back for TensorRT); onnx keeps plain ONNX for other "
                             "runtimes (default %(default)s)")
    export.add_argument("--fp32-operators", choices=GRAPH_OPERATORS, default=PLAIN_ONNX_OPERATORS,
                        help="operators of the fp32 graph: onnx (default) runs on any ONNX runtime; onnxruntime "
                             "writes it as the fp16 graph is written, so that this project's kernel library "
                             "(--ort-ops) runs its fused steps on a CPU deployment too (a RetNet adapter's "
                             "retention step one kernel); int8 is still quantized from the plain graph")
    _add_int8_options(export)
    export.add_argument("--truncate-queries", action="store_true", help="cut queries over the model's token limit "
                                                                        "(CLIP's 77) instead of refusing them")
    export.add_argument("--seed", type=seed_number, help="with --preset: seed of the random weights, so an export "
                                                       "can be repeated (default 0)")
    export.add_argument("--quiet", action="store_true",
                        help="no progress output: only what was written, warnings and errors")
    export.set_defaults(func=cmd_export, output_dirs=("out",))


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=path_text,
                     help="a checkpoint from the authors' training code, OpenAI CLIP, open_clip, Long-CLIP or "
                          "transformers' CLIPModel (sharded weights: their model.safetensors.index.json); "
                          "dimensions and adapters are inferred from it")
    src.add_argument("--preset", help="a preset with random weights (for benchmarking); see `info --list-presets`")
    add_adapter_option(parser, help="with --preset: swap in this adapter kind")
    parser.add_argument("--vision-heads", type=int, help="with --checkpoint: image tower attention heads (a "
                                                         "checkpoint does not store them; default: from a model "
                                                         "config beside it, else width // 64)")
    parser.add_argument("--text-heads", type=int, help="with --checkpoint: text tower attention heads (as above)")
    parser.add_argument("--mlp-activation", choices=MLP_ACTIVATIONS,
                        help="with --checkpoint: the towers' MLP activation, which a checkpoint does not store either "
                             "(default: from a model config beside it, whose quick_gelu or hidden_act says which, "
                             "else CLIP's quick_gelu; open_clip's own models use gelu)")
    parser.add_argument("--model-config", type=path_text,
                        help="with --checkpoint: open_clip's model JSON for it, or a transformers CLIP config.json "
                             "(default: open_clip_config.json or CHECKPOINT_STEM.json beside it; config.json beside "
                             "a transformers CLIPModel checkpoint)")


def _float_blocks(text: str) -> int | str:
    if text == AUTO_FLOAT_BLOCKS:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give {AUTO_FLOAT_BLOCKS} or a number of blocks, not {text!r}") from None


def _add_int8_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calibration-video", type=path_text,
                        help="int8: calibrate and measure drift on frames of this video, "
                             "ideally footage like the deployment's, with many of its scenes "
                             "(default: the built-in sample clip)")
    parser.add_argument("--calibration-frames", type=int, default=DEFAULT_CALIBRATION_FRAMES,
                        help="int8 calibration frames, streamed with the state carried (default %(default)s)")
    parser.add_argument("--int8-policy", choices=list(INT8_POLICIES), default=DEFAULT_INT8_POLICY,
                        help="int8: which products are quantized; " + "; ".join(
                            f"{name}: {text}" for name, text in INT8_POLICIES.items()) + " (default %(default)s)")
    parser.add_argument("--int8-activations", choices=list(INT8_ACTIVATIONS), default=DEFAULT_INT8_ACTIVATIONS,
                        help="int8: how activations are quantized; " + "; ".join(
                            f"{name}: {text}" for name, text in INT8_ACTIVATIONS.items())
                        + " (default %(default)s; give symmetric for a TensorRT int8 engine)")
    parser.add_argument("--int8-float-blocks", type=_float_blocks, default=DEFAULT_INT8_FLOAT_BLOCKS,
                        metavar="{auto,N}",
                        help=f"int8, {BACKBONE_POLICY} policy: leading image-tower blocks kept float, whose "
                             "error every later block and the adapters' state carry; auto: every block int8 first, "
                             f"then one more block float each time the drift check fails, up to "
                             f"{MAX_AUTO_FLOAT_BLOCKS} (default %(default)s)")
    parser.add_argument("--calibration-method", choices=list(CALIBRATION_METHODS), default=DEFAULT_CALIBRATION_METHOD,
                        help="int8: how activation ranges are set from the calibration frames (default "
                             "%(default)s, the least drift measured on the demo model)")
