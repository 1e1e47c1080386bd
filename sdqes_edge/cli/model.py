"""Model commands: ``info`` (shapes, parameters, state), ``check`` (step form == window form), ``tokenize``."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

from sdqes_edge.cli.common import (
    PROG,
    UniqueValues,
    add_adapter_option,
    add_subcommand,
    at_least,
    model_from_args,
    path_text,
    seed_number,
    show,
)
from sdqes_edge.config import ADAPTER_KINDS, PRESETS, ModelConfig, preset, with_authors_adapter
from sdqes_edge.errors import UserError
from sdqes_edge.files import format_bytes
from sdqes_edge.tolerances import SOAK_BLOCK_FRAMES


def cmd_info(args: argparse.Namespace) -> int:
    if args.list_presets:
        for name, cfg in PRESETS.items():
            v = cfg.vision
            print(f"{name:22s} {v.image_size}px/{v.patch_size} width {v.width} x{v.layers} layers, "
                  f"embed {cfg.embed_dim}, adapter {cfg.adapter.kind}")
        print(f"\nnext: {PROG} info --preset clip-vit-b16 --adapter qrnn")
        return 0
    model, source = model_from_args(args)
    cfg: ModelConfig = model.cfg
    visual_params = sum(p.numel() for p in model.visual.parameters())
    adapter_params = model.visual.adapter_parameters()
    text_params = sum(p.numel() for p in model.text.parameters())
    spec = model.state_spec(1)
    if args.json:
        print(json.dumps({"source": source, "config": cfg.to_dict(), "params": {
            "image_tower": visual_params, "adapters": adapter_params, "text_tower": text_params},
            "state_spec": spec.to_list(), "state_bytes_per_stream": spec.nbytes}, indent=2))
        return 0
    print(f"model      {cfg.name}  from {source}")
    print(f"image      {cfg.vision.image_size}px, patch {cfg.vision.patch_size}, width {cfg.vision.width}, "
          f"{cfg.vision.layers} layers, {cfg.vision.heads} heads, {cfg.vision.num_tokens} tokens/frame")
    print(f"text       width {cfg.text.width}, {cfg.text.layers} layers, {cfg.text.heads} heads, "
          f"context {cfg.text.context_length}")
    a = cfg.adapter
    detail = "" if a.kind == "none" else (f", {a.per_block} per block, ratio {a.ratio}, lookback {a.lookback}"
                                          + (f", QRNN down-projecting to hidden ratio {a.qrnn_hidden_ratio}"
                                             if a.kind == "qrnn" and a.qrnn_downsample else ""))
    print(f"adapter    {a.kind}{detail}")
    print(f"params     image tower {visual_params / 1e6:.2f}M (adapters {adapter_params / 1e6:.2f}M), "
          f"text tower {text_params / 1e6:.2f}M")
    print(f"state      {len(spec)} tensors, {format_bytes(spec.nbytes)} per stream")
    for t in list(spec)[: args.show_state]:
        print(f"  {t.input_name:44s} {list(t.shape)}")
    if len(spec) > args.show_state:
        print(f"  ... {len(spec) - args.show_state} more (--show-state N, or --json for all)")
    if args.checkpoint:  # a model of one's own: its bundle is what comes next
        show(f"\nnext: {PROG} export --checkpoint {args.checkpoint} --out bundles/{cfg.name.replace('+', '-')}")
    else:
        print(f"\nnext: {PROG} check   (step form against window form for every adapter kind)")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Step form against window form, for every adapter kind, with the state carried over many frames."""
    import torch

    from sdqes_edge.model import SDQESModel
    from sdqes_edge.model.init import randomize_adapters
    from sdqes_edge.sample import TORCH_WINDOW_ACTIVATIONS, check_fits_in_memory, preprocessed_bytes, window_bytes
    from sdqes_edge.tolerances import FP32_EMBEDDING_ATOL

    base = preset(args.preset)
    if base.adapter.kind != "none":
        raise UserError(f"--preset {args.preset} already has an adapter; give a base preset such as 'tiny'")
    if args.soak and (args.soak < 2 * args.soak_block or args.soak_block < 1):
        raise UserError(f"--soak {args.soak} needs at least two blocks of --soak-block {args.soak_block} frames "
                        "(the first is the warm-up)")
    # The window form holds every frame of every stream at once (the frames twice: once altered), where a long
    # --frames used to end in PyTorch's allocation traceback, or a large --batch in the kernel's SIGKILL.
    frames = args.batch * args.frames
    check_fits_in_memory(2 * preprocessed_bytes(frames, base.vision.image_size)
                         + window_bytes(base.vision, frames, TORCH_WINDOW_ACTIVATIONS),
                         f"{args.batch} stream(s) of {args.frames} frames at {base.vision.image_size} px")
    torch.manual_seed(args.seed)
    print(f"step form vs window form: preset {base.name}, batch {args.batch}, {args.frames} frames, "
          f"random adapter weights (seed {args.seed}); tolerance {FP32_EMBEDDING_ATOL:g}")
    print(f"{'adapter':8s} {'per block':>9s} {'max |step - window|':>20s} {'state/stream':>13s} "
          f"{'history matters':>15s} {'time':>7s}  result")
    failures = 0
    for kind in args.adapters:
        for per_block in (1, 2):
            if kind == "none" and per_block == 2:
                continue
            cfg = base if kind == "none" else with_authors_adapter(base, kind, per_block=per_block)
            model = randomize_adapters(SDQESModel(cfg).eval(), seed=args.seed)
            frames = torch.randn(args.batch, args.frames, 3, cfg.vision.image_size, cfg.vision.image_size)
            start = time.perf_counter()
            with torch.no_grad():
                window = model.forward_clip(frames)
                steps, _ = model.step_frames(frames)
                # Does the last embedding depend on an earlier frame? It must for temporal adapters.
                altered = frames.clone()
                altered[:, -2] += 1.0
                moved = (model.forward_clip(altered)[:, -1] - window[:, -1]).abs().max().item()
            err = (steps - window).abs().max().item()
            ok = err <= FP32_EMBEDDING_ATOL
            failures += not ok
            print(f"{kind:8s} {per_block if kind != 'none' else '-':>9} {err:20.2e} "
                  f"{format_bytes(model.state_spec(1).nbytes):>13s} {('yes' if moved > 1e-6 else 'no'):>15s} "
                  f"{time.perf_counter() - start:6.2f}s  {'ok' if ok else 'FAIL'}")
    if failures:
        print(f"\n{failures} configuration(s) outside tolerance")
        return 1
    if args.soak:
        failures += _soak_table(base, args)
    if failures:
        return 1
    print(f"\nall forms agree. next: {PROG} info --preset clip-vit-b16 --adapter qrnn")
    return 0


def _soak_table(base: ModelConfig, args: argparse.Namespace) -> int:
    """Export each adapter kind and stream --soak frames through the whole runtime loop: state and memory."""
    import tempfile
    from pathlib import Path

    from sdqes_edge.export import ExportOptions, export_bundle
    from sdqes_edge.model import SDQESModel
    from sdqes_edge.model.init import randomize_adapters
    from sdqes_edge.runtime.soak import soak_bundle
    from sdqes_edge.tolerances import SOAK_RSS_GROWTH_BYTES, SOAK_STATE_GROWTH

    print(f"\nlong stream through the runtime: {args.soak} frames per adapter kind (exported, 2 adapters per "
          f"block, random adapter weights), max |state| per {args.soak_block} frames. Each state tensor's "
          f"largest in the later half of the blocks may be at most {SOAK_STATE_GROWTH:g}x the earlier half's; "
          f"memory must stay within {SOAK_RSS_GROWTH_BYTES / 2**20:.0f} MiB of its level after the first block")
    failures = 0
    for kind in args.adapters:
        cfg = base if kind == "none" else with_authors_adapter(base, kind, per_block=2)
        model = randomize_adapters(SDQESModel(cfg).eval(), args.seed)
        with tempfile.TemporaryDirectory(prefix="sdqes-soak-bundle-") as tmp:
            bundle = Path(tmp) / kind
            export_bundle(model, bundle, ExportOptions(show_progress=False), log=lambda message: None)
            print(f"{kind}:")
            report = soak_bundle(bundle, args.soak, block=args.soak_block, seed=args.seed, log=print)
        failures += not report.ok
        growth = "bounded" if report.bounded else f"GROWING: {report.growing_state}"
        print(f"{kind}: state {'finite' if report.finite else 'NOT FINITE'}, largest {report.max_state_abs:.4g}, "
              f"growth {report.state_growth:.3g}x ({growth}); memory after warm-up "
              f"{report.rss_growth_bytes / 2**20:+.1f} MiB ({'flat' if report.flat else 'GROWING'}); "
              f"{report.frames / report.seconds:.0f} frames/s  {'ok' if report.ok else 'FAIL'}")
    return failures


def cmd_tokenize(args: argparse.Namespace) -> int:
    from sdqes_edge.tokenizer import default_tokenizer

    if args.bundle:  # the bundle's own tokenizer, as its text encoder builds it (the text graph is not loaded)
        from sdqes_edge.runtime.bundle import load_bundle
        from sdqes_edge.runtime.queries import text_encoder_for

        tok = text_encoder_for(load_bundle(args.bundle)).tokenizer
    else:
        tok = default_tokenizer()
    ids = tok.tokenize(args.text, on_overflow="truncate" if args.truncate_queries else "error")
    for text, row in zip(args.text, ids):
        used = [int(i) for i in row if i != 0]
        print(f"{len(used):3d} tokens  {used}  {text!r}")
    if len(args.text) > 2 and all(len(text.split()) == 1 for text in args.text):  # `tokenize when I start cooking`
        print(f"{PROG}: note: each argument is a query of its own; quote a query of several words: {PROG} tokenize "
              f"{shlex.quote(' '.join(args.text))}", file=sys.stderr)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    info = add_subcommand(sub, "info", "describe a model: shapes, parameters, streaming state",
                          "Describe a preset or a checkpoint: dimensions, parameter counts and the streaming state "
                          "it carries per stream.",
                          examples=("--preset clip-vit-b16 --adapter qrnn", "--checkpoint epoch=9.ckpt --json",
                                    "--list-presets"))
    src = info.add_mutually_exclusive_group()
    src.add_argument("--preset", default="clip-vit-b16", help="preset name (default %(default)s)")
    src.add_argument("--checkpoint", type=path_text,
                     help="OpenAI CLIP / open_clip / Long-CLIP / transformers CLIPModel (sharded: its .index.json) "
                          "/ SDQES Lightning checkpoint; config inferred")
    add_adapter_option(info)
    info.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    info.add_argument("--show-state", type=at_least(0), default=6, metavar="N", help="state tensors to list (default "
                                                                             "%(default)s)")
    info.add_argument("--json", action="store_true", help="print everything as JSON")
    info.set_defaults(func=cmd_info)

    check = add_subcommand(sub, "check", "verify step form == window form for every adapter kind",
                           "Run the step form frame by frame with the state carried over, and the window form over "
                           "the same frames, for each adapter kind with 1 and 2 adapters per block; print the "
                           "largest difference.", examples=("", "--adapters qrnn st --frames 64 --soak 100000"))
    check.add_argument("--preset", default="tiny", help="base preset without adapter (default %(default)s)")
    check.add_argument("--adapters", nargs="+", action=UniqueValues, choices=ADAPTER_KINDS, default=list(ADAPTER_KINDS),
                       help="adapter kinds to check (default: all)")
    # Each refused in one line naming it ("--frames must be >= 2 and --batch >= 1" named both, whichever was wrong).
    check.add_argument("--frames", type=at_least(2), default=16, help="frames per stream (default %(default)s)")
    check.add_argument("--batch", type=at_least(1), default=2, help="streams in a batch (default %(default)s)")
    check.add_argument("--seed", type=seed_number, default=0, help="seed of the random adapter weights and frames "
                                                           "(default %(default)s)")
    check.add_argument("--soak", type=int, default=0, metavar="N",
                       help="also export each adapter kind and stream N frames through the whole runtime loop "
                            "(sinks included), reporting the state's magnitude and the process memory per block "
                            "(e.g. 100000; about a minute per kind per 100000 frames)")
    check.add_argument("--soak-block", type=at_least(1), default=SOAK_BLOCK_FRAMES, metavar="N",
                       help="frames per reported block of the soak; the first is the warm-up (default %(default)s)")
    check.set_defaults(func=cmd_check)

    tok = add_subcommand(sub, "tokenize", "show CLIP token ids of queries",
                         "Tokenize queries exactly as CLIP does (start/end tokens; 77 positions, or as many as a "
                         "bundle's text tower has: 248 for Long-CLIP).",
                         examples=("'When I start cooking, remind me to wash my hands.'",
                                   "--bundle bundles/longclip 'a query of up to 248 tokens'"))
    tok.add_argument("text", nargs="+", help="one or more queries")
    tok.add_argument("--bundle", type=path_text, help="count against this bundle's text positions (default: CLIP's 77)")
    tok.add_argument("--truncate-queries", action="store_true",
                     help="cut queries over the limit (with a warning) instead of refusing them")
    tok.set_defaults(func=cmd_tokenize)
