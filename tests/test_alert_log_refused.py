"""An alert log the disk refuses while the stream goes on (full, a quota) is said once, however many alerts are
refused in a row, and the stream goes on alerting: the refused alerts are held in memory and written, in order and
as whole lines, with the next alert the disk takes (or by the clock between alerts), and that is said too. Still
refused when the stream ends, it is the run's error (exit 1), naming the log and the alerts it lost. The run had
ended at the first refused line, every other output with it, and a service restarted into the same full disk.
The refusals are real: a file-size limit (EFBIG, as a full disk's ENOSPC)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time

import pytest
from runtime_fixtures import QUERY, seconds_to_stop
from test_full_disk import file_size_limit

from sdqes_edge.runtime import AlertEvent, JsonlSink

ROOM_FOR_TWO = 2 * len(json.dumps(AlertEvent("q1", QUERY, "Wash!", "cam", 0.0, 0, 0.9, 0.2, 3.0).to_dict())) + 40
NO_ROOM = 100  # bytes: less than one line


def alert(frame: int) -> AlertEvent:
    return AlertEvent("q1", QUERY, "Wash!", "cam", frame / 2.0, frame, 0.9, 0.2, 3.0)


def frames_in(path) -> list[int]:
    lines = path.read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines)  # whole lines only
    return [json.loads(line)["frame_index"] for line in lines]


def sink_saying(path, said: list[str]) -> JsonlSink:
    sink = JsonlSink(path)
    sink.log = said.append
    return sink


def test_alerts_the_disk_refuses_are_said_once_held_and_written_in_order_with_the_next_it_takes(tmp_path):
    log, said = tmp_path / "alerts.jsonl", []
    sink = sink_saying(log, said)
    with file_size_limit(ROOM_FOR_TWO):
        for frame in range(5):  # the third and every later one refused: no exception, the stream goes on
            sink.on_event(alert(frame))
        assert said == [f"warning: cannot append alerts to the alert log {log} (File too large); the stream goes on "
                        f"alerting, its latest {JsonlSink.HELD_ALERTS} alerts held in memory and written with the "
                        f"next alert the disk takes, or tried again every {JsonlSink.RETRY_SECONDS:g} s"]
        assert frames_in(log) == [0, 1]
    sink.on_event(alert(5))  # room again
    assert said[1:] == [f"note: the alert log {log} is written again, the alerts held meanwhile with it"]
    sink.on_event(alert(6))
    sink.close()
    assert len(said) == 2 and frames_in(log) == list(range(7))


def test_held_alerts_are_tried_again_by_the_clock_between_alerts(tmp_path):
    """An event long over: no next alert may come for hours, and the held ones were in memory alone meanwhile."""
    log, said = tmp_path / "alerts.jsonl", []
    sink = sink_saying(log, said)
    sink.RETRY_SECONDS = 3600.0
    with file_size_limit(NO_ROOM):
        sink.on_event(alert(0))
        sink.on_event(alert(1))
    sink.on_frame(0, None, 1.0, {"q1": 0.1}, [])  # not yet its time
    assert log.read_text() == "" and len(said) == 1
    sink.RETRY_SECONDS = 0.0
    sink.on_frame(0, None, 1.5, {"q1": 0.1}, [])
    assert frames_in(log) == [0, 1] and said[1].startswith("note: the alert log ")
    sink.close()


def test_an_alert_log_still_refused_when_the_stream_ends_is_the_error_naming_the_alerts_it_lost(tmp_path):
    log = tmp_path / "alerts.jsonl"
    sink = sink_saying(log, [])
    with file_size_limit(ROOM_FOR_TWO):
        for frame in range(5):
            sink.on_event(alert(frame))
        with pytest.raises(OSError) as refused:
            sink.close()
    assert refused.value.filename == str(log)  # the command line's one-line error names it
    assert refused.value.strerror == "File too large; 3 of the 3 alerts it refused meanwhile are not in it"
    assert frames_in(log) == [0, 1]


def test_a_disk_that_refuses_for_long_lets_the_oldest_held_alerts_go_and_counts_them(tmp_path):
    """A disk full for days held every alert in memory until the kernel killed the service."""
    log, said = tmp_path / "alerts.jsonl", []
    sink = sink_saying(log, said)
    sink.HELD_ALERTS = 3
    with file_size_limit(NO_ROOM):
        for frame in range(10):
            sink.on_event(alert(frame))
    sink.on_event(alert(10))
    sink.close()
    assert frames_in(log) == [8, 9, 10]  # the latest held, then the one the disk took
    assert said[1] == f"note: the alert log {log} is written again, the alerts held meanwhile with it (8 older ones " \
                      "were let go)"


def test_a_live_run_whose_alert_log_the_disk_refuses_goes_on_and_ends_with_the_error(exported, endless_stream,
                                                                                      tmp_path):
    """As a service on a full disk: the camera is watched on, the refusal said once, until the run is stopped."""
    _, bundle = exported
    log = tmp_path / "alerts.jsonl"
    command = ["bash", "-c", f'ulimit -f 0 && exec "{sys.executable}" -m sdqes_edge.cli "$@"', "limited", "run",
               str(bundle), "--source", endless_stream, "--query", QUERY, "--threshold", "0.01", "--events", str(log)]
    service = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, printed = time.monotonic() + 60, ""
    while "(query q1: " not in printed and time.monotonic() < deadline:  # the alert printed: refused by then
        if select.select([service.stdout], [], [], 1.0)[0]:
            printed += service.stdout.readline()
    assert "(query q1: " in printed
    time.sleep(2)  # frames stepped past the refusal
    assert service.poll() is None  # still watching
    assert seconds_to_stop(service) < 30
    err = service.stderr.read()
    assert service.returncode == 1 and "Traceback" not in err, err
    assert err.count(f"sdqes-edge: warning: cannot append alerts to the alert log {log}") == 1, err
    assert err.strip().splitlines()[-1] == (
        f"sdqes-edge: error: a file grew past the largest its file system or this process allows writing {log} (File "
        "too large; 1 of the 1 alerts it refused meanwhile are not in it: FAT32 holds 4 GiB a file, and `ulimit -f` "
        "may set a limit); write to a disk whose file system holds larger files (ext4, exFAT), or raise the limit, "
        "and run again")
