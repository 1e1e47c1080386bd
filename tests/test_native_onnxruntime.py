"""sdqes-run's whole streaming loop, run here on its ONNX Runtime backend (TensorRT cannot run here): it alerts on a
video frame for frame as `sdqes-edge run` does (a bundle exported with --fuse-queries too), keeps each query's alert
state across a restart (--state), goes on in a video where the stopped run left it, streams several sources in one
graph as `sdqes-edge run` does, and on a live stream tells systemd it is ready and stops on SIGTERM with 143, its
alert log complete."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from http.server import BaseHTTPRequestHandler

import numpy as np
import pytest
from native_fixtures import alerts, python_alerts_at_a_busy_threshold

# sdqes-run's summary, its last line where nothing went wrong, as `sdqes-edge run`'s: "done: 75 frames, 15 alerts,
# 731.5 frames/s, latency p50 1.2 ms p99 1.4 ms".
LAST_LINE = re.compile(r"done: (\d+) (frame|step)s?( of \d+ sources)?, (\d+) alerts?, [\d.]+ \2s/s, "
                       r"latency p50 ([\d.]+) ms p99 ([\d.]+) ms")


def last_line(stderr: str) -> tuple[int, int]:
    """-> (frames or steps, alerts) of sdqes-run's last line, checked whole, latencies included."""
    found = LAST_LINE.fullmatch(stderr.strip().splitlines()[-1])
    assert found, stderr
    assert 0 < float(found.group(5)) <= float(found.group(6))
    return int(found.group(1)), int(found.group(4))


# What an alert line says besides its score, which the two runtimes compute apart (compared to 1e-5).
ALERT_FIELDS = ("query_id", "query", "message", "stream", "frame_index", "stream_time", "threshold", "label")


def same_alerts(native: list[dict], python: list[dict]) -> float:
    """Each native alert on the Python one's frame with its fields (ALERT_FIELDS); -> the largest score difference,
    held under 1e-5 (the two runtimes compute the score apart)."""
    assert [[a[k] for k in ALERT_FIELDS] for a in native] == [[a[k] for k in ALERT_FIELDS] for a in python]
    largest = max(abs(a["score"] - b["score"]) for a, b in zip(native, python))
    assert largest < 1e-5
    return largest


@pytest.mark.parametrize("kind", ["plain", "fused"])
def test_sdqes_run_on_onnx_runtime_alerts_frame_for_frame_as_sdqes_edge_run_does(sdqes_run_on_the_cpu, bundles, kind,
                                                                                 video, tmp_path):
    """At a threshold the first query's score crosses again and again (its median), a state carried wrong, or not
    at all, would move a crossing: every alert must fall on the same frame, with the same fields. A bundle exported
    with --fuse-queries is given its queries' embeddings with every frame and alerts on the graph's own cosines."""
    bundle = bundles[kind]
    threshold, python = python_alerts_at_a_busy_threshold(bundle, video, tmp_path)
    native_log = tmp_path / "native.jsonl"
    done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threshold", threshold,
                           "--events", str(native_log)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    fused_words = ", its queries scored inside the graph" if kind == "fused" else ""
    assert "(ONNX Runtime " in done.stderr and f"on the CPU, step.fp32.onnx{fused_words})" in done.stderr
    native = alerts(native_log)
    assert last_line(done.stderr) == (75, len(native))
    largest = same_alerts(native, python)
    print(f"\n{kind}: {len(native)} alerts over 75 frames at threshold {threshold}, on the same frames; scores "
          f"within {largest:.1e}")


def test_threads_past_the_cores_are_brought_down_to_them_with_a_warning_naming_the_number_asked(sdqes_run_on_the_cpu,
                                                                                                bundle, video):
    """As the Python runtime words it (runtime/cores.py); the warning said 1024 for any larger number, which sdqes-run
    took first."""
    from sdqes_edge.runtime.cores import usable_cores

    done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threads", "5000", "--max-frames",
                           "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cores = usable_cores()
    assert done.stderr.splitlines()[0] == (f"sdqes-run: warning: 5000 threads asked of ONNX Runtime, but this process "
                                           f"may use {cores} core(s); using {cores} (more would only take turns on "
                                           "them)")


def test_a_restarted_sdqes_run_keeps_each_querys_alert_count_with_state(sdqes_run_on_the_cpu, bundle, video,
                                                                        tmp_path):
    """A service restarted after a lost camera or a reboot gave a reminder asked once (--max-alerts 1) again."""
    log, state = tmp_path / "alerts.jsonl", tmp_path / "state.json"
    command = [str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threshold", "0.001", "--max-alerts", "1",
               "--events", str(log), "--state", str(state), "--max-frames", "10"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and f"no alert state at {state} yet" in first.stderr, first.stderr
    assert len(alerts(log)) == 2  # each query at its first frame
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert f"resumed the alert state of 2 of 2 queries from {state}" in second.stderr
    assert len(alerts(log)) == 2  # asked once, alerted once, across the restart
    assert [entry["count"] for entry in json.loads(state.read_text())["alerts"]] == [1, 1]
    assert not list(tmp_path.glob(".*.lock"))  # the locks on the log and the state (test_output_locks.py), let go


def test_a_video_stopped_and_started_again_with_state_goes_on_where_it_stopped_alerting_as_one_run(
        sdqes_run_on_the_cpu, bundle, video, tmp_path):
    """A run stopped after 40 of the video's 75 samples and started again with the same --state goes on at sample
    40 (8 s), with the model's memory, the alert states and the stream times of the run that stopped: the alerts of
    the two runs together are those of one uninterrupted run, frame for frame (the video stepped again from its start
    had its first part seen twice and alerted twice). Started a third time, it has nothing left: 0 frames, said why."""
    threshold, python = python_alerts_at_a_busy_threshold(bundle, video, tmp_path)
    log, state = tmp_path / "native.jsonl", tmp_path / "state.json"

    def sdqes_run(*limit: str) -> str:
        done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threshold", threshold,
                               "--events", str(log), "--state", str(state), *limit], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stderr

    assert last_line(sdqes_run("--max-frames", "40"))[0] == 40
    assert json.loads(state.read_text())["position"] == 40
    said = sdqes_run()
    assert f"sdqes-run: note: kitchen goes on at 8 s, where the run that saved {state} stopped" in said
    assert last_line(said)[0] == 35
    native = alerts(log)
    assert any(a["frame_index"] < 40 for a in native) and any(a["frame_index"] >= 40 for a in native)
    largest = same_alerts(native, python)
    print(f"\n{len(native)} alerts over 40 + 35 frames, on the uninterrupted run's frames; scores within {largest:.1e}")
    said = sdqes_run()
    assert said.strip().splitlines()[-2:] == [  # the summary, then why, as `sdqes-edge run` ends
        "done: 0 frames, 0 alerts", "sdqes-run: note: kitchen has no frames after 15 s, where --state had it: the run "
        "it resumes had streamed it to its end"]
    assert len(alerts(log)) == len(native)


def test_sdqes_run_names_a_cut_off_video_in_one_line_with_no_words_of_opencvs_above_it(sdqes_run_on_the_cpu, bundle,
                                                                                       tmp_path):
    """OpenCV's own AVI reader, tried where FFmpeg could not open the file, printed "Unexpected element. Expected:
    LIST. Got: ..." (bytes of the file among the words) above sdqes-run's error."""
    from runtime_fixtures import write_video

    from sdqes_edge.sample import sample_frames

    cut = tmp_path / "cut.avi"
    cut.write_bytes(write_video(tmp_path / "whole.avi", sample_frames(12, 48, 64)).read_bytes()[:200])
    done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", str(cut)], capture_output=True, timeout=300)
    said = done.stderr.decode(errors="replace")  # bytes: the reader's words were not always UTF-8
    assert done.returncode == 2 and said.splitlines() == [f"sdqes-run: error: OpenCV cannot open {cut}; check the "
                                                          "file plays"], said


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system (Linux has one)")
def test_sdqes_run_whose_alert_log_or_stdout_the_disk_refuses_says_so_in_one_line_with_exit_status_1(
        sdqes_run_on_the_cpu, bundle, video):
    """A full disk is the machine's state, not a mistaken command: exit status 1, as `sdqes-edge run` ends (it was
    2). /dev/full refuses every write as a full disk does."""
    done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threshold", "0.0001",
                           "--events", "/dev/full"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "sdqes-run: error: cannot append an alert to /dev/full (No space left on device): is the disk full? free some "
        "space or write to another disk, and run again")
    with open("/dev/full", "w") as full:  # its alerts printed on a stdout that refuses them: they were lost, exit 0
        done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threshold", "0.0001"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "sdqes-run: error: cannot print an alert on stdout (No space left on device): the file or disk it goes to "
        "refuses it; free some space there or send stdout elsewhere, and run again")


def test_sdqes_run_events_dash_is_stdout_the_alerts_jsonl_alone_as_in_sdqes_edge_run(sdqes_run_on_the_cpu, bundle,
                                                                                       video, tmp_path):
    """It wrote a file named '-', and its printed alert lines went into the JSONL read from stdout."""
    done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--threshold", "0.3", "--events", "-"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    alerts = [json.loads(line) for line in done.stdout.splitlines()]
    assert alerts and all(alert["frame_index"] == 0 for alert in alerts)
    assert done.stderr.count("(p=") == len(alerts)  # the printed lines, on stderr
    assert not (tmp_path / "-").exists()


def test_sdqes_run_on_a_live_stream_tells_systemd_it_is_ready_and_stops_on_sigterm_with_its_log_complete(
        sdqes_run_on_the_cpu, bundle, endless_stream, tmp_path):
    address = f"@sdqes-notify-test-{os.getpid()}"  # abstract: a tmp path may pass the 108 bytes a socket name has
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind("\0" + address[1:])
        systemd.settimeout(120)
        log = tmp_path / "alerts.jsonl"
        service = subprocess.Popen([str(sdqes_run_on_the_cpu), bundle, "--source", endless_stream, "--threshold",
                                    "0.001", "--events", str(log)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True, env={**os.environ, "NOTIFY_SOCKET": address})
        try:
            ready = systemd.recv(4096).decode()
            assert ready.startswith("READY=1\nSTATUS=streaming 127.0.0.1-"), ready
            deadline = time.monotonic() + 60
            while (not log.exists() or len(log.read_text().splitlines()) < 2) and time.monotonic() < deadline:
                time.sleep(0.05)
            service.send_signal(signal.SIGTERM)
            assert service.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            service.kill()
        said = service.stderr.read()
        systemd.settimeout(1)
        told = []
        while True:
            try:
                told.append(systemd.recv(4096).decode())
            except socket.timeout:  # TimeoutError from Python 3.10 on
                break
    assert "; Ctrl-C to stop" in said and "sdqes-run: interrupted (SIGTERM) after " in said, said
    assert re.search(r"interrupted \(SIGTERM\) after \d+ frames?, 2 alerts, [\d.]+ frames/s, latency p50 ", said), said
    assert told and told[-1].startswith("STOPPING=1\nSTATUS=stopping after "), told
    assert [a["message"] for a in alerts(log)] == ["Wash your hands.", "Tea!"]  # whole lines, each query once


def test_sdqes_run_streams_several_sources_in_one_graph_as_sdqes_edge_run_does(sdqes_run_on_the_cpu,
                                                                              three_camera_bundles, video, tmp_path):
    """Two videos of different lengths through a bundle that steps three streams: every step takes a frame of each
    source, the shorter one idles (its memory kept) once it has ended, and the third stream idles throughout.
    Every alert of either stream falls on `sdqes-edge run --source A --source B`'s frame, with its fields; --state
    keeps a file for each stream beside the one named; sources named alike are named apart; more sources than streams
    are refused in one line."""
    from runtime_fixtures import write_video

    from sdqes_edge.cli import run
    from sdqes_edge.sample import sample_frames
    from sdqes_edge.traces import load_scores

    bundle = str(three_camera_bundles["plain"])
    garage = str(write_video(tmp_path / "garage.avi", sample_frames(150, 96, 128)[::-1][:80].copy()))  # 40 steps
    sources = ["--source", video, "--source", garage]
    assert run(["run", bundle, *sources, "--scores", str(tmp_path / "scores"), "--quiet"]) == 0
    probs = np.concatenate([load_scores(tmp_path / "scores" / f"{name}.npz").probs for name in ("kitchen", "garage")])
    threshold = f"{np.median(probs[:, 0]):.6f}"  # crossed again and again in both streams
    assert run(["run", bundle, *sources, "--threshold", threshold, "--events", str(tmp_path / "python.jsonl"),
                "--quiet"]) == 0
    python = alerts(tmp_path / "python.jsonl")
    assert {a["stream"] for a in python} == {"kitchen", "garage"} and len(python) >= 8
    native_log, state = tmp_path / "native.jsonl", tmp_path / "state.json"
    done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, *sources, "--threshold", threshold, "--events",
                           str(native_log), "--state", str(state)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "streaming kitchen, garage at 5 fps with 2 queries" in done.stderr
    native = alerts(native_log)
    assert last_line(done.stderr) == (75, len(native))  # steps: the longer source's frames
    assert "done: 75 steps of 2 sources, " in done.stderr
    largest = same_alerts(native, python)
    print(f"\ntwo sources: {len(native)} alerts at threshold {threshold}, on the same frames; scores within "
          f"{largest:.1e}")
    assert not state.exists() and all(json.loads((tmp_path / f"state.{name}.json").read_text())["alerts"]
                                      for name in ("kitchen", "garage"))
    assert all((tmp_path / f"state.{name}.memory").stat().st_size > 0 for name in ("kitchen", "garage"))
    twice = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--source", video, "--max-frames",
                            "3", "--state", str(tmp_path / "again.json")], capture_output=True, text=True, timeout=300)
    assert twice.returncode == 0, twice.stderr  # named apart, as `sdqes-edge run` names them
    assert "several sources have the same name; in alerts and outputs they are called kitchen, kitchen-2" in \
        twice.stderr and {f.name for f in tmp_path.glob("again.*")} == {"again.kitchen.json", "again.kitchen-2.json",
                                                       "again.kitchen.memory", "again.kitchen-2.memory"}
    too_many = subprocess.run([str(sdqes_run_on_the_cpu), bundle, *sources, *sources], capture_output=True, text=True,
                              timeout=60)
    assert too_many.returncode == 2 and too_many.stderr.strip() == (
        "sdqes-run: error: 4 sources but the bundle steps 3 stream(s) at once; re-export with --batch 4")


def test_a_stalled_camera_does_not_hold_the_other_streams_steps_in_sdqes_run(sdqes_run_on_the_cpu,
                                                                             three_camera_bundles):
    """Two live streams, one of which stops sending after a few frames while keeping its connection open (the read
    OpenCV is inside blocks): its stream idles, memory kept, and the run goes on stepping the other to its 40
    steps (8 s at 5 fps), where waiting for both in every step it would have stalled with it (as
    tests/test_stalled_camera.py checks of `sdqes-edge run`); past 5 s the stalled one is named."""
    from runtime_fixtures import EndlessMJPEG, serving

    class Stalls(EndlessMJPEG):
        def do_GET(self):
            Stalls.frames = 3
            super().do_GET()  # three frames, then silence with the connection held
            time.sleep(60)

    with serving(EndlessMJPEG) as steady, serving(Stalls) as stalled:
        started = time.monotonic()
        done = subprocess.run([str(sdqes_run_on_the_cpu), str(three_camera_bundles["plain"]), "--source",
                               f"{steady}/a.mjpg", "--source", f"{stalled}/b.mjpg", "--max-frames", "40"],
                              capture_output=True, text=True, timeout=50)
        took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "done: 40 steps of 2 sources, " in done.stderr, done.stderr
    assert took < 40, f"{took:.0f} s: the steps waited for the stalled camera"
    assert re.search(r"sdqes-run: 127\.0\.0\.1-\d+-b\.mjpg has sent no frame for [\d.]+ s: its stream idles, memory "
                     r"kept, while the others step", done.stderr), done.stderr


def test_sdqes_run_names_a_stream_still_opening_and_a_stop_there_ends_it_at_once(sdqes_run_on_the_cpu, bundle):
    """A stream that answers but sends nothing holds OpenCV's open for its timeout (here --stream-timeout 8):
    past 5 s it is named, as `sdqes-edge run` names it. No stop handler is in place yet, nothing having been
    written: SIGTERM ends the process at once, by the signal."""
    from runtime_fixtures import Quiet, seconds_to_stop, serving

    class Silent(Quiet, BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(40)

    with serving(Silent) as address:
        process = subprocess.Popen([str(sdqes_run_on_the_cpu), bundle, "--source", f"{address}/cam.mjpg",
                                    "--stream-timeout", "8"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        said = next((line for line in process.stderr if "still opening" in line), "")
        stopped_after = seconds_to_stop(process)
    assert said.startswith(f"sdqes-run: still opening {address}/cam.mjpg after 5 s: OpenCV waits up to 8 s for a "
                           "stream that answers but sends nothing") and "Ctrl-C" in said, said
    assert process.returncode == -signal.SIGTERM and stopped_after < 5, process.stderr.read()


def test_sdqes_run_of_two_cameras_starts_without_one_that_is_absent_and_says_so_in_its_own_lines(
        sdqes_run_on_the_cpu, three_camera_bundles):
    """As `sdqes-edge run` (tests/test_cameras_that_come_and_go.py): the other camera streams, the absent one is
    tried again and named at the end, exit 1. Every line is sdqes-run's own: OpenCV's and FFmpeg's logs (a dozen
    lines of its backends' errors for a URL it cannot open) are silenced, as the Python runtime silences them."""
    from runtime_fixtures import EndlessMJPEG, Quiet, serving

    class Absent(Quiet, BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

    with serving(EndlessMJPEG) as kitchen, serving(Absent) as porch:
        done = subprocess.run([str(sdqes_run_on_the_cpu), str(three_camera_bundles["plain"]), "--source",
                               f"{kitchen}/kitchen.mjpg", "--source", f"{porch}/porch.mjpg", "--max-frames", "20"],
                              capture_output=True, text=True, timeout=60)
    said = done.stderr
    assert done.returncode == 1, said
    assert f"sdqes-run: warning: OpenCV cannot open {porch}/porch.mjpg; " in said, said
    assert "The other cameras start without it" in said, said
    assert "done: 20 steps of 2 sources, " in said, said  # the run's summary, as `sdqes-edge run` gives it too
    assert re.search(r"sdqes-run: error: 127\.0\.0\.1-\d+-porch\.mjpg was not sending frames when the run ended \(it "
                     r"was being reconnected\) \(exit status 1\)", said), said
    assert all(line.startswith(("sdqes-run: ", "done: ")) for line in said.strip().splitlines()), said


def test_sdqes_run_refuses_a_served_video_file_taken_for_a_camera_once_it_opens(sdqes_run_on_the_cpu,
                                                                                three_camera_bundles, tmp_path):
    """As `sdqes-edge run` (tests/test_cameras_that_come_and_go.py): a URL down when a run of cameras started was
    waited for as a camera; once up, a video file there is not played live (stamped by the clock, replayed forever).
    The run says what it streamed first, then why it ended, exit 1."""
    import functools
    from http.server import SimpleHTTPRequestHandler

    from runtime_fixtures import EndlessMJPEG, Quiet, run_doing_on_a_line, serving, write_video

    from sdqes_edge.sample import sample_frames

    class Files(Quiet, SimpleHTTPRequestHandler):
        pass

    site_folder = tmp_path / "site"
    site_folder.mkdir()
    with serving(EndlessMJPEG) as kitchen, serving(functools.partial(Files, directory=str(site_folder))) as site:
        # The file is put there once the run has started without it.
        status, said = run_doing_on_a_line(
            [str(sdqes_run_on_the_cpu), str(three_camera_bundles["plain"]), "--source", f"{kitchen}/kitchen.mjpg",
             "--source", f"{site}/porch.avi"], "The other cameras start without it",
            lambda: write_video(site_folder / "porch.avi", sample_frames(12, 48, 64)), timeout=60)
    assert status == 1, said
    assert f"sdqes-run: warning: OpenCV cannot open {site}/porch.avi; " in said, said
    assert re.fullmatch(r"sdqes-run: interrupted after \d+ steps of 2 sources, .*", said.strip().splitlines()[-2]), said
    assert said.strip().splitlines()[-1] == (
        f"sdqes-run: error: {site}/porch.avi serves a video file, not a live stream, and a live source would stamp its "
        "frames by the clock, drop most of them and replay it forever: it could not be opened when the run started, "
        "so it was taken for a camera; start the run again to read it as the file it is"), said


def test_sdqes_run_reconnects_a_stream_that_stalls_after_its_timeout_not_ffmpegs_30_s(sdqes_run_on_the_cpu, bundle,
                                                                                       video):
    """As `sdqes-edge run` (tests/test_stream_timeouts.py): a stream that sends a few frames, then nothing, its
    connection left open, is reopened once --stream-timeout (here 2 s; by default kStreamTimeoutS, 10 s) has passed
    without a frame. Given with no stream URL among the sources, --stream-timeout is said to change nothing."""
    from runtime_fixtures import seconds_to_stop, serving
    from test_stream_timeouts import FFMPEG_OWN_TIMEOUT_S, SendsThenStalls

    from sdqes_edge.runtime.live_source import STREAM_TIMEOUT_S

    GIVEN_TIMEOUT_S = 2
    with serving(SendsThenStalls) as address:
        started = time.monotonic()
        process = subprocess.Popen([str(sdqes_run_on_the_cpu), bundle, "--source", f"{address}/cam.mjpg",
                                    "--stream-timeout", str(GIVEN_TIMEOUT_S)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        reconnecting = next((line for line in process.stderr if "no frame; reconnecting" in line), "")
        noticed_after = time.monotonic() - started
        seconds_to_stop(process)
    assert reconnecting.startswith("sdqes-run: 127.0.0.1-"), reconnecting
    assert GIVEN_TIMEOUT_S <= noticed_after < STREAM_TIMEOUT_S < FFMPEG_OWN_TIMEOUT_S
    done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--stream-timeout", "30",
                           "--max-frames", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and ("sdqes-run: warning: --stream-timeout is for stream URLs (rtsp://, http://, "
                                     "udp://, tcp://), and no --source is one: ignored") in done.stderr, done.stderr
