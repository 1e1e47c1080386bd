"""Accuracy on held-out synthetic test streams: per adapter kind (over seeds) and per deployment format.

Two tables, both from ``sdqes-edge accuracy``:

- adapters: one model per adapter kind and training seed (``training.train``),
  SR@1 / SR@3 / SMD@1 at [-5, +10] s on single-frame and temporal event types
  separately, each seed reported and the spread (max - min) across seeds;
- formats: for each kind asked for, its first seed's checkpoint scored by
  PyTorch, and exported to a bundle and scored by ONNX Runtime fp32, fp16 and
  int8 with the state carried over every test stream, all at the threshold
  calibrated on validation; int8 is the graph the exporter shipped after its
  drift check, or, where it refused, the same quantization labelled so.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np

from sdqes_edge.contract import FP16, FP32, INT8, MANIFEST_NAME, PRECISIONS, step_graph_name
from sdqes_edge.files import parse_json, write_text_atomically
from sdqes_edge.training import (
    SplitMetrics,
    StreamSet,
    TrainOptions,
    make_splits,
    query_catalogue,
    score_split,
    split_metrics,
    torch_scorers,
    train,
    training_command,
)

from .timing import machine

GROUPS = ("single_frame", "temporal")
METRICS = ("SR@1", "SR@3", "SMD@1")
REPORT_NAME = "accuracy.json"  # beside accuracy.md; held by the command line for its run (one run per --out)


def adapter_runs(base: TrainOptions, kinds: list[str], seeds: list[int], out: Path, log: Callable[[str], None],
                 splits: Callable[[], dict[str, StreamSet]], progress: Callable | None = None) -> dict:
    """Train every (kind, seed) on the same splits (made by ``splits()`` once, when a run needs them);
    returns {kind: {seed: record}}."""
    runs: dict[str, dict[int, dict]] = {}
    for kind in kinds:
        for seed in seeds:
            record = trained_run(replace(base, adapter=kind, seed=seed), out / f"{kind}-seed{seed}", log, splits,
                                 progress)
            runs.setdefault(kind, {})[seed] = record
    return runs


def trained_run(options: TrainOptions, run_dir: Path, log: Callable[[str], None],
                splits: Callable[[], dict[str, StreamSet]], progress: Callable | None, say_reused: bool = True) -> dict:
    """The record of the run of ``options`` in ``run_dir``: the one finished there with exactly these options (an
    interrupted table resumes; said unless ``say_reused`` is False), else trained now. A run there with other options
    (an earlier table's --steps) is trained again and said: reused, its model had been scored under this table's
    recipe."""
    record, why_not = _finished_record(run_dir, options)
    if record is not None:
        if say_reused:
            log(f"{options.adapter} seed {options.seed}: reusing the finished run in {run_dir}")
        return record
    if why_not:
        log(f"note: {run_dir} {why_not}; it is trained again with these")
    return train(options, run_dir, log=log, progress=progress, data=splits()).record


def _finished_record(run_dir: Path, options: TrainOptions) -> tuple[dict | None, str | None]:
    """(the record of the run finished in ``run_dir`` with exactly ``options``, or None; where a finished run is
    there but is not that one, why)."""
    name = options.model_config().name
    path = run_dir / f"{name}.record.json"
    if not (path.is_file() and (run_dir / f"{name}.pt").is_file()):
        return None, None
    wanted = json.loads(json.dumps(asdict(options)))
    try:  # our own file, but a file: an edit or a copy cut short is a run to train again, not a traceback
        record = parse_json(path.read_text())
        found = record["options"]
        differ = [f"--{option.replace('_', '-')} {found.get(option)}, not {value}"
                  for option, value in wanted.items() if found.get(option) != value]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, f"holds a run whose record {path.name} cannot be read"
    return (record, None) if not differ else (None, f"holds a run trained with other options ({', '.join(differ)})")


def adapter_table(runs: dict[str, dict[int, dict]]) -> str:
    """Markdown: per kind and event group, every seed's SR@1, the mean and the spread; SR@3 and SMD@1 means."""
    lines = ["| adapter | events | SR@1 per seed | SR@1 mean | SR@1 spread | SR@3 mean | SMD@1 mean |",
             "|---|---|---|---|---|---|---|"]
    for kind, by_seed in runs.items():
        for group in GROUPS:
            values = {m: [r["test"][group][m] for r in by_seed.values()] for m in METRICS}
            per_seed = " / ".join(f"{v:.1f}" for v in values["SR@1"])
            lines.append(f"| {kind} | {group.replace('_', '-')} | {per_seed} | {np.mean(values['SR@1']):.1f} | "
                         f"{np.ptp(values['SR@1']):.1f} | {np.mean(values['SR@3']):.1f} | "
                         f"{np.mean(values['SMD@1']):.1f} |")
    return "\n".join(lines)


def temporal_verdict(runs: dict[str, dict[int, dict]]) -> str:
    """Acceptance 1 of the issue: does the best temporal adapter beat mlp and none on temporal SR@1 by more than
    the spread across seeds?"""
    def sr(kind: str) -> list[float]:
        return [r["test"]["temporal"]["SR@1"] for r in runs[kind].values()]

    temporal = [k for k in runs if k in ("st", "qrnn", "retnet")]
    baselines = [k for k in runs if k in ("none", "mlp")]
    if not temporal or not baselines:
        return "needs a temporal adapter and a baseline (none or mlp) to compare"
    best = max(temporal, key=lambda k: np.mean(sr(k)))
    spread = max(np.ptp(sr(k)) for k in [best, *baselines])
    parts = []
    for b in baselines:
        margin = np.mean(sr(best)) - np.mean(sr(b))
        parts.append(f"{best} - {b} = {margin:+.1f} points ({'beats' if margin > spread else 'does NOT beat'} "
                     f"the largest seed spread {spread:.1f})")
    return "temporal events, SR@1 means: " + "; ".join(parts)


# --- per deployment format -----------------------------------------------------------------

def ort_scorers(bundle_dir: Path, precision: str, step_graph: Path | None = None) -> tuple[Callable, Callable]:
    """ONNX Runtime embedders for ``score_split``: the bundle's step graph (or ``step_graph``) with its state fed
    back each frame, and the bundle's text graph."""
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
    from sdqes_edge.runtime.queries import TextEncoder

    bundle = load_bundle(bundle_dir)
    step = OnnxRuntimeStep(step_graph or bundle.step_graph(precision))
    text = TextEncoder(bundle.text_graph, bundle.tokenizer_vocab, bundle.manifest["model"]["text"]["context_length"])

    def embed_stream(frames: np.ndarray) -> np.ndarray:
        state, out = step.initial_state(), []
        for frame in frames:
            result = step.step(frame[None], state)
            out.append(result.embedding[0])
            state = result.state
        return np.stack(out)

    def encode_queries(texts: list[str]) -> np.ndarray:
        return np.stack([text.encode(t) for t in texts])

    return embed_stream, encode_queries


def export_formats(model, bundle_dir: Path, threshold: float, base: TrainOptions, log: Callable[[str], None],
                   checkpoint: dict | None = None, training_record: dict | None = None
                   ) -> tuple[list[str], dict[str, str]]:
    """Export fp32 + fp16 + int8, int8 calibrated on a training stream (the deployment's domain, never a test
    stream); (the precisions shipped, {precision: why the exporter refused it}). A reduced precision that drifts
    beyond its tolerance is left out and the export made again without it. ``checkpoint`` (file, sha256,
    source_format) is recorded in the manifest: a bundle there already is read back only if it was exported from
    the same checkpoint at the same threshold and rate. ``training_record`` goes into the bundle, as `export` puts
    it there."""
    from sdqes_edge.export.drift import VariantDriftError
    from sdqes_edge.export.exporter import ExportOptions, export_bundle

    refusals = bundle_dir.parent / "refused.json"
    manifest = _bundle_of(bundle_dir, checkpoint, threshold, base.fps)
    if manifest is not None and (refused := _refusals_of(refusals, manifest["graphs"]["step"])) is not None:
        return sorted(manifest["graphs"]["step"]), refused
    # What an earlier model's export left: its refusals and the graphs made to score them.
    for stale in (refusals, *bundle_dir.parent.glob("step.*.refused.onnx")):
        stale.unlink(missing_ok=True)
    bundle_dir.parent.mkdir(parents=True, exist_ok=True)
    calibration = write_calibration_video(bundle_dir.parent / "calibration.avi", base)
    precisions, refused = list(PRECISIONS), {}
    log(f"exporting to {bundle_dir} (fp32, fp16, int8 calibrated and checked for drift on training streams)")
    while True:
        options = ExportOptions(precisions=tuple(precisions), threshold=threshold, fps=base.fps,
                                calibration_video=calibration, show_progress=False)
        try:
            export_bundle(model, bundle_dir, options, checkpoint=checkpoint, training_record=training_record)
            break
        except VariantDriftError as exc:
            log(f"{exc.precision} refused: {exc}")
            refused[exc.precision] = str(exc)
            precisions.remove(exc.precision)
    write_text_atomically(refusals, json.dumps(refused, indent=2))
    return sorted(precisions), refused


def _refusals_of(path: Path, shipped) -> dict[str, str] | None:
    """The exporter's refusals written beside a bundle read back ({precision: why}), if they account for every
    precision the bundle lacks; None where they are unreadable (a copy cut short: the table had ended in a
    JSONDecodeError traceback) or do not (a deleted file: the refused precision's row was left out of the table
    without a word), and then the bundle is exported again."""
    try:
        refused = parse_json(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return None
    if not isinstance(refused, dict) or not all(isinstance(why, str) for why in refused.values()):
        return None
    return refused if set(refused) == set(PRECISIONS) - set(shipped) else None


def _bundle_of(bundle_dir: Path, checkpoint: dict | None, threshold: float, fps: float) -> dict | None:
    """The manifest of the bundle in ``bundle_dir`` if it was exported from ``checkpoint`` at ``threshold`` and
    ``fps``; else None. A model trained again into its run's folder had been scored by ONNX Runtime from the bundle
    of the model it replaced, a gap between PyTorch's row and the others that no export made."""
    try:  # a damaged manifest: a bundle to export again, as export replaces it
        manifest = parse_json((bundle_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    same = (manifest.get("checkpoint") == checkpoint and manifest.get("thresholds", {}).get("default") == threshold
            and manifest.get("fps") == fps)
    return manifest if same else None


def write_calibration_video(path: Path, base: TrainOptions) -> Path:
    """Training streams back to back, long enough for the exporter's drift check: the deployment's domain,
    never a test stream."""
    from sdqes_edge.synthetic import Stream, generate_stream, write_video
    from sdqes_edge.tolerances import DRIFT_FRAMES
    from sdqes_edge.train_options import split_seeds

    per_stream = int(base.stream_seconds * base.fps)
    streams = [generate_stream(seed, base.stream_seconds, base.fps)
               for seed in split_seeds("train", -(-DRIFT_FRAMES // per_stream))]
    return write_video(path, Stream("calibration", np.concatenate([s.frames for s in streams]), base.fps, []))


def unshipped_graph(precision: str, model, bundle_dir: Path, base: TrainOptions) -> Path:
    """The graph the exporter refused to ship, made the same way (for measuring its accuracy only)."""
    from sdqes_edge.export import graphs
    from sdqes_edge.export.precision import DEFAULT_CALIBRATION_FRAMES, quantize_int8
    from sdqes_edge.runtime.preprocess import Preprocessor
    from sdqes_edge.runtime.sources import frames_spread_over

    path = bundle_dir.parent / f"step.{precision}.refused.onnx"
    if path.is_file():
        return path
    if precision == FP16:
        graphs.export_step_graph(model, path, precision=FP16, fps=base.fps)
        return path
    video = bundle_dir.parent / "calibration.avi"  # written by export_formats, which runs first
    if not video.is_file():
        write_calibration_video(video, base)
    raw = frames_spread_over(video, DEFAULT_CALIBRATION_FRAMES)
    frames = Preprocessor.from_config(model.cfg).batch(raw)[:, None]  # [N, 1, 3, R, R]
    quantize_int8(bundle_dir / step_graph_name(FP32), path, frames)
    return path


def format_rows(checkpoint: Path, test: StreamSet, threshold: float, bundle_dir: Path, base: TrainOptions,
                log: Callable[[str], None]) -> tuple[dict[str, SplitMetrics], str | None]:
    """PyTorch, then ORT fp32 / fp16 / int8 from one exported bundle, all at ``threshold``."""
    from sdqes_edge.checkpoints import load_model

    model, loaded = load_model(str(checkpoint))
    rows = {"PyTorch (fp32)": split_metrics(score_split(test, *torch_scorers(model)), threshold)}
    source = {"file": checkpoint.name, "sha256": loaded.sha256, "source_format": loaded.source_format}
    precisions, refused = export_formats(model, bundle_dir, threshold, base, log, checkpoint=source,
                                         training_record=loaded.training_record)
    for precision in PRECISIONS:
        if precision in precisions:
            rows[f"ONNX Runtime {precision}"] = split_metrics(score_split(test, *ort_scorers(bundle_dir, precision)),
                                                              threshold)
        elif precision in refused:
            graph = unshipped_graph(precision, model, bundle_dir, base)
            rows[f"ONNX Runtime {precision} (refused by export)"] = split_metrics(
                score_split(test, *ort_scorers(bundle_dir, FP32, step_graph=graph)), threshold)
    return rows, refused


def format_table(rows: dict[str, SplitMetrics]) -> str:
    lines = ["| format | SR@1 all | SR@1 single-frame | SR@1 temporal | SR@3 all | SMD@1 all | SR@1 vs PyTorch |",
             "|---|---|---|---|---|---|---|"]
    reference = next(iter(rows.values())).to_dict()["all"]["SR@1"]
    for name, metrics in rows.items():
        d = metrics.to_dict()
        lines.append(f"| {name} | {d['all']['SR@1']:.1f} | {d['single_frame']['SR@1']:.1f} | "
                     f"{d['temporal']['SR@1']:.1f} | {d['all']['SR@3']:.1f} | {d['all']['SMD@1']:.1f} | "
                     f"{d['all']['SR@1'] - reference:+.1f} |")
    return "\n".join(lines)


def checkpoint_path(out: Path, base: TrainOptions, kind: str, seed: int) -> Path:
    """Where the run of ``kind`` and ``seed`` leaves its checkpoint under the results folder ``out``."""
    return out / "runs" / f"{kind}-seed{seed}" / f"{replace(base, adapter=kind).model_config().name}.pt"


def format_section(kind: str, seed: int, base: TrainOptions, out: Path, splits: Callable[[], dict[str, StreamSet]],
                   log: Callable[[str], None], progress: Callable | None,
                   in_adapter_table: bool = False) -> tuple[list[str], dict]:
    """The per-format table of one kind's ``seed`` model (trained here if the kind table did not): Markdown
    lines and the report's entry. ``in_adapter_table``: this run's adapter table has trained or taken back that
    model already, and said so."""
    checkpoint = checkpoint_path(out, base, kind, seed)
    run_dir = checkpoint.parent
    # A checkpoint there trained with other options had been scored as this table's (a run of --steps 20 under a
    # table of --steps 40): each format's row is of the model this table's recipe trains.
    record = trained_run(replace(base, adapter=kind, seed=seed), run_dir, log, splits, progress,
                         say_reused=not in_adapter_table)
    rows, refused = format_rows(checkpoint, splits()["test"], record["threshold"], run_dir / "bundle", base, log)
    md = [f"## Per deployment format ({kind}, seed {seed})", "", format_table(rows), ""]
    for precision, why in refused.items():
        md += [f"{precision}: the exporter refused to ship this graph ({why}); its row scores the same graph made "
               "outside the bundle, to show what the refusal protects against.", ""]
    manifest = json.loads((run_dir / "bundle" / MANIFEST_NAME).read_text())
    shipped = manifest["graphs"]["step"].get(INT8)
    if shipped:
        drift, how = shipped["verification"], shipped["quantization"]
        md += [f"int8 as shipped ({how['policy']} policy, {how['activations']} activations, "
               f"{how['quantized_products']} products int8, {how['float_blocks']} leading block(s) float): over "
               f"{drift['frames']} frames of training streams, min cosine {drift['min_cosine']:.4f} against fp32.", ""]
    return md, {"rows": {name: m.to_dict() for name, m in rows.items()}, "refused": refused}


def run(base: TrainOptions, kinds: list[str], seeds: list[int], format_kinds: list[str], out: Path,
        log: Callable[[str], None] = print, progress: Callable | None = None) -> Path:
    """Both tables; writes accuracy.md and accuracy.json under ``out``. Returns the Markdown path."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, StreamSet] = {}

    def splits() -> dict[str, StreamSet]:
        """Every run and the format rows share one generation of the splits (a resumed table may need none)."""
        if not made:
            made.update(make_splits(base, base.model_config(), query_catalogue(), progress))
        return made

    runs = adapter_runs(base, kinds, seeds, out / "runs", log, splits, progress) if kinds else {}
    host = machine()
    report = {"options": asdict(base), "kinds": kinds, "seeds": seeds, "machine": host,
              "adapters": {k: {str(s): r["test"] for s, r in v.items()} for k, v in runs.items()}}
    md = ["# Accuracy on held-out synthetic test streams", "",
          f"Training: `{training_command(base)}`, with --adapter and --seed varied; SR@k in percent at [-5, +10] s, "
          "SMD@1 in frames (1 fps); threshold calibrated on validation streams. Measured on "
          f"{host['cpu']} ({host['cores']} cores, int8 on {host['int8_instructions']}); torch {host['torch']}, "
          f"onnxruntime {host['onnxruntime']}.", ""]
    if runs:
        md += ["## Per adapter kind (each training seed)", "", adapter_table(runs), "", temporal_verdict(runs), ""]
        report["temporal_verdict"] = temporal_verdict(runs)
        _write(out, md, report)  # the adapter table stands even if the format part fails
    report["formats"] = {}
    for kind in format_kinds:
        section, report["formats"][kind] = format_section(kind, seeds[0], base, out, splits, log, progress,
                                                          in_adapter_table=kind in kinds)
        md += section
        _write(out, md, report)  # each finished kind stands even if a later one fails
    report["seconds"] = round(time.perf_counter() - started, 1)
    return _write(out, md, report)


def _write(out: Path, md: list[str], report: dict) -> Path:
    write_text_atomically(out / REPORT_NAME, json.dumps(report, indent=2))
    return write_text_atomically(out / "accuracy.md", "\n".join(md) + "\n")
