"""Annotations and score traces written for the evaluation tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

COLUMNS = "split,source,video_uid,clip_uid,annotator_uid,ann_idx,query,response,label,video_start_time," \
          "video_end_time,video_fps,video_length"


def write_annotations(path: Path, rows: list[tuple[str, str, str, float]], seconds: float = 60.0) -> Path:
    """rows: (video_uid, query, label, start_time); every video is `seconds` long at 30 fps."""
    lines = [COLUMNS] + [f'val,moments,{v},c,a,0,"{q}",Alert.,{label},{start},{start + 5},30.0,{int(seconds * 30)}'
                         for v, q, label, start in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def step_trace(length: int, rises_at: list[int], high: float = 0.9, low: float = 0.1) -> np.ndarray:
    probs = np.full(length, low)
    for t in rises_at:
        probs[t : t + 2] = high
    return probs
