"""An annotated video's score bars: one a query while they fit below the alert banner; past that, the
highest-scoring queries in their own order, and a line that counts the rest. Thirty queries had drawn nineteen bars
and the rest over the banner and off the frame, unsaid; thousands spent 170 ms a frame on bars nobody saw."""

from __future__ import annotations

import cv2
import numpy as np

from sdqes_edge.runtime import AnnotatedVideoSink
from sdqes_edge.runtime.score_bars import BANNER_PIXELS, draw_score_bars, rows_shown


def scores(count: int) -> dict[str, float]:
    return {f"q{n + 1}": 0.3 + 0.4 * ((n * 37) % count) / count for n in range(count)}


def test_queries_that_fit_are_each_drawn_in_their_order():
    probs = scores(19)
    assert rows_shown(probs, 384) == (list(probs.items()), 0)  # 19 rows fit under the banner of a 384-px frame


def test_more_queries_than_fit_draw_the_highest_scoring_in_their_order_and_count_the_rest():
    probs = scores(30)
    rows, left_out = rows_shown(probs, 384)
    assert len(rows) == 18 and left_out == 12  # the nineteenth row says "+12 more"
    assert [qid for qid, _ in rows] == [qid for qid in probs if qid in dict(rows)]  # the queries' own order
    assert min(p for _, p in rows) >= max(p for qid, p in probs.items() if qid not in dict(rows))


def test_no_bar_is_drawn_over_the_banner_however_many_queries():
    for count in (5, 30, 11828):
        image = np.zeros((384, 512, 3), np.uint8)
        draw_score_bars(image, scores(count), {})
        assert not image[:BANNER_PIXELS].any(), count
        assert image[BANNER_PIXELS:].any()


def test_an_annotated_video_of_many_queries_says_how_many_it_leaves_out(tmp_path):
    probs = scores(40)
    sink = AnnotatedVideoSink(tmp_path / "annotated.avi", 1.0, lambda: dict.fromkeys(probs, 0.5))
    sink.on_frame(0, np.zeros((384, 512, 3), np.uint8), 0.0, probs, [])
    sink.close()
    frame = cv2.VideoCapture(str(tmp_path / "annotated.avi")).read()[1]
    assert frame.shape == (384, 512, 3) and frame[:BANNER_PIXELS].max() < 40  # MJPG: dark, not a bar's colour
