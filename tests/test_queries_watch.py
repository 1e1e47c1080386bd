"""`run --watch-queries`: a service's queries change as its --queries-file does, while the stream runs: lines
added are asked, lines removed stop, a new message keeps its query's alert state, the command line's queries are
never touched, and a file that cannot be used changes nothing."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_fixtures import QUERY

from sdqes_edge.cli.queries_file import QueryLine, read_queries_file
from sdqes_edge.cli.queries_watch import Asked, LineAsker, QueriesFileWatcher, file_signature, keyed
from sdqes_edge.runtime.detector import StreamingDetector

KETTLE, DOOR, FRIDGE = "when the kettle boils", "when someone opens the door", "when I open the fridge"


def queries_csv(path: Path, *rows: tuple[str, str]) -> Path:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([("query", "response"), *rows])
    return path


@pytest.fixture
def watched(exported, tmp_path):
    """A detector asking the file's queries, as `run --queries-file` starts, and the file's watcher (looked at by
    calling ``check``, as its thread does every second)."""
    _, bundle = exported
    path = queries_csv(tmp_path / "queries.csv", (KETTLE, "Tea!"), (DOOR, "Someone is here."))
    version = file_signature(str(path))
    detector = StreamingDetector(bundle)
    fixed = detector.add_query(QUERY, "Sanitize your hands.")  # as --query gives it
    ask = LineAsker(detector)
    file_queries = {key: Asked(line, ask(line)) for key, line in keyed(read_queries_file(str(path))).items()}
    watcher = QueriesFileWatcher(detector, str(path), file_queries, set(keyed([QueryLine(QUERY)])), ask, version)
    yield detector, watcher, path, fixed
    detector.close()


def asked(detector: StreamingDetector) -> dict[str, str]:
    return {query.text: query.message for query in detector.queries.queries.values()}


def test_a_change_is_applied_once_it_has_held_for_one_look(watched):
    """An editor or a script half way through writing the file is not read: a look that finds the file changed
    waits for the next one to find it the same."""
    detector, watcher, path, _ = watched
    queries_csv(path, (KETTLE, "Tea!"))
    watcher.check()
    assert DOOR in asked(detector)
    watcher.check()
    assert DOOR not in asked(detector)


def test_a_change_made_while_the_model_loads_is_applied_at_the_first_looks(watched):
    """The run reads the file, then loads and warms the model for seconds before the watcher starts: a change in
    between was taken for the version already read, and never applied."""
    detector, as_read, path, _ = watched
    started_with = file_signature(str(path))  # as the run reads the file
    queries_csv(path, (KETTLE, "Tea!"), (DOOR, "Someone is here."), (FRIDGE, "Close the fridge."))
    watcher = QueriesFileWatcher(detector, str(path), as_read.watched, as_read.fixed, as_read.ask, started_with)
    watcher.check(), watcher.check()  # as the watcher begins, once the model is loaded
    assert FRIDGE in asked(detector)


def test_lines_added_are_asked_lines_removed_stop_and_the_rest_keep_their_ids(watched, capsys):
    detector, watcher, path, fixed = watched
    kettle = next(q.id for q in detector.queries.queries.values() if q.text == KETTLE)
    queries_csv(path, (KETTLE, "Tea!"), (FRIDGE, "Close the fridge."))
    watcher.check(), watcher.check()
    assert asked(detector) == {QUERY: "Sanitize your hands.", KETTLE: "Tea!", FRIDGE: "Close the fridge."}
    assert kettle in detector.queries.ids and fixed.id in detector.queries.ids
    assert capsys.readouterr().err.splitlines() == [
        f"sdqes-edge: --queries-file {path} changed: added {FRIDGE!r}; removed {DOOR!r}; 3 queries streaming"]


def test_a_new_message_keeps_the_query_and_its_alert_state_so_an_event_going_on_does_not_alert_again(watched):
    detector, watcher, path, _ = watched
    kettle = next(q for q in detector.queries.queries.values() if q.text == KETTLE)
    alert_state = detector.streams[0].alerts[kettle.id]
    alert_state.update(0.99, 0.0)  # its event is going on
    queries_csv(path, (KETTLE, "The tea is ready."), (DOOR, "Someone is here."))
    watcher.check(), watcher.check()
    assert asked(detector)[KETTLE] == "The tea is ready." and kettle.id in detector.queries.ids
    assert detector.streams[0].alerts[kettle.id] is alert_state and alert_state.active


def test_the_command_lines_queries_are_never_touched_by_the_file(watched):
    """A line of the file asking a --query again is not added twice (each event would alert twice), and a file
    without it does not remove it."""
    detector, watcher, path, fixed = watched
    queries_csv(path, (QUERY.upper(), "from the file"), (KETTLE, "Tea!"))
    watcher.check(), watcher.check()
    assert asked(detector) == {QUERY: "Sanitize your hands.", KETTLE: "Tea!"}
    queries_csv(path, (FRIDGE, "Close the fridge."))
    watcher.check(), watcher.check()
    assert asked(detector) == {QUERY: "Sanitize your hands.", FRIDGE: "Close the fridge."}


@pytest.mark.parametrize("damage, said", [
    (lambda p: p.write_text("text,reply\nwhen the kettle boils,Tea!\n"), "needs a 'query' column"),
    (lambda p: p.write_text("query,response\n"), "holds no queries"),
    (lambda p: p.write_bytes(b"query\n\xff\xfe kettle\n"), "is not UTF-8 text"),
    (lambda p: p.unlink(), "is gone (or cannot be read)"),
])
def test_a_file_that_cannot_be_used_changes_nothing_and_says_why(watched, capsys, damage, said):
    """A service must not lose its queries to a typo in the file: they are kept, with one warning line."""
    detector, watcher, path, _ = watched
    before = asked(detector)
    damage(path)
    watcher.check(), watcher.check(), watcher.check()
    assert asked(detector) == before
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sdqes-edge: warning: ") and said in err[0]
    assert "3 queries streaming kept" in err[0]
    queries_csv(path, (FRIDGE, "Close the fridge."))  # mended: read as any change
    watcher.check(), watcher.check()
    assert asked(detector) == {QUERY: "Sanitize your hands.", FRIDGE: "Close the fridge."}


def test_a_query_the_bundle_refuses_is_named_and_the_others_are_asked(watched, capsys):
    detector, watcher, path, _ = watched
    queries_csv(path, (" ".join(["kettle"] * 100), "too long"), (FRIDGE, "Close the fridge."))
    watcher.check(), watcher.check()
    assert asked(detector) == {QUERY: "Sanitize your hands.", FRIDGE: "Close the fridge."}
    warning = capsys.readouterr().err.splitlines()[0]
    assert warning.startswith("sdqes-edge: warning: --queries-file's query 'kettle kettle") and "tokens" in warning


def test_run_asks_the_lines_added_to_the_file_while_a_camera_streams(exported, endless_stream, tmp_path):
    """The whole command: its thread reads the file again within two seconds of a change, the new query alerts
    into the same alert log, and Ctrl-C stops it as ever."""
    _, bundle = exported
    queries = queries_csv(tmp_path / "queries.csv", (KETTLE, "Tea!"))
    events, err = tmp_path / "alerts.jsonl", tmp_path / "err.txt"
    command = ["run", str(bundle), "--source", endless_stream, "--queries-file", str(queries), "--watch-queries",
               "--threshold", "0.001", "--events", str(events)]  # every query alerts on its first frame
    with open(err, "w") as stderr:
        service = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", *command], stderr=stderr,
                                   stdout=subprocess.DEVNULL)
        try:
            assert wait_for(lambda: "Ctrl-C to stop" in err.read_text(), service), err.read_text()
            queries_csv(queries, (KETTLE, "Tea!"), (FRIDGE, "Close the fridge."))
            assert wait_for(lambda: "Close the fridge." in events.read_text(), service), err.read_text()
            service.send_signal(signal.SIGINT)
            assert service.wait(timeout=30) == 128 + signal.SIGINT
        finally:
            service.kill()
    assert f"changed: added {FRIDGE!r}; 2 queries streaming" in err.read_text()
    assert [json.loads(line)["message"] for line in events.read_text().splitlines()] == ["Tea!", "Close the fridge."]


def wait_for(condition, process: subprocess.Popen, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if condition():
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    return False


def test_watch_queries_without_a_queries_file_is_refused_in_one_line(exported):
    _, bundle = exported
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", "0", "--query",
                           KETTLE, "--watch-queries"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "sdqes-edge: error: --watch-queries reads the --queries-file again when it changes; give --queries-file FILE"]


def test_many_lines_added_are_encoded_a_batch_to_a_run_of_the_text_graph_and_one_too_long_is_said_alone(watched):
    """A service's file given a dataset's queries at once ran the text graph once a line, in its watcher thread,
    before any of them was asked."""
    from sdqes_edge.runtime.queries import TEXT_BATCH

    detector, watcher, path, _ = watched
    encoder, runs = detector.queries.encoder, []
    session = encoder.session

    class CountedSession:
        def run(self, outputs, feeds):
            runs.append(len(next(iter(feeds.values()))))
            return session.run(outputs, feeds)

    encoder.session = CountedSession()  # the same graph, its runs counted
    texts = [f"when the robot reaches waypoint {n}" for n in range(TEXT_BATCH + 6)]
    queries_csv(path, (KETTLE, "Tea!"), *[(text, "Here.") for text in texts], ("go " * 80, "Too long."))
    watcher.check()
    watcher.check()
    assert runs == [TEXT_BATCH, 6]  # the line too long is left out of its batch, and refused as it is asked
    assert set(texts) <= set(asked(detector)) and "go " * 80 not in asked(detector)
