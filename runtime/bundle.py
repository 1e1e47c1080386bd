"""Reading a deployment bundle: manifest checked against its schema, every file against its sha256.

What a bundle holds is the contract's (``sdqes_edge.contract``); this module only reads it.
Torch-free: numpy and jsonschema only.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import jsonschema
import numpy as np

from sdqes_edge.contract import (
    BUNDLE_FORMAT_VERSION,
    MANIFEST_NAME,
    METADATA_KEY,
    PRECISIONS,
    REFERENCE_PRECISION,
    STATE_INPUT_PREFIX,
    STATE_OUTPUT_PREFIX,
    TRAINING_RECORD_NAME,
    manifest_schema,
    state_names_in,
)
from sdqes_edge.errors import UserError
from sdqes_edge.files import file_sha256, npz_problem, parse_json, write_text_atomically
from sdqes_edge.path_checks import as_path, path_problem
from sdqes_edge.state import StateSpec

from .alerts import AlertPolicy, check_number, check_texts, is_probability
from .graph_files import NotAGraph, external_data_locations, metadata_props
from .output_locks import hold_bundle, release


class BundleError(UserError):
    """A bundle that cannot be used as it is; the message names the file and the fix."""


def _reexport_hint(root: Path) -> str:
    return f"re-export it (sdqes-edge export ... --out {root})"


@dataclass(frozen=True)
class Bundle:
    """A bundle read and checked by ``load_bundle``."""

    root: Path
    manifest: dict[str, Any] = None  # None only to refuse Bundle(path) in words

    def __post_init__(self) -> None:
        if self.manifest is None:  # Bundle(path) failed as "missing 1 required positional argument: 'manifest'"
            raise UserError(f"a bundle is read with load_bundle({str(self.root)!r}), which checks its manifest and "
                            "the sha256 of every file; StreamingDetector and make_backend take its path too")

    @property
    def state_spec(self) -> StateSpec:
        return StateSpec.from_list(self.manifest["state"])

    @property
    def fps(self) -> float:
        return float(self.manifest["fps"])

    @property
    def model_identity(self) -> str:
        """The model this bundle holds, whatever precision runs: the sha256 of its fp32 step graph (weights and
        architecture). What a state snapshot or a folder of score traces is tied to."""
        return self.manifest["files"][self.manifest["graphs"]["step"][REFERENCE_PRECISION]["file"]]["sha256"]

    @property
    def image_size(self) -> int:
        return int(self.manifest["image_size"])

    @property
    def default_threshold(self) -> float:
        return float(self.manifest["thresholds"]["default"])

    @property
    def label_thresholds(self) -> dict[str, float]:
        """Thresholds chosen per query label (``eval --calibrate --per-label``): {} where none were chosen."""
        return {label: float(t) for label, t in self.manifest["thresholds"].get("per_label", {}).items()}

    def threshold_for(self, label: str | None) -> float:
        """A query's threshold: its label's, where one was chosen for that label, else the default (as ``eval``
        scores a per-label calibration: labels with too few queries to calibrate take the default)."""
        return self.label_thresholds.get(label, self.default_threshold) if label else self.default_threshold

    def policy_for(self, label: str | None = None, threshold: float | None = None,
                   exit_threshold: float | None = None, cooldown_s: float | None = None,
                   max_alerts: int | None = None) -> AlertPolicy:
        """A query's alert policy: what is given, else what the bundle recorded (its threshold for the query's label,
        else its default; hysteresis and cooldown chosen on validation streams by ``eval --calibrate-policy``),
        else plain rising edges. The native runtime decides the same (tests/vectors/query_policies.json)."""
        check_number("threshold", threshold)  # before the arithmetic below; AlertPolicy checks the rest
        check_texts(label=label)
        threshold = self.threshold_for(label) if threshold is None else threshold
        recorded = self.alert_policy
        if exit_threshold is None and recorded.get("exit_margin"):
            exit_threshold = max(0.0, threshold - recorded["exit_margin"])
        if cooldown_s is None:
            cooldown_s = recorded.get("cooldown_s", 0.0)
        return AlertPolicy(threshold, exit_threshold, cooldown_s, max_alerts)

    @property
    def training_record(self) -> dict[str, Any] | None:
        """The record `sdqes-edge train` wrote, where the bundle carries one (the demo's does); else None."""
        record = inside_bundle(self.root, TRAINING_RECORD_NAME, named_by_manifest=False)
        if not record.is_file():
            return None
        try:
            data = parse_json(record.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    @property
    def alert_policy(self) -> dict[str, float]:
        """The recorded alert policy as AlertPolicy options for a threshold: {} where none was chosen.

        Stored as a margin below the threshold, so it stays valid when the threshold is re-calibrated.
        """
        policy = self.manifest["thresholds"].get("policy")
        if not policy:
            return {}
        margin = float(policy["exit_margin"])
        return {"exit_margin": margin, "cooldown_s": float(policy["cooldown_s"])}

    @property
    def precisions(self) -> list[str]:
        return [p for p in PRECISIONS if p in self.manifest["graphs"]["step"]]

    def step_graph(self, precision: str = REFERENCE_PRECISION) -> Path:
        graphs = self.manifest["graphs"]["step"]
        if precision not in PRECISIONS:  # "re-export with --precision fp64" would send the user to a refusal
            raise UserError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
        if precision not in graphs:
            raise BundleError(f"{self.root} has no {precision} step graph (it has {', '.join(self.precisions)}); "
                              f"re-export with --precision {precision}")
        return inside_bundle(self.root, graphs[precision]["file"])

    def step_description(self, precision: str = REFERENCE_PRECISION) -> dict[str, Any]:
        """The JSON description ``precision``'s step graph carries (``metadata_props``), read without entering the
        graph; empty where it has none, which a backend refuses, naming the graph, when it loads it."""
        words = metadata_props(self.step_graph(precision)).get(METADATA_KEY)
        try:
            description = parse_json(words) if words else {}
        except ValueError:
            return {}
        return description if isinstance(description, dict) else {}

    def holds(self, path: str | Path, names: list[str]) -> bool:
        """Whether ``path`` is one of this bundle's files ``names`` (manifest names): that very file, or a copy of it
        (its sha256 the one the manifest lists; hashed only when the paths differ)."""
        try:
            if any(Path(path).resolve() == inside_bundle(self.root, name).resolve() for name in names):
                return True
            digest = file_sha256(path)
        except OSError:
            return False
        return any(self.manifest["files"].get(name, {}).get("sha256") == digest for name in names)

    def step_io(self, precision: str = REFERENCE_PRECISION) -> tuple[list[str], list[str]]:
        entry = self.manifest["graphs"]["step"][precision]
        return list(entry["inputs"]), list(entry["outputs"])

    @property
    def text_graph(self) -> Path:
        return inside_bundle(self.root, self.manifest["graphs"]["text"]["file"])

    @property
    def tokenizer_vocab(self) -> Path:
        return inside_bundle(self.root, self.manifest["tokenizer"]["file"])

    def queries(self) -> tuple[list[dict[str, Any]], np.ndarray] | None:
        """Pre-encoded queries: ([{"text", "response"[, "label", "threshold"]}...], embeddings [Q, E]) or None; read
        and checked once (as the bundle loads), then shared by the text encoder, the detector and ``inspect``."""
        return self._queries

    @functools.cached_property
    def _queries(self) -> tuple[list[dict[str, Any]], np.ndarray] | None:
        """Row q of the embeddings is taken as the embedding of text q, so the two files must agree: a query added
        to one file only would hand each text its neighbour's embedding, and every alert would answer another one.
        """
        entry = self.manifest.get("queries")
        if not entry:
            return None
        texts_file, embeddings_file = (inside_bundle(self.root, entry[key]) for key in ("file", "embeddings"))
        damaged = f"the pre-encoded queries of {self.root} are unusable ({{}}); {_reexport_hint(self.root)}"
        try:
            items = parse_json(texts_file.read_text())
            embeddings = np.load(embeddings_file, allow_pickle=False)
        # Not JSON, not a .npy, one that needs pickle, or one whose header claims more memory than there is.
        except (OSError, ValueError, MemoryError) as exc:
            raise BundleError(damaged.format(npz_problem(exc) if isinstance(exc, MemoryError) else exc)) from None
        if not isinstance(items, list) or not all(isinstance(q, dict) and isinstance(q.get("text"), str)
                                                  and isinstance(q.get("response", ""), str)
                                                  and isinstance(q.get("label", ""), str)
                                                  and is_probability(q.get("threshold", 0.5)) for q in items):
            raise BundleError(damaged.format(f"{texts_file.name} is not a list of {{text, response[, label][, "
                                             "threshold in (0, 1)]} objects"))
        if len(items) != entry.get("count", len(items)):
            raise BundleError(damaged.format(f"{texts_file.name} holds {len(items)} queries, {MANIFEST_NAME} says "
                                             f"{entry['count']}"))
        expected = (len(items), self.manifest["embed_dim"])
        if embeddings.dtype != np.float32 or embeddings.shape != expected:
            raise BundleError(damaged.format(f"{embeddings_file.name} is {embeddings.dtype} {embeddings.shape}, not "
                                             f"float32 {expected}: one embedding per query of {texts_file.name}"))
        if not np.isfinite(embeddings).all():
            raise BundleError(damaged.format(f"{embeddings_file.name} holds NaN or infinite values"))
        return items, embeddings


def _refuse_non_numbers(token: str):
    """Python's json reads NaN and Infinity, which JSON lacks and no schema range refuses (NaN > 0 is False,
    and so is NaN <= 0): an fps or a threshold of NaN would pass every check."""
    raise ValueError(f"{token} is not a JSON number")


def _shortened(words: str, most: int = 240) -> str:
    """A schema refusal's words, which quote the value refused whole: a megabyte of it made a one-line error a
    megabyte long. The start says what the value is, the end why it is refused."""
    return words if len(words) <= most else f"{words[:most - 80]} ... {words[-60:]}"


def as_bundle(bundle: str | Path | Bundle) -> Bundle:
    """A loaded bundle, or the one at a path (what each call that takes a bundle takes)."""
    return bundle if isinstance(bundle, Bundle) else load_bundle(bundle)


def load_bundle(path: str | Path, verify_hashes: bool = True) -> Bundle:
    """Open a bundle directory, refusing one whose manifest or files are not what the exporter wrote."""
    root = as_path(path, "a bundle is")
    problem = path_problem(root, "folder")
    if problem:  # a bundle is a folder
        fix = (f"make one with `sdqes-edge export --out {root}`" if problem == "does not exist" else
               f"give the folder `sdqes-edge export --out` wrote, the one holding {MANIFEST_NAME}")
        raise BundleError(f"bundle {root} {problem}; {fix}")
    manifest_path = inside_bundle(root, MANIFEST_NAME, named_by_manifest=False)
    if not manifest_path.is_file():
        raise BundleError(f"{root} has no {MANIFEST_NAME}, so it is not a finished bundle; {_reexport_hint(root)}")
    try:
        manifest = parse_json(manifest_path.read_text(), parse_constant=_refuse_non_numbers)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a NaN or Infinity
        raise BundleError(f"{manifest_path} is not valid JSON ({exc}); {_reexport_hint(root)}") from None
    try:
        jsonschema.validate(manifest, manifest_schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        fix = f"set it there, or {_reexport_hint(root)}" if where in USERS_TO_EDIT else _reexport_hint(root)
        raise BundleError(f"{manifest_path} is malformed at {where}: {_shortened(exc.message)}; {fix}") from None
    if manifest["format_version"] > BUNDLE_FORMAT_VERSION:
        raise BundleError(f"{root} uses bundle format {manifest['format_version']}, newer than this runtime reads "
                          f"({BUNDLE_FORMAT_VERSION}); upgrade sdqes-edge")
    bundle = Bundle(root, manifest)
    _check_listed_files(bundle)
    if verify_hashes:
        for name, entry in manifest["files"].items():
            if file_sha256(root / name) != entry["sha256"]:  # confined by _check_listed_files
                raise BundleError(f"{root / name} does not match the sha256 in {MANIFEST_NAME} (corrupted or "
                                  f"changed after export); {_reexport_hint(root)}")
    _check_external_data(bundle)
    _check_state_io(bundle)
    _check_against_graphs(bundle)
    bundle.queries()  # refused now, naming what disagrees, rather than at the first query
    return bundle


def inside_bundle(root: Path, name: str, named_by_manifest: bool = True) -> Path:
    """``root / name``, refused unless it stays inside the bundle: a bundle is someone else's data.

    Absolute names and any ``..`` are refused as written, before the file system is touched; what remains
    is resolved (symlinks followed) and must still lie under the resolved bundle directory.
    ``named_by_manifest``: False for the names the runtime itself looks for (the manifest, the training record,
    engines and their sidecars), which only a symlink can lead out.
    """
    pure = PurePosixPath(name)
    outside = pure.is_absolute() or PureWindowsPath(name).is_absolute() or ".." in pure.parts or "\\" in name
    if not outside:
        resolved, inside = (root / name).resolve(), root.resolve()
        outside = resolved != inside and inside not in resolved.parents  # Path.is_relative_to: Python 3.9
    trust = "nothing outside a bundle is read: get the bundle again from a source you trust or re-export it"
    if outside and not named_by_manifest:
        raise BundleError(f"{root / name} leads outside the bundle through a symlink; {trust}")
    if outside:
        raise BundleError(f"{MANIFEST_NAME} of {root} names {name!r}, which lies outside the bundle (absolute, "
                          f"'..' or a symlink leading out); {trust}")
    return root / name


def _check_listed_files(bundle: Bundle) -> None:
    m = bundle.manifest
    referenced = [e["file"] for e in m["graphs"]["step"].values()] + [m["graphs"]["text"]["file"],
                                                                      m["tokenizer"]["file"]]
    if m.get("queries"):
        referenced += [m["queries"]["file"], m["queries"]["embeddings"]]
    for name in [*referenced, *m["files"]]:
        inside_bundle(bundle.root, name)
    for name in referenced:
        if name not in m["files"]:
            raise BundleError(f"{MANIFEST_NAME} of {bundle.root} uses {name} but lists no sha256 for it; "
                              f"{_reexport_hint(bundle.root)}")
    for name in m["files"]:
        if not (bundle.root / name).is_file():
            raise BundleError(f"{bundle.root / name} is missing from the bundle; {_reexport_hint(bundle.root)}")


def _check_external_data(bundle: Bundle) -> None:
    """A graph's tensors may keep their bytes in other files (ONNX external data), which ONNX Runtime and
    TensorRT open relative to the graph: each must be a file of the bundle listed with its sha256, so confined
    and checked like the graphs (``graph_files`` says why). The exporter writes none."""
    root, files = bundle.root, bundle.manifest["files"]
    for name in files:
        if not name.endswith(".onnx"):
            continue
        try:
            locations = external_data_locations(root / name)
        except NotAGraph as exc:
            raise BundleError(f"{root / name} is not an ONNX graph ({exc}); {_reexport_hint(root)}") from None
        for location in locations:
            if str(PurePosixPath(name).parent / location) not in files:  # listed names are confined already
                raise BundleError(f"{root / name} reads tensor data from {location!r}, which is not a file of the "
                                  f"bundle listed in {MANIFEST_NAME}; nothing outside a bundle is read: get the "
                                  "bundle again from a source you trust or re-export it")


def _check_state_io(bundle: Bundle) -> None:
    """Every step graph must take and give exactly the state the spec describes, in its order."""
    spec = bundle.state_spec
    for precision in bundle.precisions:
        inputs, outputs = bundle.step_io(precision)
        if not state_names_in(inputs, STATE_INPUT_PREFIX) == state_names_in(outputs, STATE_OUTPUT_PREFIX) == spec.names:
            raise BundleError(f"the {precision} step graph's state inputs/outputs disagree with the state spec in "
                              f"{MANIFEST_NAME}; {_reexport_hint(bundle.root)}")


# What the runtimes take from the manifest that each step graph's own description also says: its shapes, and the
# normalization its images get. The manifest carries no hash, so one edited or damaged after export failed deep in
# ONNX Runtime ("Got invalid dimensions"), or, for the normalization, not at all. (The fps is the rate to stream at,
# which a user may change.)
DESCRIBED_BY_THE_GRAPH = ("image_size", "embed_dim", "batch", "query_count", "preprocess")
# What a user may set in the manifest by hand: a refusal of it says so before it says to re-export.
USERS_TO_EDIT = ("fps",)


def _check_against_graphs(bundle: Bundle) -> None:
    root = bundle.root
    for precision in bundle.precisions:
        graph, description = bundle.step_graph(precision), bundle.step_description(precision)
        for key in DESCRIBED_BY_THE_GRAPH:
            exported, said = description.get(key), bundle.manifest.get(key)
            if key not in description or exported == said:
                continue
            what = (f"another {key} than {graph.name} was exported with" if isinstance(exported, dict) else
                    f"{key} {said!r}, but {graph.name} was exported with {exported!r}")
            raise BundleError(f"{MANIFEST_NAME} of {root} says {what}: the manifest was edited or damaged after "
                              f"export; restore it, or {_reexport_hint(root)}")


def write_thresholds(path: str | Path, default: float, per_label: dict[str, float] | None = None,
                     provenance: dict[str, Any] | None = None, policy: dict[str, Any] | None = None) -> Bundle:
    """Set a bundle's default alert threshold (and per-label ones), e.g. from ``sdqes-edge eval --calibrate``,
    and its alert policy ({"exit_margin", "cooldown_s", ...} from ``eval --calibrate-policy``); a policy
    already recorded is kept when none is given.

    The manifest is rewritten atomically; the graphs are untouched, so their hashes still hold. The bundle is held
    (runtime/output_locks.py) from its reading to the new manifest's writing: an export replacing it meanwhile was
    given the manifest of the graphs it replaced, which no longer matched its own.
    """
    if not 0.0 < default < 1.0:
        raise BundleError(f"a threshold is a probability in (0, 1), not {default}")
    lock = hold_bundle(path, "write_thresholds")
    try:
        return _write_thresholds(load_bundle(path), default, per_label, provenance, policy)
    finally:
        release(lock)


def _write_thresholds(bundle: Bundle, default: float, per_label: dict[str, float] | None,
                      provenance: dict[str, Any] | None, policy: dict[str, Any] | None) -> Bundle:
    manifest = dict(bundle.manifest)
    kept = {k: v for k, v in bundle.manifest["thresholds"].items() if k not in ("default", "per_label", "calibration")}
    manifest["thresholds"] = {**kept, "default": float(default), "per_label": dict(per_label or {}),
                              "calibration": provenance or bundle.manifest["thresholds"].get("calibration", {})}
    if policy is not None:
        manifest["thresholds"]["policy"] = policy
    write_text_atomically(bundle.root / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False))
    return Bundle(bundle.root, manifest)
