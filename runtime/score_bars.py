"""The score bars an annotated video draws over each frame: one a query, as many as fit below the alert banner. With
more queries than fit, the highest-scoring are drawn, in the queries' order, and a line counts the rest: a run asked
thirty queries had drawn nineteen and the rest off the frame (over the banner, and past its top) without a word, and
one asked thousands spent 170 ms a frame drawing bars nobody could see."""

from __future__ import annotations

import heapq

import cv2
import numpy as np

from sdqes_edge.metrics import above_threshold

ROW_PIXELS = 18  # a bar's row, from the frame's bottom up
BANNER_PIXELS = 28  # the alert banner across the frame's top, which no bar may cover
BOTTOM_MARGIN = 12  # below the first bar's baseline
BAR_PIXELS = 10  # a bar's height


def rows_shown(probs: dict[str, float], height: int) -> tuple[list[tuple[str, float]], int]:
    """The (query id, p) rows drawn, bottom first, and how many queries are left out (0 where all fit)."""
    fit = max(1, (height - BOTTOM_MARGIN - BAR_PIXELS - BANNER_PIXELS) // ROW_PIXELS + 1)
    rows = list(probs.items())
    if len(rows) <= fit:
        return rows, 0
    drawn = fit - 1  # the last row counts the others
    highest = heapq.nlargest(drawn, range(len(rows)), key=lambda i: rows[i][1])
    return [rows[i] for i in sorted(highest)], len(rows) - drawn


def draw_score_bars(image: np.ndarray, probs: dict[str, float], thresholds: dict[str, float]) -> None:
    """Each query's p as a bar (red above its threshold, green under it) with its id and value, in place."""
    h, w = image.shape[:2]
    rows, left_out = rows_shown(probs, h)
    for row, (qid, p) in enumerate(rows):
        y = h - BOTTOM_MARGIN - ROW_PIXELS * row
        cv2.rectangle(image, (8, y - BAR_PIXELS), (8 + w // 3, y), (60, 60, 60), -1)
        above = above_threshold(p, thresholds.get(qid, 1.0))
        cv2.rectangle(image, (8, y - BAR_PIXELS), (8 + int((w // 3) * p), y), (0, 0, 255) if above else (0, 200, 0),
                      -1)
        cv2.putText(image, f"{qid} {p:.3f}", (14 + w // 3, y), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 255), 1)
    if left_out:
        y = h - BOTTOM_MARGIN - ROW_PIXELS * len(rows)
        cv2.putText(image, f"+{left_out} more queries (the {len(rows)} scoring highest shown)", (8, y),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 255), 1)
