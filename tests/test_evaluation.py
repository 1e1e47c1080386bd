"""`sdqes-edge eval`: score traces matched to annotations, calibration (global and per label), reports, plots."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from eval_fixtures import step_trace, write_annotations

from sdqes_edge.annotations import load_annotations
from sdqes_edge.errors import UserError
from sdqes_edge.evaluation import calibrate_thresholds, evaluate_with, match_traces
from sdqes_edge.metrics import ScoreTrace, evaluate
from sdqes_edge.traces import StreamScores, load_score_dir, load_scores, save_scores


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdqes_edge.cli", *args], capture_output=True, text=True)


def test_a_score_trace_round_trips_and_a_damaged_one_is_refused(tmp_path):
    scores = StreamScores("vid", 1.0, ["q one", "q two"], ["0", "1"], np.array([0.0, 4.0]), np.random.rand(30, 2))
    loaded = load_scores(save_scores(tmp_path / "vid.npz", scores))
    assert loaded.query_texts == ["q one", "q two"] and loaded.fps == 1.0
    np.testing.assert_allclose(loaded.probs, scores.probs.astype(np.float32))
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    # numpy's own words for it spoke of pickled data and of loading it "unsafely"
    with pytest.raises(UserError, match=r"bad.npz is not a score trace .*\(not a NumPy .npz archive\)$"):
        load_score_dir(tmp_path)


def test_a_state_snapshot_beside_the_traces_is_named_as_such_not_as_a_damaged_trace(tmp_path):
    """`run --scores out/trace.npz --save-state out/state.npz`, then the `eval --scores out` that run suggests."""
    from sdqes_edge.demo import DEMO_BUNDLE
    from sdqes_edge.runtime import StreamingDetector

    save_scores(tmp_path / "trace.npz", StreamScores("vid", 1.0, ["q"], ["0"], np.zeros(1), np.zeros((5, 1))))
    StreamingDetector(DEMO_BUNDLE).save_state(tmp_path / "state.npz")
    with pytest.raises(UserError, match=r"state.npz is a NumPy archive but not a score trace .*--save-state.*; "
                                        r"keep score traces in a folder of their own$"):
        load_score_dir(tmp_path)


def test_traces_are_matched_by_video_and_query_text_and_scored(tmp_path):
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 20.0),
                                                 ("v1", "When I read, remind me.", "read", 40.0),
                                                 ("v2", "When I run, remind me.", "run", 10.0)])
    annotations = load_annotations(str(csv), split="val")
    # v1: the cooking query rises 2 s late (recalled), the reading one never rises; v2 has no trace at all.
    probs = np.stack([step_trace(60, [22]), step_trace(60, [])], axis=1)
    streams = [StreamScores("v1", 1.0, ["when I cook,  remind me.", "When I read, remind me."], ["a", "b"],
                            np.zeros(2), probs)]
    matched = match_traces(annotations, streams)
    assert [a.query for a in matched.missing] == ["When I run, remind me."]
    result = evaluate(matched.traces, 0.5)
    assert result.queries == 2 and result.without_prediction == 1
    assert result.recall["[-5,+10]"][1] == 50.0 and result.recall["[-2,+5]"][1] == 50.0
    assert result.min_distance[1] == (2 + 60) / 2


def test_an_annotation_whose_event_starts_after_its_trace_ends_is_put_aside_not_scored_as_a_miss(tmp_path):
    """A run stopped at 30 s (--max-frames, a stop, a killed run's chunks) saw nothing of an event at 40 s: scored as
    a miss it halved SR@1 here and counted its trace's 30 frames as SMD, less than a whole video's miss counts."""
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 20.0),
                                                 ("v1", "When I read, remind me.", "read", 40.0),
                                                 ("v1", "When I run, remind me.", "run", 29.0)])
    probs = np.stack([step_trace(30, [21]), step_trace(30, []), step_trace(30, [29])], axis=1)
    streams = [StreamScores("v1", 1.0, ["When I cook, remind me.", "When I read, remind me.",
                                        "When I run, remind me."], ["a", "b", "c"], np.zeros(3), probs)]
    matched = match_traces(load_annotations(str(csv), split="val"), streams)
    assert [(a.query, where) for a, where in matched.unseen] == [("When I read, remind me.", "its scores end at 30 s")]
    assert [a.label for a in matched.annotations] == ["cook", "run"]  # its last frame, 29 s, still counts
    result = evaluate(matched.traces, 0.5)
    assert result.queries == 2 and result.recall["[-5,+10]"][1] == 100.0 and result.min_distance[1] == 0.5


def test_a_query_removed_while_the_stream_ran_or_a_stretch_without_scores_puts_its_event_aside(tmp_path):
    """--watch-queries: a line removed at 30 s leaves its column NaN after; a disk that refused the trace long
    enough lets a stretch of rows go (NaN). An event in either was scored as a miss, though nothing looked at it."""
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 40.0),
                                                 ("v1", "When I read, remind me.", "read", 25.0),
                                                 ("v1", "When I run, remind me.", "run", 50.0)])
    probs = np.stack([step_trace(60, [41]), step_trace(60, [26]), step_trace(60, [51])], axis=1)
    probs[30:, 0] = np.nan  # the cooking query removed at 30 s
    probs[20:35, 1:] = np.nan  # rows let go from 20 to 35 s
    streams = [StreamScores("v1", 1.0, ["When I cook, remind me.", "When I read, remind me.",
                                        "When I run, remind me."], ["a", "b", "c"], np.zeros(3), probs)]
    matched = match_traces(load_annotations(str(csv), split="val"), streams)
    assert [(a.label, where) for a, where in matched.unseen] == [("cook", "its scores end at 30 s"),
                                                                  ("read", "no scores from 20 to 35 s")]
    assert [a.label for a in matched.annotations] == ["run"] and evaluate(matched.traces, 0.5).queries == 1


def test_an_event_whose_tolerance_window_runs_past_where_a_stopped_run_scored_is_put_aside(tmp_path):
    """A run stopped at 30 s (--max-frames) saw 3.5 s of the 10 s after an event at 26.5 s in which an alert counts:
    one at 31 s would have been recalled, so scored as a miss it lowered SR. A trace that ended with its video (the
    reference scores a video's last seconds so) or does not say how it ended is scored; a query removed 2 s after its
    event's start is put aside whatever its trace says; a stopped run that covered the window is scored."""
    csv = write_annotations(tmp_path / "a.csv", [("stopped", "When I cook, remind me.", "cook", 26.5),
                                                 ("ended", "When I cook, remind me.", "cook", 26.5),
                                                 ("unsaid", "When I cook, remind me.", "cook", 26.5),
                                                 ("removed", "When I read, remind me.", "read", 10.0),
                                                 ("covered", "When I read, remind me.", "read", 10.0)])
    streams = []
    for video, text, ended, length in (("stopped", "When I cook, remind me.", False, 30),
                                       ("ended", "When I cook, remind me.", True, 30),
                                       ("unsaid", "When I cook, remind me.", None, 30),
                                       ("removed", "When I read, remind me.", True, 60),
                                       ("covered", "When I read, remind me.", False, 30)):
        probs = step_trace(length, [])[:, None]
        if video == "removed":
            probs[12:] = np.nan
        streams.append(StreamScores(video, 1.0, [text], ["q1"], np.zeros(1), probs, source_ended=ended))
    matched = match_traces(load_annotations(str(csv), split="val"), streams)
    assert [(a.video_uid, where) for a, where in matched.cut_short] == [("stopped", "its scores end at 30 s"),
                                                                         ("removed", "its scores end at 12 s")]
    assert [a.video_uid for a in matched.annotations] == ["ended", "unsaid", "covered"] and not matched.unseen
    assert [count for count, _ in matched.put_aside_notes()] == [2]


def test_a_query_a_stopped_run_never_alerted_on_counts_the_whole_videos_length_in_smd(tmp_path):
    """The reference counts a query without a prediction as the whole sequence, the video. A run stopped at 30 s of
    a 60-s video counted 30, so a model that never alerted looked twice as close. A trace that ended with its video
    keeps its own length, as the reference's does."""
    csv = write_annotations(tmp_path / "a.csv", [("stopped", "When I cook, remind me.", "cook", 10.0),
                                                 ("ended", "When I cook, remind me.", "cook", 10.0)], seconds=60.0)
    streams = [StreamScores(video, 1.0, ["When I cook, remind me."], ["q1"], np.zeros(1), step_trace(30, [])[:, None],
                            source_ended=ended) for video, ended in (("stopped", False), ("ended", True))]
    matched = match_traces(load_annotations(str(csv), split="val"), streams)
    stopped, ended = matched.traces
    assert stopped.length == 60 and stopped.scored.tolist() == [True] * 30 + [False] * 30
    assert ended.length == 30 and ended.scored is None
    assert [evaluate([trace], 0.5).min_distance[1] for trace in matched.traces] == [60.0, 30.0]


def test_a_query_removed_and_asked_again_is_scored_from_both_of_its_columns(tmp_path):
    """--watch-queries: the line removed at 30 s and put back at 40 s is a new query, a column of its own. Matched to
    the later column alone, its event at 10 s was put aside as asked after it, though the first column scored it."""
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 10.0),
                                                 ("v2", "When I cook, remind me.", "cook", 35.0),
                                                 ("v3", "When I cook, remind me.", "cook", 50.0)])
    streams = []
    for video, rise in (("v1", 11), ("v2", 36), ("v3", 51)):
        probs = np.stack([step_trace(60, [rise]), step_trace(60, [rise])], axis=1)
        probs[30:, 0], probs[:40, 1] = np.nan, np.nan
        streams.append(StreamScores(video, 1.0, ["When I cook, remind me."] * 2, ["q1", "q2"],
                                    np.array([0.0, 40.0]), probs))
    matched = match_traces(load_annotations(str(csv), split="val"), streams)
    assert [a.video_uid for a in matched.annotations] == ["v1", "v3"]
    assert [(a.video_uid, where) for a, where in matched.unseen] == [("v2", "no scores from 30 to 40 s")]
    result = evaluate(matched.traces, 0.5)
    assert result.queries == 2 and result.recall["[-5,+10]"][1] == 100.0 and result.min_distance[1] == 1.0


def test_eval_says_which_annotations_a_cut_trace_could_not_score_and_refuses_when_none_is_left(tmp_path):
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 10.0),
                                                 ("v1", "When I read, remind me.", "read", 45.0),
                                                 ("v1", "When I run, remind me.", "run", 25.0)])
    (tmp_path / "traces").mkdir()
    probs = np.stack([step_trace(30, [11]), step_trace(30, []), step_trace(30, [])], axis=1)
    save_scores(tmp_path / "traces" / "v1.npz", StreamScores("v1", 1.0, ["When I cook, remind me.",
                                                                         "When I read, remind me.",
                                                                         "When I run, remind me."], ["a", "b", "c"],
                                                             np.zeros(3), probs, source_ended=False))
    done = run_cli("eval", "--annotations", str(csv), "--scores", str(tmp_path / "traces"), "--plots", "0",
                   "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert ("note: 1 of 3 annotations are not scored: their score trace holds no score at their event's start (v1: "
            "its event at 45 s, its scores end at 30 s), so no frame could alert on it") in done.stdout
    assert ("note: 1 of 3 annotations are not scored: their tolerance window runs past where their scores stop (v1: "
            "its event at 25 s, its scores end at 30 s): an alert up to 10 s after an event's start counts") \
        in done.stdout
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert report["results"]["scores (traces)"]["queries"] == 1
    assert report["annotations_not_scored"] == {"without_trace": [], "no_score_at_their_start": [1],
                                                "unscored_in_their_window": [2]}  # by row, as not_scorable names them
    late = write_annotations(tmp_path / "late.csv", [("v1", "When I read, remind me.", "read", 45.0),
                                                     ("v1", "When I run, remind me.", "run", 25.0)])
    done = run_cli("eval", "--annotations", str(late), "--scores", str(tmp_path / "traces"), "--out",
                   str(tmp_path / "out2"))
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "none of the 2 annotations can be scored: the 2 with a trace in" in done.stderr
    assert "so no frame could alert on it" in done.stderr and "; and their tolerance window runs past" in done.stderr
    assert "score the whole video for them to count" in done.stderr


def test_a_resumed_runs_trace_scores_from_where_it_resumed_and_an_event_before_that_is_put_aside(tmp_path):
    """`run --resume` into a new --scores path: NaN for the 20 frames the stopped run saw. An event at 10 s was
    scored as a miss there, though this trace never looked at it."""
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 10.0),
                                                 ("v1", "When I read, remind me.", "read", 40.0)])
    probs = np.stack([step_trace(60, [11]), step_trace(60, [41])], axis=1)
    probs[:20] = np.nan
    (tmp_path / "traces").mkdir()
    save_scores(tmp_path / "traces" / "v1.npz", StreamScores("v1", 1.0, ["When I cook, remind me.",
                                                                         "When I read, remind me."], ["a", "b"],
                                                             np.zeros(2), probs))
    matched = match_traces(load_annotations(str(csv), split="val"), load_score_dir(tmp_path / "traces"))
    assert [t.asked_time for t in matched.traces] == [20.0, 20.0]
    result = evaluate(matched.traces, 0.5)
    assert result.queries == 1 and result.recall["[-5,+10]"][1] == 100.0 and len(result.not_scorable) == 1
    done = run_cli("eval", "--annotations", str(csv), "--scores", str(tmp_path / "traces"), "--plots", "1",
                   "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert ("note: scores (traces): 1 of 2 queries are not scored: their event had started before they were asked, "
            "or before their trace's first scored frame") in done.stdout
    plots = sorted(p.name for p in (tmp_path / "out" / "plots").rglob("*.png"))  # the scored query's alone
    assert plots == ["best-01-when-i-read-remind-me.png", "worst-01-when-i-read-remind-me.png"]


def test_the_threshold_sweep_spans_the_probabilities_observed_not_the_frames_never_scored(tmp_path):
    """A query asked at 20 s holds NaN before (read as 0 for its alerts): those zeros had pulled the sweep's lowest
    candidate to 0, where no sigmoid(cos) lies, leaving half of the paper's 20 candidates below every score."""
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 40.0)])
    probs = step_trace(60, [41], high=0.7, low=0.4)[:, None]
    probs[:20] = np.nan
    streams = [StreamScores("v1", 1.0, ["When I cook, remind me."], ["a"], np.array([20.0]), probs)]
    matched = match_traces(load_annotations(str(csv), split="val"), streams)
    sweep = calibrate_thresholds(matched.traces, ["cook"], per_label=False).sweep
    assert sweep[0][0] == pytest.approx(0.4) and sweep[-1][0] == pytest.approx(0.7)


def test_per_label_thresholds_pick_each_labels_own_best(tmp_path):
    # Label "a" rises to 0.6 at its events, label "b" to 0.9 with false alarms at 0.7 elsewhere:
    # the best global threshold cannot serve both; per-label ones can.
    traces, labels = [], []
    for i in range(6):
        p = np.full(60, 0.1)
        p[30] = 0.6
        traces.append(ScoreTrace(p, 30.0, 1.0, query_id=f"a{i}"))
        labels.append("a")
        q = np.full(60, 0.1)
        q[5] = 0.7
        q[40] = 0.9
        traces.append(ScoreTrace(q, 40.0, 1.0, query_id=f"b{i}"))
        labels.append("b")
    calibration = calibrate_thresholds(traces, labels, per_label=True)
    assert calibration.per_label["a"] < 0.6 and 0.7 <= calibration.per_label["b"] < 0.9
    pooled = evaluate_with(traces, labels, calibration.threshold, calibration.per_label)
    assert pooled.recall["[-5,+10]"][1] == 100.0
    assert evaluate_with(traces, labels, calibration.threshold).recall["[-5,+10]"][1] < 100.0


def test_eval_command_writes_tables_plots_and_the_calibrated_threshold_into_a_bundle(tmp_path):
    from conftest import random_model

    from sdqes_edge.export import ExportOptions, export_bundle
    from sdqes_edge.runtime.bundle import load_bundle

    bundle = tmp_path / "bundle"
    export_bundle(random_model("mlp"), bundle, ExportOptions(show_progress=False), log=lambda m: None)
    rows = [(f"v{i}", f"When I start task {i}, remind me.", "task", 20.0 + i) for i in range(6)]
    csv = write_annotations(tmp_path / "a.csv", rows)
    traces = tmp_path / "traces"
    traces.mkdir()
    for i, (video, query, _, start) in enumerate(rows):
        probs = step_trace(60, [int(start) + 1], high=0.8)[:, None]
        save_scores(traces / f"{video}.npz", StreamScores(video, 1.0, [query], ["0"], np.zeros(1), probs))
    done = run_cli("eval", "--annotations", str(csv), "--scores", str(traces), "--calibrate",
                   "--write-threshold", str(bundle), "--out", str(tmp_path / "out"), "--plots", "1")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    calibrated = report["results"]["scores (traces), calibrated"]
    assert calibrated["recall"]["[-5,+10]"]["1"] == 100.0 and calibrated["min_distance"]["1"] == 1.0
    assert "| scores (traces), calibrated |" in (tmp_path / "out" / "eval.md").read_text()
    paper = report["results"]["scores (traces), per-metric thresholds (paper)"]  # the reference's protocol
    assert set(paper["metric_thresholds"]) == {"[-5,+10]", "[-2,+5]", "SMD"} and paper["min_distance"]["1"] == 1.0
    plots = sorted((tmp_path / "out" / "plots").rglob("*.png"))
    assert len(plots) == 2 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    thresholds = load_bundle(bundle).manifest["thresholds"]  # hashes still verify after the rewrite
    assert 0.1 <= thresholds["default"] < 0.8
    assert thresholds["default"] == pytest.approx(report["calibration"]["scores (traces)"]["threshold"])


def test_eval_of_the_real_validation_split_with_both_baselines(egosdqes_csv, tmp_path):
    done = run_cli("eval", "--annotations", str(egosdqes_csv), "--baseline", "oracle", "random", "--plots", "0",
                   "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "eval.json").read_text())["results"]
    oracle = results["oracle"]
    assert oracle["queries"] == 3029
    assert all(v == 100.0 for by_k in oracle["recall"].values() for v in by_k.values())
    assert all(v == 0.0 for v in oracle["min_distance"].values())
    assert results["random (seed 0)"]["recall"]["[-5,+10]"]["1"] < 10.0


def test_eval_without_matplotlib_notes_it_first_and_writes_its_reports(egosdqes_csv, tmp_path):
    code = "import sys; sys.modules['matplotlib'] = None\nfrom sdqes_edge.cli import run\nsys.exit(run(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "eval", "--annotations", str(egosdqes_csv), "--baseline",
                           "oracle", "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("note: no plots: matplotlib is not installed")
    assert (tmp_path / "eval.json").is_file() and not (tmp_path / "plots").exists()


def test_traces_of_another_split_than_evals_default_are_refused_with_the_split_they_answer(tmp_path):
    """`score` scores every split, eval takes 'val' unless told: test streams' traces were refused as matching
    none of the annotations, which sent users looking for a naming fault."""
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 20.0),
                                                 ("v2", "When I run, remind me.", "run", 10.0)])
    csv.write_text(csv.read_text().replace("val,moments,v2", "test,moments,v2"))
    (tmp_path / "traces").mkdir()
    save_scores(tmp_path / "traces" / "v2.npz", StreamScores("v2", 1.0, ["When I run, remind me."], ["0"],
                                                             np.zeros(1), step_trace(60, [10])[:, None]))
    args = ["eval", "--annotations", str(csv), "--scores", str(tmp_path / "traces"), "--out", str(tmp_path / "o")]
    refused = run_cli(*args)
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "none of the 1 annotations of split 'val' has a trace in " + str(tmp_path / "traces")
        + "; its traces answer annotations of split 'test': give --split test")
    assert run_cli(*args, "--split", "test", "--plots", "0").returncode == 0


@pytest.mark.parametrize("stream, query, says", [
    ("v1", "when the blue ball starts rolling", "its traces of 1 annotated video(s) score other queries ('when the "
     "blue ball starts rolling') than the annotations ask of them; score the videos with their annotated queries: "
     "sdqes-edge score BUNDLE --annotations ANNOTATIONS.csv --videos FOLDER"),  # `run` with a query of one's own
    ("GH010042", "When I cook, remind me.", "traces are named for their video's file name ('GH010042'), annotations "
     "for their video_uid ('v1'); name each video for its video_uid"),  # a camera's file name, not the corpus's
])
def test_traces_that_answer_nothing_say_whether_their_videos_or_their_queries_differ(stream, query, says, tmp_path):
    csv = write_annotations(tmp_path / "a.csv", [("v1", "When I cook, remind me.", "cook", 20.0)])
    (tmp_path / "traces").mkdir()
    save_scores(tmp_path / "traces" / f"{stream}.npz",
                StreamScores(stream, 1.0, [query], ["0"], np.zeros(1), step_trace(60, [10])[:, None]))
    refused = run_cli("eval", "--annotations", str(csv), "--scores", str(tmp_path / "traces"), "--out",
                      str(tmp_path / "o"))
    assert refused.returncode == 2 and refused.stderr.strip().endswith(says), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_per_label_without_calibrate_is_warned_rather_than_ignored_silently(tmp_path):
    csv = write_annotations(tmp_path / "a.csv", [("v1", "q", "l", 3.0)])
    done = run_cli("eval", "--annotations", str(csv), "--baseline", "oracle", "--per-label", "--plots", "0",
                   "--out", str(tmp_path / "o"))
    assert done.returncode == 0 and done.stderr.splitlines()[0] == (
        "sdqes-edge: warning: --per-label chooses a threshold per label while calibrating; without --calibrate it "
        "does nothing: add --calibrate")


@pytest.mark.parametrize("args, message", [
    (["--baseline", "oracle", "--threshold", "1.5"], "--threshold is a probability"),
    (["--baseline", "oracle", "--write-threshold", "x"], "add --calibrate"),
    ([], "give --scores DIR"),
    (["--scores", "/nonexistent"], "--scores /nonexistent does not exist; give the folder"),  # was "not a directory"
])
def test_eval_refuses_bad_arguments_in_one_line(args, message, tmp_path):
    args, message = [a.format(tmp=tmp_path) for a in args], message.format(tmp=tmp_path)
    (tmp_path / "traces").mkdir()
    save_scores(tmp_path / "traces" / "v1.npz", StreamScores("v1", 1.0, ["q"], ["0"], np.zeros(1), np.zeros((5, 1))))
    csv = write_annotations(tmp_path / "a.csv", [("v1", "q", "l", 3.0)])
    done = run_cli("eval", "--annotations", str(csv), "--out", str(tmp_path / "o"), *args)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
