"""The JSONL alert log of a stream that runs for weeks is rotated under it (logrotate, or a script that moves it
away): the next alert goes to a new file at the path, as Python's WatchedFileHandler writes a rotated log, not into
the moved file, where nobody reads it any more; a log emptied in place (logrotate's copytruncate) goes on from its
new end, whole lines only."""

from __future__ import annotations

import json
import shutil

import pytest
from runtime_fixtures import QUERY
from test_full_disk import file_size_limit

from sdqes_edge.errors import SetupWarning
from sdqes_edge.runtime import AlertEvent, JsonlSink


def alert(frame: int) -> AlertEvent:
    return AlertEvent("q1", QUERY, "Sanitize your hands!", "kitchen", frame / 2.0, frame, 0.9, 0.2, 3.0)


def frames_in(path) -> list[int]:
    return [json.loads(line)["frame_index"] for line in path.read_text().splitlines()]


def test_a_log_moved_away_is_followed_by_a_new_one_at_its_path(tmp_path):
    log = tmp_path / "alerts.jsonl"
    sink = JsonlSink(log)
    sink.on_event(alert(1))
    log.rename(tmp_path / "alerts.jsonl.1")  # logrotate's default: move, then (create) a new empty file
    log.touch()
    sink.on_event(alert(2))
    (tmp_path / "alerts.jsonl.1").rename(tmp_path / "alerts.jsonl.2")  # moved again, no new file made this time
    sink.on_event(alert(3))
    sink.close()
    assert frames_in(tmp_path / "alerts.jsonl.2") == [1]
    assert frames_in(log) == [2, 3]


def test_a_log_emptied_in_place_goes_on_from_its_new_end(tmp_path):
    log = tmp_path / "alerts.jsonl"
    sink = JsonlSink(log)
    for frame in range(3):
        sink.on_event(alert(frame))
    shutil.copyfile(log, tmp_path / "alerts.jsonl.1")  # copytruncate
    log.write_bytes(b"")
    sink.on_event(alert(3))
    sink.close()
    assert frames_in(tmp_path / "alerts.jsonl.1") == [0, 1, 2]
    assert frames_in(log) == [3]  # no hole of zero bytes where the old lines were


def test_a_line_the_disk_refuses_after_the_log_was_emptied_is_taken_back_to_its_new_end(tmp_path):
    """The line to take back ends where the emptied file does, not where the file ended before: cutting the file
    back to its old length would have made a hole of zero bytes there (or failed, past the disk's limit)."""
    log = tmp_path / "alerts.jsonl"
    sink = JsonlSink(log)
    for frame in range(3):
        sink.on_event(alert(frame))
    log.write_bytes(b"")  # emptied in place, as the disk is about to fill
    sink.log = lambda message: None  # said while the stream goes on (tests/test_alert_log_refused.py)
    with file_size_limit(len(json.dumps(alert(3).to_dict())) // 2), pytest.raises(OSError) as refused:
        sink.on_event(alert(3))
        sink.close()  # still refused as the stream ends
    assert refused.value.filename == str(log)
    assert log.read_bytes() == b""


def test_a_log_that_cannot_be_made_again_keeps_its_alerts_in_the_moved_file_and_says_so_once(tmp_path):
    """Rotated by another user's script into a folder it then made at the path (or one we may not write): the
    alerts were not lost, nor the stream stopped; they go on into the moved file, with one warning, and a new
    file is made at the path as soon as it can be."""
    from sdqes_edge.errors import SetupWarning

    log = tmp_path / "alerts.jsonl"
    sink = JsonlSink(log)
    sink.on_event(alert(1))
    log.rename(tmp_path / "alerts.jsonl.1")
    log.mkdir()  # the path cannot be a file for now
    with pytest.warns(SetupWarning, match=r"alert log .*alerts.jsonl was moved away and cannot be made again") as seen:
        sink.on_event(alert(2))
        sink.on_event(alert(3))
    assert len(seen) == 1 and "alerts go on into the moved file" in str(seen[0].message)
    log.rmdir()
    sink.on_event(alert(4))
    sink.close()
    assert frames_in(tmp_path / "alerts.jsonl.1") == [1, 2, 3]
    assert frames_in(log) == [4]


def test_a_log_whose_last_line_was_cut_keeps_it_and_the_next_alert_starts_a_line_of_its_own(tmp_path):
    """A power cut (or a kill) while a line was written leaves part of it; the next alert appended to it was
    unreadable too. That cut line is kept as it was, and said once."""
    log = tmp_path / "alerts.jsonl"
    sink = JsonlSink(log)
    sink.on_event(alert(1))
    sink.close()
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"query_id": "q1", "query": "wh')  # the cut line
    with pytest.warns(SetupWarning, match="ends in a cut line .* it is kept, and the next alert starts a line"):
        sink = JsonlSink(log)
    sink.on_event(alert(2))
    sink.on_event(alert(3))
    sink.close()
    lines = log.read_bytes().splitlines()
    assert log.read_bytes().startswith(whole + b'{"query_id": "q1", "query": "wh\n')
    assert [json.loads(line)["frame_index"] for line in (lines[0], *lines[2:])] == [1, 2, 3]


def test_a_log_that_ends_a_line_or_is_empty_is_appended_to_without_a_word(tmp_path, recwarn):
    log = tmp_path / "alerts.jsonl"
    for frame in (1, 2):  # a new log, then the same log again
        sink = JsonlSink(log)
        sink.on_event(alert(frame))
        sink.close()
    assert frames_in(log) == [1, 2] and not recwarn.list
