"""`run --resume` goes on as if the run had never stopped: a file where its snapshot stopped (not from its start
again), the alert states as they were (no second alert for an event still going on, max_alerts kept), and the
score trace whole, each row at its own frame."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from runtime_fixtures import QUERY, write_video

from sdqes_edge.cli import run
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores

FRAMES = 20  # sampled frames of the test video (40 frames at 10 fps, sampled at 5 fps)


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return write_video(tmp_path_factory.mktemp("resume") / "clip.avi", sample_frames(2 * FRAMES, 96, 128))


def stream(bundle, source, out, *extra: str) -> list[dict]:
    """`run` with an alert log, a score trace and a state snapshot in ``out``; the alerts logged so far."""
    assert run(["run", str(bundle), "--source", str(source), "--query", QUERY, "--quiet",
                "--events", str(out / "alerts.jsonl"), "--scores", str(out / "scores"),
                "--save-state", str(out / "state.npz"), *extra]) == 0
    return [json.loads(line) for line in (out / "alerts.jsonl").read_text().splitlines()]


def test_a_run_resumed_on_the_file_it_stopped_in_ends_as_the_run_that_never_stopped(exported, video, tmp_path):
    """It stepped the file from its start again with the state of the frames it had seen: the model saw them
    twice, the alert of an event still going on was raised again, and the trace started over."""
    _, bundle = exported
    (tmp_path / "whole").mkdir(), (tmp_path / "stopped").mkdir()
    whole = stream(bundle, video, tmp_path / "whole", "--threshold", "0.01")  # above it from the first frame on
    assert [a["frame_index"] for a in whole] == [0]
    stream(bundle, video, tmp_path / "stopped", "--threshold", "0.01", "--max-frames", "8")
    resumed = stream(bundle, video, tmp_path / "stopped", "--threshold", "0.01",
                     "--resume", str(tmp_path / "stopped" / "state.npz"))
    run_apart = {"latency_ms": resumed[0]["latency_ms"], "wall_time": resumed[0]["wall_time"]}  # not the stream's
    assert resumed == [dict(whole[0], **run_apart)]  # one alert, not a second one
    expected, got = load_scores(tmp_path / "whole" / "scores" / "clip.npz"), load_scores(
        tmp_path / "stopped" / "scores" / "clip.npz")
    assert got.probs.shape == (FRAMES, 1) and got.query_texts == [QUERY]
    np.testing.assert_allclose(got.probs, expected.probs, atol=1e-6)  # every frame once, in order
    ends = [np.load(tmp_path / name / "state.npz") for name in ("whole", "stopped")]
    assert ends[0]["frame_counts"].tolist() == ends[1]["frame_counts"].tolist() == [FRAMES]
    for key in (k for k in ends[0].files if k.startswith("state/")):
        np.testing.assert_allclose(ends[1][key], ends[0][key], atol=1e-6)


def test_a_snapshot_carried_into_the_next_file_starts_it_at_its_beginning_with_the_alert_counts_kept(
        exported, video, tmp_path):
    """A recording split into files: the next one is streamed from its start with the state carried on, at its
    own stream times; a query limited to one alert, which alerted in the first file, stays quiet."""
    _, bundle = exported
    other = write_video(tmp_path / "next.avi", sample_frames(2 * FRAMES, 96, 128)[::-1])
    first = stream(bundle, video, tmp_path, "--threshold", "0.01", "--max-alerts", "1")
    assert len(first) == 1
    stream(bundle, other, tmp_path, "--threshold", "0.01", "--max-alerts", "1",
           "--resume", str(tmp_path / "state.npz"), "--exit-threshold", "0.0")
    assert len((tmp_path / "alerts.jsonl").read_text().splitlines()) == 1  # no second alert
    trace = load_scores(tmp_path / "scores" / "next.npz")
    assert trace.probs.shape == (FRAMES, 1)  # the whole next file, from its first frame
    assert int(np.load(tmp_path / "state.npz")["frame_counts"][0]) == 2 * FRAMES


def test_resuming_with_other_queries_under_the_same_ids_keeps_the_earlier_scores_and_says_what_to_do(
        exported, video, tmp_path, capsys):
    _, bundle = exported
    stream(bundle, video, tmp_path, "--max-frames", "5")
    capsys.readouterr()
    assert run(["run", str(bundle), "--source", str(video), "--query", "Tell me when the lamp turns on.", "--quiet",
                "--scores", str(tmp_path / "scores"), "--resume", str(tmp_path / "state.npz")]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("sdqes-edge: error: ") and error.endswith(
        "with q1 asking 'When I start to clean or wipe the table, remind me to sanitize my hands.', not 'Tell me "
        "when the lamp turns on.'; ask the same queries, or give --scores a new path")
    assert load_scores(tmp_path / "scores" / "clip.npz").probs.shape == (5, 1)  # untouched


def test_the_trace_of_a_killed_run_left_in_chunks_still_gives_the_rows_before_the_resumed_frame(
        exported, video, tmp_path):
    """A run killed outright leaves its trace in chunks, not merged: they were deleted as stale before the resumed
    run could take its first rows from them."""
    from sdqes_edge.runtime.sinks import ScoreTraceRecorder

    _, bundle = exported
    (tmp_path / "whole").mkdir()
    stream(bundle, video, tmp_path / "whole")
    whole = load_scores(tmp_path / "whole" / "scores" / "clip.npz")
    path = tmp_path / "scores" / "clip.npz"
    killed = ScoreTraceRecorder(path, "clip", whole.fps)
    killed.on_query_added("q1", QUERY, 0.0)
    for p in whole.probs[:6, 0]:
        killed.on_frame(0, None, 0.0, {"q1": float(p)}, [])
    killed.flush()  # a chunk on disk, never merged: the process died here
    resumed = ScoreTraceRecorder(path, "clip", whole.fps, first_frame=6)
    resumed.on_query_added("q1", QUERY, 0.0)
    for p in whole.probs[6:, 0]:
        resumed.on_frame(0, None, 0.0, {"q1": float(p)}, [])
    resumed.close()
    np.testing.assert_allclose(load_scores(path).probs, whole.probs, atol=1e-6)


def test_a_snapshot_named_without_npz_is_reported_where_it_was_written_and_resumed_by_the_name_given(
        exported, video, tmp_path, capsys):
    """numpy adds .npz to the name: `--save-state run1` wrote run1.npz, said it wrote run1, and `--resume run1`
    answered that the snapshot did not exist."""
    _, bundle = exported
    args = ["run", str(bundle), "--source", str(video), "--query", QUERY, "--quiet", "--max-frames", "5"]
    assert run([*args, "--save-state", str(tmp_path / "run1")]) == 0
    err = capsys.readouterr().err
    assert f"snapshot goes to {tmp_path / 'run1.npz'}" in err and err.splitlines()[-1].endswith("run1.npz")
    assert run([*args, "--resume", str(tmp_path / "run1"), "--save-state", str(tmp_path / "run2.npz")]) == 0
    assert np.load(tmp_path / "run2.npz")["frame_counts"].tolist() == [10]  # the first run's 5 frames, then 5


def test_a_file_resumed_where_it_had_already_ended_says_so_and_keeps_its_trace(exported, video, tmp_path, capsys):
    """Resuming a file streamed to its end stepped nothing and printed "done: 0 frames", with no word of why (and a
    speed and latency of 0.0, measured of nothing)."""
    _, bundle = exported
    stream(bundle, video, tmp_path)
    whole = load_scores(tmp_path / "scores" / "clip.npz")
    capsys.readouterr()
    stream(bundle, video, tmp_path, "--resume", str(tmp_path / "state.npz"))
    said = capsys.readouterr().err.splitlines()
    assert (f"sdqes-edge: note: clip has no frames after {FRAMES / 5:g} s, where the state snapshot stopped: the run "
            "it resumes had streamed it to its end") in said
    assert "done: 0 frames, 0 alerts" in said  # no "0.0 frames/s, latency 0.0 ms": nothing was timed
    np.testing.assert_array_equal(load_scores(tmp_path / "scores" / "clip.npz").probs, whole.probs)


def test_a_state_file_is_resumed_where_it_exists_and_written_either_way_as_a_restarted_service_needs(
        exported, video, tmp_path, capsys):
    """`--resume S --save-state S` in a service's command refused its first start (no snapshot yet); `--state S`
    is both, from the first start on: a restart goes on where the last run stopped."""
    _, bundle = exported
    state = tmp_path / "state.npz"
    command = ["run", str(bundle), "--source", str(video), "--query", QUERY, "--scores", str(tmp_path / "scores"),
               "--state", str(state)]
    assert run([*command, "--max-frames", "8"]) == 0  # the first start
    assert "note: no state snapshot at" in capsys.readouterr().err and state.is_file()
    assert run(command) == 0  # the restart: the file goes on at its ninth frame
    assert int(np.load(state)["frame_counts"][0]) == FRAMES
    assert load_scores(tmp_path / "scores" / "clip.npz").probs.shape == (FRAMES, 1)  # every frame once
    assert run([*command, "--save-state", str(tmp_path / "other.npz")]) == 2
    assert capsys.readouterr().err.rstrip().endswith("give it alone, or --save-state alone")


def frames_of(path) -> np.ndarray:
    video, frames = cv2.VideoCapture(str(path)), []
    while (read := video.read())[0]:
        frames.append(read[1])
    return np.array(frames, np.int16)


def test_a_resumed_runs_annotated_video_is_one_whole_video_the_stopped_runs_frames_first(exported, video, tmp_path):
    """The resumed run wrote its annotated video over the stopped run's, and the stream's beginning was gone."""
    _, bundle = exported
    for name, extra in (("whole", []), ("stopped", ["--max-frames", "8"])):
        (tmp_path / name).mkdir()
        stream(bundle, video, tmp_path / name, "--annotate", str(tmp_path / name / "a.avi"), *extra)
    stopped_run = frames_of(tmp_path / "stopped" / "a.avi")
    stream(bundle, video, tmp_path / "stopped", "--annotate", str(tmp_path / "stopped" / "a.avi"),
           "--resume", str(tmp_path / "stopped" / "state.npz"))
    whole, resumed = frames_of(tmp_path / "whole" / "a.avi"), frames_of(tmp_path / "stopped" / "a.avi")
    assert len(stopped_run) == 8 and len(resumed) == len(whole) == FRAMES
    assert np.abs(resumed[:8] - stopped_run).mean() < 2  # its frames, decoded and written again
    assert np.abs(resumed - whole).mean() < 2  # as if it had never stopped
    assert sorted(p.name for p in (tmp_path / "stopped").iterdir()) == ["a.avi", "alerts.jsonl", "scores",
                                                                        "state.npz"]


def test_a_run_resumed_into_another_file_keeps_the_stopped_runs_annotated_video_beside_its_own(exported, video,
                                                                                            tmp_path, capsys):
    _, bundle = exported
    stream(bundle, video, tmp_path, "--annotate", str(tmp_path / "a.avi"))
    stopped_run = frames_of(tmp_path / "a.avi")
    other = write_video(tmp_path / "other.avi", sample_frames(2 * FRAMES, 96, 128)[::-1])
    stream(bundle, other, tmp_path, "--annotate", str(tmp_path / "a.avi"), "--resume", str(tmp_path / "state.npz"))
    [kept] = tmp_path.glob("a.stopped-run-*.avi")
    assert f"the stopped run's annotated video is kept as {kept}" in capsys.readouterr().err
    assert np.array_equal(frames_of(kept), stopped_run) and len(frames_of(tmp_path / "a.avi")) == FRAMES
