"""sdqes-run's whole streaming loop, run here on its ONNX Runtime backend (TensorRT cannot run here): it alerts on a
video frame for frame as `sdqes-edge run` does (a bundle exported with --fuse-queries too), keeps each query's
alert state across a restart (--state), and on a live stream tells systemd it is ready and stops on SIGTERM with
143, its alert log complete."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest
from native_fixtures import alerts, python_alerts_at_a_busy_threshold

# What an alert line says besides its score, which the two runtimes compute apart (compared to 1e-5).
ALERT_FIELDS = ("query_id", "query", "message", "stream", "frame_index", "stream_time", "threshold", "label")


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
    assert done.stderr.strip().splitlines()[-1] == "done: 75 frames"
    native = alerts(native_log)
    assert [[a[k] for k in ALERT_FIELDS] for a in native] == [[a[k] for k in ALERT_FIELDS] for a in python]
    largest = max(abs(a["score"] - b["score"]) for a, b in zip(native, python))
    print(f"\n{kind}: {len(native)} alerts over 75 frames at threshold {threshold}, on the same frames; scores "
          f"within {largest:.1e}")
    assert largest < 1e-5


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
    assert told and told[-1].startswith("STOPPING=1\nSTATUS=stopping after "), told
    assert [a["message"] for a in alerts(log)] == ["Wash your hands.", "Tea!"]  # whole lines, each query once
