"""A score trace that ran its video to the end at a length far from the one its annotations give is another cut of
that video (a clip named by the video's uid, a trimmed copy): EgoSDQES times every event from the whole video's start,
so eval and score warn, naming it, where every event of it had been scored at the wrong time without a word."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from eval_fixtures import step_trace, write_annotations

from sdqes_edge.annotations import load_annotations
from sdqes_edge.evaluation import length_mismatches
from sdqes_edge.traces import StreamScores, save_scores

QUERY = "When I cook, remind me."


def trace(video: str, seconds: int, ended: bool | None, fps: float = 1.0) -> StreamScores:
    return StreamScores(video, fps, [QUERY], ["q1"], np.zeros(1), step_trace(int(seconds * fps), [12])[:, None],
                        source_ended=ended)


def test_only_a_trace_that_ran_to_its_end_far_from_its_videos_length_is_named(tmp_path):
    csv = write_annotations(tmp_path / "a.csv", [(video, QUERY, "cook", 10.0) for video in
                                                 ("clip", "whole", "rounded", "stopped", "unsaid", "long")],
                            seconds=600.0)
    streams = [trace("clip", 480, True),  # an Ego4D clip's 8 minutes under its video's uid
               trace("whole", 600, True),
               trace("rounded", 599, True, fps=2.0),  # a re-encode a second short: within the slack
               trace("stopped", 480, False),  # a run stopped first: short by design, said elsewhere
               trace("unsaid", 480, None),  # a trace that does not say how it ended
               trace("long", 700, True)]
    found = length_mismatches(load_annotations(str(csv), split="val"), streams)
    assert found == [("clip", 480.0, 600.0), ("long", 700.0, 600.0)]


def test_eval_warns_in_one_line_naming_the_trace_and_both_lengths(tmp_path):
    csv = write_annotations(tmp_path / "a.csv", [("v1", QUERY, "cook", 10.0), ("v2", QUERY, "cook", 10.0)],
                            seconds=600.0)
    for stream in (trace("v1", 480, True), trace("v2", 600, True)):
        save_scores(tmp_path / "traces" / f"{stream.stream}.npz", stream)
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "eval", "--annotations", str(csv), "--scores",
                           str(tmp_path / "traces"), "--plots", "0", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("sdqes-edge: warning:")]
    assert warnings == ["sdqes-edge: warning: 1 score trace(s) ran their video to its end at a length far from the "
                        "one their annotations give (v1: 480 s, its annotations 600 s): a clip or another cut of the "
                        "video under its video_uid times every event wrong, since EgoSDQES counts them from the whole "
                        "video's start; score the whole video"]
