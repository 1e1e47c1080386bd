"""EgoSDQES annotations (../shared/data/egosdqes_all.csv) as streaming-evaluation queries. numpy only."""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .errors import UserError
from .metrics import ScoreTrace, frame_at_or_after

REQUIRED_COLUMNS = ("split", "source", "video_uid", "query", "response", "label", "video_start_time",
                    "video_fps", "video_length")


@dataclass(frozen=True)
class Annotation:
    split: str
    source: str  # "moments" | "nlq"
    video_uid: str
    query: str
    response: str  # the alert message to show the user
    label: str
    start_time: float  # seconds from the start of the video
    video_seconds: float
    row: int
    asked_time: float = 0.0  # when the query was issued (optional `asked_time` column); 0 = before the stream
    clip_uid: str = ""  # the clip the annotation came from (optional `clip_uid` column)

    def start_frame(self, fps: float) -> int:
        return frame_at_or_after(self.start_time, fps)

    def stream_frames(self, fps: float) -> int:
        """Sampled frames in the whole video at ``fps`` (never fewer than reach the start frame)."""
        return max(int(self.video_seconds * fps), self.start_frame(fps) + 1)


def load_annotations(path: str, split: str | None = None, source: str | None = None) -> list[Annotation]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise UserError(f"{path} is not an EgoSDQES annotation file: missing column(s) {', '.join(missing)}")
            rows = list(reader)
    except FileNotFoundError:
        raise UserError(f"annotation file not found: {path}; pass the EgoSDQES CSV (egosdqes_all.csv)") from None
    out = []
    for i, r in enumerate(rows):
        if (split and r["split"] != split) or (source and r["source"] != source):
            continue
        out.append(Annotation(r["split"], r["source"], r["video_uid"], r["query"], r["response"], r["label"],
                              float(r["video_start_time"]), float(r["video_length"]) / float(r["video_fps"]), i,
                              float(r.get("asked_time") or 0.0), r.get("clip_uid") or ""))
    return out


def by_video(annotations: list[Annotation]) -> dict[str, list[Annotation]]:
    groups: dict[str, list[Annotation]] = defaultdict(list)
    for a in annotations:
        groups[a.video_uid].append(a)
    return dict(groups)


def oracle_traces(annotations: list[Annotation], fps: float = 1.0) -> list[ScoreTrace]:
    """Scores that rise exactly at each ground-truth start: must give SR@k = 100 and SMD@k = 0."""
    traces = []
    for a in annotations:
        probs = np.zeros(a.stream_frames(fps))
        probs[a.start_frame(fps)] = 1.0
        traces.append(ScoreTrace(probs, a.start_time, fps, a.asked_time, query_id=str(a.row)))
    return traces


def random_traces(annotations: list[Annotation], fps: float = 1.0, seed: int = 0) -> list[ScoreTrace]:
    """Uniform random scores (seeded): the chance baseline."""
    rng = np.random.default_rng(seed)
    return [ScoreTrace(rng.random(a.stream_frames(fps)), a.start_time, fps, a.asked_time, query_id=str(a.row))
            for a in annotations]
