"""Score traces: what the runtime records per stream and ``sdqes-edge eval`` reads. numpy only.

One ``.npz`` file per stream (a video, a camera session)::

    format_version  int            TRACE_FORMAT_VERSION
    stream          str            the stream's name; for EgoSDQES, the video_uid
    fps             float          frames sampled per second; frame i is at time i / fps
    query_texts     str [Q]        the queries as the user typed them
    query_ids       str [Q]
    asked_time      float [Q]      seconds into the stream when each query was added (0: from the start)
    probs           float32 [T, Q] p = sigmoid(cos) per sampled frame and query; NaN before a query existed
    first_frame     int            (version 2) the stream frame of probs' first row; 0 for a whole stream
    model           str            (optional) the model that scored it: the sha256 of its bundle's fp32 step graph
    source_ended    bool           (optional) True: the run stepped its source to the end (a file's last frame, a
                                   camera lost for good); False: it stopped first (--max-frames, a stop, an error)
                                   or the file was cut short (a copy stopped part-way: its end is not the video's)

A stream that runs for days is written as it goes, in chunks ``NAME.part-000001.npz``, ... (each a complete
trace of its frames, written atomically), so the runtime holds at most one chunk in memory and a killed run
keeps all but its last chunk. When the stream ends the chunks are merged, a chunk at a time, into
``NAME.npz`` and removed. ``load_score_dir`` reads either form: a killed run's chunks are merged on reading.
"""

from __future__ import annotations

import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from .errors import UserError
from .files import NPZ_READ_ERRORS, npz_problem, replaced_atomically
from .path_checks import TRACE_SUFFIX, path_problem

TRACE_FORMAT_VERSION = 2
CHUNK_PATTERN = re.compile(r"^(?P<base>.+)\.part-(?P<number>\d{6})\.npz$")


def query_key(text: str) -> str:
    """A query's text as queries are told apart, case and spacing aside: a trace's column against an annotation
    (``evaluation.match_traces``), a query against the active ones (the runtime's duplicate check)."""
    return " ".join(text.split()).lower()


@dataclass
class StreamScores:
    stream: str
    fps: float
    query_texts: list[str]
    query_ids: list[str]
    asked_time: np.ndarray  # [Q]
    probs: np.ndarray  # [T, Q]
    first_frame: int = 0
    model: str = ""  # the model that scored it (Bundle.model_identity); "" in traces written before
    # Whether the run stepped the source to its end (False: it stopped first, so frames after the trace's last were
    # never scored, not absent from the video); None where not recorded (a trace written before, a program's own).
    source_ended: bool | None = None

    def __post_init__(self) -> None:
        q = len(self.query_texts)
        if self.probs.ndim != 2 or self.probs.shape[1] != q or len(self.query_ids) != q or len(self.asked_time) != q:
            raise UserError(f"score trace of stream {self.stream!r} is inconsistent: probs {self.probs.shape}, "
                            f"{q} query texts, {len(self.query_ids)} ids, {len(self.asked_time)} asked times")
        if not 0.0 < self.fps < math.inf:  # NaN too
            raise UserError(f"score trace of stream {self.stream!r} has fps {self.fps}; it must be positive")


def _header_arrays(scores: StreamScores) -> dict[str, np.ndarray]:
    arrays = {"format_version": np.asarray(TRACE_FORMAT_VERSION), "stream": np.asarray(scores.stream),
              "fps": np.asarray(float(scores.fps)), "query_texts": np.asarray(scores.query_texts, dtype=str),
              "query_ids": np.asarray(scores.query_ids, dtype=str),
              "asked_time": np.asarray(scores.asked_time, dtype=np.float64),
              "first_frame": np.asarray(int(scores.first_frame)), "model": np.asarray(scores.model)}
    if scores.source_ended is not None:
        arrays["source_ended"] = np.asarray(bool(scores.source_ended))
    return arrays


def _write_trace(path: Path, header: StreamScores, rows: int, blocks: Iterable[np.ndarray]) -> Path:
    """An .npz whose ``probs`` [rows, Q] is streamed from ``blocks``, written to a temporary name and renamed
    into place: a reader never sees half a trace, and the writer never holds all the rows at once."""
    with replaced_atomically(path) as partial, zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED,
                                                                allowZip64=True) as archive:
        for name, array in _header_arrays(header).items():
            with archive.open(f"{name}.npy", "w") as fh:
                np.lib.format.write_array(fh, array, allow_pickle=False)
        with archive.open("probs.npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": np.dtype("<f4").str, "fortran_order": False,
                                                      "shape": (rows, len(header.query_ids))})
            for block in blocks:
                fh.write(np.ascontiguousarray(block, dtype="<f4").tobytes())
    return path


def save_scores(path: str | Path, scores: StreamScores) -> Path:
    """Write one trace atomically."""
    return _write_trace(Path(path), scores, len(scores.probs), [scores.probs])


def chunk_path(path: str | Path, number: int) -> Path:
    """``scores/clip.npz`` -> ``scores/clip.part-000003.npz``."""
    path = Path(path)
    return path.with_name(f"{path.name[:-len(TRACE_SUFFIX)] if path.name.endswith(TRACE_SUFFIX) else path.name}"
                          f".part-{number:06d}{TRACE_SUFFIX}")


def chunks_of(path: str | Path) -> list[Path]:
    """The chunk files of the trace at ``path``, in order."""
    path = Path(path)
    return sorted(path.parent.glob(chunk_path(path, 0).name.replace("000000", "[0-9]" * 6)))


def _columns(traces: list[StreamScores]) -> tuple[list[str], list[str], list[float]]:
    """Every query of the chunks, in the order they first appear, with its text and when it was asked."""
    ids, texts, asked = [], [], []
    for trace in traces:
        for qid, text, when in zip(trace.query_ids, trace.query_texts, trace.asked_time):
            if qid not in ids:
                ids.append(qid), texts.append(text), asked.append(float(when))
    return ids, texts, asked


def _aligned(trace: StreamScores, ids: list[str]) -> np.ndarray:
    """A chunk's rows with its columns placed among ``ids`` (NaN where a query did not exist yet)."""
    block = np.full((len(trace.probs), len(ids)), np.nan, np.float32)
    for column, qid in enumerate(trace.query_ids):
        block[:, ids.index(qid)] = trace.probs[:, column]
    return block


def merge_chunks(chunks: list[Path], path: str | Path, header: StreamScores, rows: int) -> Path:
    """Merge a stream's chunks into one trace at ``path``, reading one chunk at a time; then remove them.

    ``header`` holds every query of the stream (its ``probs`` is not read) and ``rows`` the chunks' total:
    the writer of the chunks knows both, so no chunk is read twice.
    """
    _write_trace(Path(path), header, rows, (_aligned(load_scores(c), header.query_ids) for c in chunks))
    for chunk in chunks:
        chunk.unlink()
    return Path(path)


def load_scores(path: str | Path) -> StreamScores:
    """One trace file: a whole stream, or one chunk of it."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            if "format_version" not in data.files:  # an archive of other arrays, not a damaged trace
                raise UserError(f"{path} is a NumPy archive but not a score trace written by `sdqes-edge run "
                                "--scores` (a state snapshot from --save-state, or another program's arrays?); "
                                "keep score traces in a folder of their own")
            version = int(data["format_version"])
            if version > TRACE_FORMAT_VERSION:
                raise UserError(f"{path} is a version {version} score trace; this sdqes-edge reads up to "
                                f"{TRACE_FORMAT_VERSION}: upgrade it")
            return StreamScores(str(data["stream"]), float(data["fps"]), [str(t) for t in data["query_texts"]],
                                [str(i) for i in data["query_ids"]], np.asarray(data["asked_time"], np.float64),
                                np.asarray(data["probs"], np.float64),
                                int(data["first_frame"]) if "first_frame" in data.files else 0,
                                str(data["model"]) if "model" in data.files else "",
                                bool(data["source_ended"]) if "source_ended" in data.files else None)
    except NPZ_READ_ERRORS as exc:
        raise UserError(f"{path} is not a score trace written by `sdqes-edge run --scores` ({npz_problem(exc)})") \
            from None


def read_chunks(chunks: list[Path]) -> StreamScores:
    """A killed run's chunks as one trace (in memory: eval needs the whole stream anyway); it stopped before its
    source's end, as far as anyone knows (``source_ended`` False)."""
    traces = [load_scores(c) for c in chunks]
    expected = 0
    for chunk, trace in zip(chunks, traces):
        if trace.first_frame != expected:
            raise UserError(f"{chunk} starts at frame {trace.first_frame}, but the chunks before it end at "
                            f"{expected}: a chunk of this trace is missing")
        expected += len(trace.probs)
    ids, texts, asked = _columns(traces)
    probs = np.concatenate([_aligned(t, ids) for t in traces]).astype(np.float64)
    return StreamScores(traces[0].stream, traces[0].fps, texts, ids, np.asarray(asked), probs, 0, traces[0].model,
                        source_ended=False)


def load_score_dir(directory: str | Path) -> list[StreamScores]:
    """Every trace in a folder: whole ones, and the chunks of runs that were killed before merging them; or the one
    trace a file holds (`run --scores FILE.npz` wrote it: it had been refused, and its folder, which `run` then
    named, may hold other arrays, such as the state snapshot of `--save-state`)."""
    directory = Path(directory)
    problem = path_problem(directory, "folder")
    if problem and directory.suffix == TRACE_SUFFIX and directory.is_file():
        return [load_scores(directory)]
    if problem:
        raise UserError(f"--scores {directory} {problem}; give the folder the runtime wrote its *{TRACE_SUFFIX} "
                        "score traces to")
    files = sorted(directory.glob(f"*{TRACE_SUFFIX}"))
    if not files:
        raise UserError(f"{directory} holds no *{TRACE_SUFFIX} score traces; write them with "
                        "`sdqes-edge run ... --scores DIR`")
    whole = [f for f in files if not CHUNK_PATTERN.match(f.name)]
    pending: dict[str, list[Path]] = {}
    for f in files:
        match = CHUNK_PATTERN.match(f.name)
        if match and not (directory / f"{match['base']}{TRACE_SUFFIX}").exists():  # merged already: whole wins
            pending.setdefault(match["base"], []).append(f)
    return [load_scores(f) for f in whole] + [read_chunks(chunks) for _, chunks in sorted(pending.items())]
