"""Score traces: what the runtime records per stream and ``sdqes-edge eval`` reads. numpy only.

One ``.npz`` file per stream (a video, a camera session)::

    format_version  int            TRACE_FORMAT_VERSION
    stream          str            the stream's name; for EgoSDQES, the video_uid
    fps             float          frames sampled per second; frame i is at time i / fps
    query_texts     str [Q]        the queries as the user typed them
    query_ids       str [Q]
    asked_time      float [Q]      seconds into the stream when each query was added (0: from the start)
    probs           float32 [T, Q] p = sigmoid(cos) per sampled frame and query; NaN before a query existed
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError

TRACE_FORMAT_VERSION = 1
TRACE_SUFFIX = ".npz"


@dataclass
class StreamScores:
    stream: str
    fps: float
    query_texts: list[str]
    query_ids: list[str]
    asked_time: np.ndarray  # [Q]
    probs: np.ndarray  # [T, Q]

    def __post_init__(self) -> None:
        q = len(self.query_texts)
        if self.probs.ndim != 2 or self.probs.shape[1] != q or len(self.query_ids) != q or len(self.asked_time) != q:
            raise UserError(f"score trace of stream {self.stream!r} is inconsistent: probs {self.probs.shape}, "
                            f"{q} query texts, {len(self.query_ids)} ids, {len(self.asked_time)} asked times")
        if self.fps <= 0:
            raise UserError(f"score trace of stream {self.stream!r} has fps {self.fps}; it must be positive")


def save_scores(path: str | Path, scores: StreamScores) -> Path:
    """Write atomically (a temporary file renamed into place), so a reader never sees half a trace."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, format_version=TRACE_FORMAT_VERSION, stream=scores.stream, fps=float(scores.fps),
             query_texts=np.asarray(scores.query_texts, dtype=str), query_ids=np.asarray(scores.query_ids, dtype=str),
             asked_time=np.asarray(scores.asked_time, dtype=np.float64),
             probs=np.asarray(scores.probs, dtype=np.float32))
    tmp.replace(path)
    return path


def load_scores(path: str | Path) -> StreamScores:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            version = int(data["format_version"])
            if version > TRACE_FORMAT_VERSION:
                raise UserError(f"{path} is a version {version} score trace; this sdqes-edge reads up to "
                                f"{TRACE_FORMAT_VERSION}: upgrade it")
            return StreamScores(str(data["stream"]), float(data["fps"]), [str(t) for t in data["query_texts"]],
                                [str(i) for i in data["query_ids"]], np.asarray(data["asked_time"], np.float64),
                                np.asarray(data["probs"], np.float64))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise UserError(f"{path} is not a score trace written by `sdqes-edge run --scores` ({exc})") from None


def load_score_dir(directory: str | Path) -> list[StreamScores]:
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"--scores {directory} is not a directory; give the folder the runtime wrote its "
                        f"*{TRACE_SUFFIX} score traces to")
    files = sorted(directory.glob(f"*{TRACE_SUFFIX}"))
    if not files:
        raise UserError(f"{directory} holds no *{TRACE_SUFFIX} score traces; write them with "
                        "`sdqes-edge run ... --scores DIR`")
    return [load_scores(f) for f in files]
