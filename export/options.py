"""What an export is asked to do (``ExportOptions``) and the check that runs before any work.

Torch-free, so the command line checks its arguments before loading a checkpoint or torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sdqes_edge.config import DEFAULT_FPS, DEFAULT_THRESHOLD
from sdqes_edge.contract import (
    DEFAULT_OPSET,
    ENGINES_FOLDER,
    FP16,
    GRAPH_OPERATORS,
    INT8,
    MANIFEST_NAME,
    MAX_FPS,
    ONNX_RUNTIME_OPERATORS,
    PLAIN_ONNX_OPERATORS,
    PRECISIONS,
    REFERENCE_PRECISION,
    SUPPORTED_OPSETS,
    TRAINING_RECORD_NAME,
)
from sdqes_edge.errors import UserError, is_number, is_whole_number
from sdqes_edge.files import parse_json
from sdqes_edge.path_checks import path_problem
from sdqes_edge.runtime.alerts import below_every_score_words, is_probability, never_reached_words
from sdqes_edge.tokenizer import CONTEXT_LENGTH, check_query_text, default_tokenizer
from sdqes_edge.tolerances import DRIFT_FRAMES, VERIFY_FRAMES

from .precision import (
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
)

__all__ = ["ExportOptions", "Query", "check_options", "MIN_VERIFY_FRAMES"]

MIN_VERIFY_FRAMES = 16


@dataclass(frozen=True)
class Query:
    text: str
    response: str  # the alert message shown when the event starts
    label: str | None = None  # picks a per-label threshold the bundle is later given (eval --per-label)
    threshold: float | None = None  # its own alert threshold, before any other


@dataclass
class ExportOptions:
    batch: int = 1
    opset: int = DEFAULT_OPSET
    precisions: tuple[str, ...] = (REFERENCE_PRECISION,)
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
    int8_activations: str = DEFAULT_INT8_ACTIVATIONS
    int8_float_blocks: int | str = DEFAULT_INT8_FLOAT_BLOCKS  # a count, or AUTO_FLOAT_BLOCKS
    truncate_queries: bool = False
    show_progress: bool = True
    # The fp16 graph's operators (contract.GRAPH_OPERATORS): with ONNX Runtime's fused ones, fewer GPU kernels.
    fp16_operators: str = ONNX_RUNTIME_OPERATORS
    # The fp32 graph's: plain ONNX by default (any runtime); with ONNX Runtime's, the kernel library's fused steps
    # reach a CPU deployment too (a RetNet step's retention, one kernel: 1.9x at ViT-B/16 on a 2-core CPU).
    fp32_operators: str = PLAIN_ONNX_OPERATORS


# ExportOptions' numbers, as the Python API may give them: a string ("2", read from a config file) failed in a
# comparison below with a TypeError, a fraction (batch 1.5) deep inside the export.
_WHOLE_NUMBERS = ("batch", "opset", "verify_frames", "drift_frames", "calibration_frames")
_NUMBERS = ("fps", "threshold")
_SWITCHES = ("fuse_queries", "truncate_queries", "show_progress")  # "no" was taken as yes


def _type_problems(options: ExportOptions) -> list[str]:
    """What the Python API was given of the wrong type; the checks of the values need the right ones."""
    if not isinstance(options, ExportOptions):  # a dict failed on a missing attribute
        made = "ExportOptions(**options)" if isinstance(options, dict) else "ExportOptions(precisions=('fp32', 'int8'))"
        return [f"export options are an ExportOptions (sdqes_edge.export), not a {type(options).__name__}: {made}"]
    problems = [f"{name} is a whole number, not {getattr(options, name)!r}" for name in _WHOLE_NUMBERS
                if not is_whole_number(getattr(options, name))]
    problems += [f"{name} is a number, not {getattr(options, name)!r}" for name in _NUMBERS
                 if not is_number(getattr(options, name))]
    problems += [f"{name} is True or False, not {getattr(options, name)!r}" for name in _SWITCHES
                 if not isinstance(getattr(options, name), bool)]
    if isinstance(options.precisions, str):  # its letters read as precision names
        problems.append(f"precisions is a tuple of names, not the text {options.precisions!r}: "
                        f"precisions=({options.precisions!r},)")
    if isinstance(options.queries, str) or not all(isinstance(q, Query) for q in options.queries):
        problems.append("queries are Query(text, response) items: ExportOptions(queries=(Query('when I start "
                        "cooking', 'Wash your hands!'),)), with Query from sdqes_edge.export")
    return problems


def _query_problems(queries: tuple[Query, ...]) -> list[str]:
    """A query's alert message and label are text and its own threshold a probability, as the bundle's loader will
    check them (a message of 5 was written, and the bundle was then refused by every runtime)."""
    problems = [f"the alert message (response) of the query {q.text!r} is text, not {q.response!r}" for q in queries
                if not isinstance(q.response, str)]
    problems += [f"the label of the query {q.text!r} is text, not {q.label!r}" for q in queries
                 if q.label is not None and not isinstance(q.label, str)]
    problems += [f"the threshold of the query {q.text!r} is a probability sigmoid(cos) in (0, 1), not {q.threshold!r}"
                 for q in queries if q.threshold is not None and not is_probability(q.threshold)]
    problems += [f"the threshold {q.threshold:g} of the query {q.text!r} {never}" for q in queries
                 if is_probability(q.threshold) and (never := never_reached_words(q.threshold))]
    return problems


def _threshold_problems(threshold: float, warn: Callable[[str], None]) -> list[str]:
    """--threshold is a probability that scores reach: one never reached is refused, one below every score (a query
    alerting at its first frame alone) said."""
    if not 0.0 < threshold < 1.0:
        return [f"--threshold is a probability sigmoid(cos) in (0, 1), not {threshold}"]
    never = never_reached_words(threshold, "a query at it")
    if never:
        return [f"--threshold {threshold:g} {never}"]
    below = below_every_score_words(threshold, "a query at it")
    if below:
        warn(f"--threshold {threshold:g} {below}")
    return []


def check_options(options: ExportOptions, warn: Callable[[str], None],
                  context_length: int | None = CONTEXT_LENGTH) -> ExportOptions:
    """Refuse impossible options up front; resolve conflicts with a warning. Returns the options to use.

    ``context_length``: the model's text positions, which bound a query's tokens (CLIP's 77, Long-CLIP's 248);
    None before the model is known (a checkpoint not yet read), when only empty queries are refused."""
    problems = _type_problems(options)
    if problems:
        raise UserError("; ".join(problems))
    # Plain Python numbers from here on: numpy's (np.int64 from an array) would break the manifest's JSON.
    options = dataclasses.replace(options, **{name: int(getattr(options, name)) for name in _WHOLE_NUMBERS},
                                  **{name: float(getattr(options, name)) for name in _NUMBERS})
    if options.batch < 1:
        problems.append(f"--batch must be >= 1, not {options.batch}")
    if options.opset not in SUPPORTED_OPSETS:
        problems.append(f"--opset must be one of {SUPPORTED_OPSETS} (17 keeps LayerNormalization one node; "
                        f"16 for TensorRT older than 8.6), not {options.opset}")
    unknown = [p for p in options.precisions if p not in PRECISIONS]
    if unknown:
        problems.append(f"unknown precision {', '.join(unknown)}; choose from {', '.join(PRECISIONS)}")
    if options.fuse_queries and not options.queries:
        problems.append("--fuse-queries fixes the number of queries in the graph: give them with --query or "
                        "--queries-file")
    if options.verify_frames < MIN_VERIFY_FRAMES:
        problems.append(f"--verify-frames must be >= {MIN_VERIFY_FRAMES} so the state is exercised, "
                        f"not {options.verify_frames}")
    problems += _threshold_problems(options.threshold, warn)
    if not 0.0 < options.fps <= MAX_FPS:  # NaN too
        problems.append(f"--fps must be a positive number of frames per second up to {MAX_FPS:g}, not {options.fps}")
    problems += _query_problems(options.queries) + _int8_problems(options) + _operator_problems(options)
    if options.drift_frames < MIN_VERIFY_FRAMES:
        problems.append(f"--drift-frames must be >= {MIN_VERIFY_FRAMES}, not {options.drift_frames}")
    video_problem = options.calibration_video and path_problem(options.calibration_video, "file")
    if video_problem:
        problems.append(f"--calibration-video {options.calibration_video} {video_problem}; give a video file")
    if problems:
        raise UserError("; ".join(problems))
    # The queries as the runtime will take them (one function: empty or too long is refused the same way).
    if context_length is None:
        for query in options.queries:
            check_query_text(query.text)
    else:
        default_tokenizer(context_length).tokenize([q.text for q in options.queries],
                                                   on_overflow="truncate" if options.truncate_queries else "error")
    precisions = tuple(p for p in PRECISIONS if p in options.precisions)
    if REFERENCE_PRECISION not in precisions:
        warn(f"{REFERENCE_PRECISION} is always exported: it is the reference the other precisions are verified "
             "against")
        precisions = (REFERENCE_PRECISION,) + precisions
    if len(precisions) > 1 and options.drift_frames < DRIFT_FRAMES:
        warn(f"drift is measured over {options.drift_frames} frames; a recurrent state needs {DRIFT_FRAMES} or "
             "more to show drift (and fp16 LayerNorm overflow)")
    _warn_unused_int8_options(options, INT8 in precisions, warn)
    if options.fp16_operators != ONNX_RUNTIME_OPERATORS and FP16 not in precisions:
        warn(f"--fp16-operators is only used for fp16, which this export does not write; ignoring it (add "
             f"--precision {FP16} to write it)")
    return dataclasses.replace(options, precisions=precisions)


def _operator_problems(options: ExportOptions) -> list[str]:
    return [f"unknown --{flag}-operators {value}; choose from {', '.join(GRAPH_OPERATORS)}"
            for flag, value in ((FP16, options.fp16_operators), (REFERENCE_PRECISION, options.fp32_operators))
            if value not in GRAPH_OPERATORS]


def _int8_problems(options: ExportOptions) -> list[str]:
    problems = []
    if options.int8_policy not in INT8_POLICIES:
        problems.append(f"unknown --int8-policy {options.int8_policy}; choose from {', '.join(INT8_POLICIES)}")
    if options.calibration_method not in CALIBRATION_METHODS:
        problems.append(f"unknown --calibration-method {options.calibration_method}; choose from "
                        f"{', '.join(CALIBRATION_METHODS)}")
    if options.int8_activations not in INT8_ACTIVATIONS:
        problems.append(f"unknown --int8-activations {options.int8_activations}; choose from "
                        f"{', '.join(INT8_ACTIVATIONS)}")
    blocks = options.int8_float_blocks
    if blocks != AUTO_FLOAT_BLOCKS and (not isinstance(blocks, int) or blocks < 0):
        problems.append(f"--int8-float-blocks must be {AUTO_FLOAT_BLOCKS} or a count >= 0, not {blocks}")
    if options.calibration_frames < 1:
        problems.append(f"--calibration-frames must be >= 1, not {options.calibration_frames}")
    return problems


def _warn_unused_int8_options(options: ExportOptions, int8: bool, warn: Callable[[str], None]) -> None:
    """Name the int8 options given (not left at their defaults) to an export without int8: the user may have
    meant to add --precision int8."""
    given = [flag for flag, value, default in (
        ("--int8-policy", options.int8_policy, DEFAULT_INT8_POLICY),
        ("--int8-activations", options.int8_activations, DEFAULT_INT8_ACTIVATIONS),
        ("--int8-float-blocks", options.int8_float_blocks, DEFAULT_INT8_FLOAT_BLOCKS),
        ("--calibration-method", options.calibration_method, DEFAULT_CALIBRATION_METHOD),
        ("--calibration-frames", options.calibration_frames, DEFAULT_CALIBRATION_FRAMES),
        ("--calibration-video", options.calibration_video, None)) if value != default]
    if given and not int8:
        warn(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} only used for int8, which this export does "
             f"not write; ignoring {'it' if len(given) == 1 else 'them'} (add --precision int8 to write it)")
    elif options.int8_float_blocks != DEFAULT_INT8_FLOAT_BLOCKS and options.int8_policy != BACKBONE_POLICY:
        warn(f"--int8-float-blocks applies to the {BACKBONE_POLICY} policy; {options.int8_policy} "
             "quantizes every block")


def check_target(out: Path) -> None:
    """The bundle folder ``out`` may be written: new, empty, or an earlier bundle (replaced whole once the new one
    is verified). Checked before the model loads: a checkpoint of a ViT-B/16 takes a while to find that out."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory path for the bundle")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
        raise UserError(f"--out {out} is a non-empty directory that is not a bundle; choose a new path "
                        "(export only replaces an earlier bundle)")
    if out.is_dir() and (foreign := _files_export_did_not_write(out)):
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(f"--out {out} is a bundle that also holds files export did not write ({shown}); export "
                        "replaces the folder whole, so they would be deleted: move them out, or choose another --out")


def _files_export_did_not_write(bundle: Path) -> list[str]:
    """Files in an earlier bundle that are none of its own: not the manifest or a file it lists, not the training
    record, not an engine (derived from the graphs being replaced). A checkpoint kept beside the bundle's files,
    the very one being exported, was deleted with the folder."""
    try:
        listed = set(parse_json((bundle / MANIFEST_NAME).read_text()).get("files", {}))
    except (OSError, ValueError, AttributeError):  # a damaged manifest: a bundle to replace all the same
        listed = set()
    own = listed | {MANIFEST_NAME, TRAINING_RECORD_NAME}
    return sorted(name for name in (p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())
                  if name not in own and not name.startswith(f"{ENGINES_FOLDER}/"))


def left_behind(out: Path) -> list[str]:
    """What an earlier bundle at ``out`` holds that the new one will not, in words: each a warning of its own."""
    return [words for words in (thresholds_left_behind(out), engines_left_behind(out)) if words]


def engines_left_behind(out: Path) -> str | None:
    """The TensorRT engines ``build-engine`` made of an earlier bundle at ``out`` (minutes each on a Jetson), in
    words; None if none. They were built from the graphs being replaced and go with them: they had gone without a
    word, and the next `run --backend trt` found none."""
    folder = out / ENGINES_FOLDER
    # Names alone are read, and not through a link: a bundle's folder that leads out of it is not looked into.
    engines = sorted(folder.glob("*/step.*.engine")) if folder.is_dir() and not folder.is_symlink() else []
    if not engines:
        return None
    built = ", ".join(f"{engine.parent.name} {engine.name.split('.')[1]}" for engine in engines)
    precisions = sorted({engine.name.split(".")[1] for engine in engines})
    again = "; ".join(f"sdqes-edge build-engine {out} --precision {precision}" for precision in precisions)
    return (f"--out {out} holds TensorRT engines built from the graphs it replaces ({built}), which go with them: "
            f"build them again on each device ({again})")


def thresholds_left_behind(out: Path) -> str | None:
    """What an earlier bundle at ``out`` was given after its export by ``eval --write-threshold`` (a calibrated
    threshold, thresholds per label, an alert policy), which the new bundle will not have, in words; None if nothing.
    Export writes the thresholds it is given, for a model that may score otherwise, so they are not carried over;
    but they were replaced without a word."""
    try:
        thresholds = parse_json((out / MANIFEST_NAME).read_text())["thresholds"]
        chosen = sorted(set(thresholds) - {"default"})  # export writes the default alone
    except (OSError, ValueError, KeyError, TypeError):  # no bundle there, or a damaged one: nothing to keep
        return None
    if not chosen:
        return None
    kept = [f"default {thresholds['default']:.4g}" if is_number(thresholds.get("default")) else "a default"]
    if isinstance(thresholds.get("per_label"), dict) and thresholds["per_label"]:
        kept.append(f"{len(thresholds['per_label'])} per label")
    if thresholds.get("policy"):
        kept.append("an alert policy")
    return (f"--out {out} holds alert thresholds chosen after its export ({', '.join(kept)}; eval --write-threshold), "
            "which the new bundle does not keep, since its model may score otherwise: choose them again with "
            f"`sdqes-edge eval ... --calibrate --write-threshold {out}`")
