"""stdout's reader may leave (`sdqes-edge ... | head -3`, a notifier that exits): no traceback, nothing lost.

Each command here runs with its stdout a pipe whose reading end is already closed, so its first line meets a
reader that has gone, whatever the pipe's buffer holds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from runtime_fixtures import QUERY, write_video

from sdqes_edge.sample import sample_frames


def without_a_reader(*args: str, stderr_too: bool = False) -> subprocess.CompletedProcess:
    """The command line (its real entry point, ``main``) with nobody reading its stdout (and its stderr, where
    ``stderr_too``: ``2>&1 | head``)."""
    proc = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE, text=True)
    proc.stdout.close()  # before the command writes anything
    err = "" if stderr_too else proc.stderr.read()
    proc.wait(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, None, err)


def test_a_command_whose_reader_left_finishes_its_work_without_a_traceback(egosdqes_csv, tmp_path):
    done = without_a_reader("eval", "--annotations", str(egosdqes_csv), "--baseline", "oracle", "--plots", "0",
                            "--out", str(tmp_path))
    assert done.returncode == 0 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert json.loads((tmp_path / "eval.json").read_text())["results"]["oracle"]["queries"] == 3029  # written whole


def test_run_stops_after_the_frame_in_hand_once_the_alerts_reader_left_and_the_alert_log_has_them(exported,
                                                                                                  tmp_path):
    """An alert printed to a closed pipe raised before the alert log had it, in a traceback; a stream may never end,
    so run stops as a process that SIGPIPE ends would, its outputs complete."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(40, 60, 80))
    events = tmp_path / "alerts.jsonl"
    done = without_a_reader("run", str(bundle), "--source", str(video), "--query", QUERY, "--query", "a second query",
                            "--threshold", "0.01", "--events", str(events))
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 128 + signal.SIGPIPE
    assert "stopping: the program reading the alerts on stdout has closed it" in done.stderr
    alerts = [json.loads(line) for line in events.read_text().splitlines()]
    assert sorted(a["query"] for a in alerts) == sorted([QUERY, "a second query"])  # frame 0, both queries
    assert "interrupted after 1 frame," in done.stderr


def test_run_with_stderr_in_the_same_closed_pipe_still_logs_every_alert(exported, tmp_path):
    """``2>&1 | head -2``: the first line on stderr met the closed pipe, and the traceback ended the run before any
    alert was logged (exit 1, an empty alert log)."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(40, 60, 80))
    events = tmp_path / "alerts.jsonl"
    done = without_a_reader("run", str(bundle), "--source", str(video), "--query", QUERY, "--threshold", "0.01",
                            "--events", str(events), stderr_too=True)
    assert done.returncode == 128 + signal.SIGPIPE
    assert [json.loads(line)["query"] for line in events.read_text().splitlines()] == [QUERY]


def test_events_dash_is_stdout_the_alerts_jsonl_alone_and_its_reader_leaving_is_a_stop(exported, tmp_path):
    """`run --events - | jq`: it wrote a file named '-' in the working folder, and with --events /dev/stdout the
    console's alert lines were mixed into the JSONL, breaking its reader; a reader that left was a traceback."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(40, 60, 80))
    run = [sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video), "--query", QUERY,
           "--query", "a second query", "--threshold", "0.3", "--events", "-"]
    done = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(line)["query"] for line in done.stdout.splitlines()) == sorted([QUERY, "a second query"])
    assert done.stderr.count(f"] {QUERY}   (query q1: p=") == 1  # the console's line, on stderr
    assert not (tmp_path / "-").exists()
    left = without_a_reader(*run[3:])
    assert "Traceback" not in left.stderr and left.returncode == 128 + signal.SIGPIPE, left.stderr
    assert "stopping: the program reading the alert log (--events /dev/stdout) has closed it" in left.stderr
