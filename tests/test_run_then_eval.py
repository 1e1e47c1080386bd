"""The `eval` that `run --scores` names as the next command runs as named: its score trace is scored against the
annotations, whatever else lies beside it."""

from __future__ import annotations

import json
import shlex

from eval_fixtures import write_annotations
from runtime_fixtures import write_video

from sdqes_edge.cli import run
from sdqes_edge.sample import sample_frames

QUERY = "When I open the fridge, remind me to close it."


def test_the_eval_that_run_names_after_scores_file_and_save_state_beside_it_scores_the_trace(exported, tmp_path,
                                                                                              capsys):
    """`run --scores out/kitchen.npz --save-state out/state.npz` named `eval --scores out`, which then refused the
    state snapshot lying there as no score trace; the trace itself was refused as one stream's, not a folder."""
    _, bundle = exported
    video = write_video(tmp_path / "kitchen.avi", sample_frames(40, 48, 64))  # 4 s at 10 fps
    out = tmp_path / "out"
    assert run(["run", str(bundle), "--source", str(video), "--query", QUERY, "--quiet",
                "--scores", str(out / "kitchen.npz"), "--save-state", str(out / "state.npz")]) == 0
    next_line = [line for line in capsys.readouterr().err.splitlines() if line.startswith("next: ")][-1]
    assert next_line.endswith(f"--scores {out / 'kitchen.npz'}")
    csv = write_annotations(tmp_path / "a.csv", [("kitchen", QUERY, "open_fridge", 2.0)], seconds=4.0)
    argv = shlex.split(next_line.removeprefix("next: sdqes-edge ").replace("ANNOTATIONS.csv", str(csv)))
    assert run([*argv, "--plots", "0", "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["results"]["scores (kitchen.npz)"]["queries"] == 1
    assert report["annotations_not_scored"]["without_trace"] == []
