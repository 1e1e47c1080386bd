"""`--queries-file`: the queries and their alert messages a bundle is exported with (`export`) or a stream is
watched for (`run`), read from .txt (one query a line), .json or .csv, and every file that is not one of those
refused in one line; the command to run next uses them."""

from __future__ import annotations

import json

import pytest

from sdqes_edge.cli.queries_file import QueryLine as Line
from sdqes_edge.cli.queries_file import read_queries_file
from sdqes_edge.errors import UserError

COOK = "When I start cooking, remind me to wash my hands."


@pytest.mark.parametrize("name, content, queries", [
    ("q.txt", f"{COOK}\n\n  when I open the fridge  \n",
     [Line(COOK, COOK), Line("when I open the fridge", "when I open the fridge")]),
    ("q.json", f'["{COOK}", {{"text": "when I sleep", "response": "Good night."}}, {{"text": "when I run"}}, '
               '{"text": "when I cook", "label": " cook_food ", "threshold": 0.7}]',
     [Line(COOK, COOK), Line("when I sleep", "Good night."), Line("when I run", "when I run"),
      Line("when I cook", "when I cook", "cook_food", 0.7)]),
    ("q.csv", f'query,response\n"{COOK}",Wash your hands!\nwhen I run\n',
     [Line(COOK, "Wash your hands!"), Line("when I run", "when I run")]),
    # The EgoSDQES annotations' columns: the label picks the bundle's threshold for it, where it has one; a
    # threshold of the line's own comes first.
    ("q.csv", f'split,query,response,label,threshold\nval,"{COOK}",Wash your hands!,cook_food,\n'
              'val,when I run,Go!,, 0.7 \n',
     [Line(COOK, "Wash your hands!", "cook_food"), Line("when I run", "Go!", None, 0.7)]),
    # Headers as typed in a spreadsheet: " response" (after "query, ") matched no column, and every message was lost.
    ("q.csv", "Query, Response, Label\nwhen I run, Go!, run\n", [Line("when I run", "Go!", "run")]),
])
def test_queries_and_their_alert_messages_are_read_from_txt_json_and_csv(name, content, queries, tmp_path):
    (tmp_path / name).write_text(content, encoding="utf-8")
    assert read_queries_file(str(tmp_path / name)) == queries
    # As Notepad and Excel save them, a byte-order mark first: it was refused (.json, .csv: no 'query' column) or
    # became part of the first query's text, which then matched no annotation.
    (tmp_path / name).write_text(content, encoding="utf-8-sig")
    assert read_queries_file(str(tmp_path / name)) == queries
    # Notepad's "Unicode" and Excel's "Unicode Text" are UTF-16 with its byte-order mark, which names the encoding:
    # they were refused as "not UTF-8 text". UTF-32, which the mark names as surely, too.
    for encoding in ("utf-16-le", "utf-16-be", "utf-32-le"):
        (tmp_path / name).write_bytes(("\ufeff" + content).encode(encoding))
        assert read_queries_file(str(tmp_path / name)) == queries, encoding
    # Named in capitals, as Windows tools may: a .CSV was read as lines, its header "query,response" the first query.
    (tmp_path / name.upper()).write_text(content, encoding="utf-8")
    assert read_queries_file(str(tmp_path / name.upper())) == queries


@pytest.mark.parametrize("name, content, says", [
    ("q.json", '{"text": "when I cook"}', "holds a JSON dict; give a JSON list"),
    ("q.json", '[{"text": 5}]', "each entry must be a string or"),
    ("q.json", '[{"text": "when I cook", "response": 3}]', "each entry must be a string or"),
    ("q.json", '[{"text": "when I cook", "label": 3}]', "each entry must be a string or"),
    ("q.json", '[{"text": "when I cook", "threshold": 1.5}]', "threshold 1.5 of 'when I cook' is not a probability"),
    ("q.json", '[{"text": "when I cook", "threshold": true}]', "threshold True of 'when I cook' is not a probab"),
    ("q.csv", "query,threshold\nwhen I cook,high\n", "threshold 'high' of 'when I cook' is not a probability"),
    ("q.csv", "query,threshold\nwhen I cook,nan\n", "threshold 'nan' of 'when I cook' is not a probability"),
    ("q.csv", "query,threshold\nwhen I cook,0\n", r"threshold '0' of 'when I cook' is not a probability sigmoid\(cos"),
    ("q.csv", "query,threshold\nwhen I cook,0.9\n", r"threshold '0.9' of 'when I cook' is never reached: p = "
     r"sigmoid\(cos\) is at most 0.7311"),  # a probability, but one no score reaches: the query never alerted
    ("q.json", '[{"response": "Wash!"}]', "each entry must be a string or"),
    ("q.json", '[{"text": "when I cook", "message": "Wash!"}]', r"q.json: the entry .* has 'message', which is no "
                                                                r"query's key: give text, response, label, threshold"),
    ("q.json", "[", "is not valid JSON"),
    ("q.txt", "\n  \n", "holds no queries"),
    ("q.csv", "query,response\n", "holds no queries"),
    ("q.csv", "query,response\nwhen I cook," + "x" * 200_000 + "\n", r"q.csv line 2 is not CSV this reads \(field "
     r"larger than field limit \(131072\)\); fix that line"),  # was the csv module's traceback
    ("q.csv", "text,message\nwhen I cook,Wash!\n", "needs a 'query' column"),
    ("q.csv", "query;response\nwhen I cook;Wash!\n", "column .*separated by ';', not by commas: save it as comma"),
    ("q.txt", "été: when I cook".encode("latin-1"), r"is not UTF-8 text \(.*\); save it as UTF-8$"),
    ("q.csv", "query,Message\nwhen I cook,Wash!\n", r"q.csv has a 'message' column, but the alert message's column is "
                                                    r"'response' .*: rename it, or every alert would show its query's"),
    # A spreadsheet saved as text (Excel's "Unicode Text"): its header was a query, each row one event of both texts.
    ("q.txt", "\ufeffquery\tresponse\nwhen I cook\tWash!\n".encode("utf-16-le"),
     r"q.txt line 1 holds a tab, as a spreadsheet saved as text separates its columns; save it as CSV"),
    # A byte-order mark names UTF-16, and the text after it is cut mid-character.
    ("q.txt", "\ufeffwhen I cook".encode("utf-16-le") + b"\x00", r"is not UTF-16 text \(.*\); save it as UTF-8$"),
])
def test_a_queries_file_that_is_not_a_list_of_queries_is_refused_in_one_line(name, content, says, tmp_path):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=says) as refusal:
        read_queries_file(str(path))
    assert "\n" not in str(refusal.value)


def test_a_missing_queries_file_is_named():
    with pytest.raises(UserError, match="queries file /no/such.txt does not exist"):
        read_queries_file("/no/such.txt")


def test_a_bundle_exported_with_its_queries_is_next_run_on_them_not_on_a_query_to_type(tmp_path, capsys):
    """The hint said `run B --source VIDEO --query TEXT`, and a --query replaces every query the bundle holds."""
    from sdqes_edge.cli import run

    (tmp_path / "q.txt").write_text(f"{COOK}\n", encoding="utf-8")
    assert run(["export", "--preset", "tiny", "--queries-file", str(tmp_path / "q.txt"), "--verify-frames", "16",
                "--drift-frames", "16", "--quiet", "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"then: sdqes-edge run {tmp_path / 'b'} --source VIDEO")


def test_run_watches_a_queries_files_queries_with_their_messages_beside_the_command_lines(exported, tmp_path, capsys):
    """`run` had only --query (and --message by position): a hundred queries with their alert messages were a
    command line of two hundred options."""
    from runtime_fixtures import FPS, write_video

    from sdqes_edge.cli import run
    from sdqes_edge.sample import sample_frames

    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(10, 48, 64), fps=FPS)
    queries = tmp_path / "queries.csv"
    queries.write_text(f'query,response\n"{COOK}",Wash your hands!\nwhen I run\nwhen I open the fridge,Close it\n')
    events = tmp_path / "alerts.jsonl"
    assert run(["run", str(bundle), "--source", str(video), "--query", "when I open the fridge", "--message",
                "Fridge!", "--queries-file", str(queries), "--threshold", "0.01", "--events", str(events),
                "--quiet"]) == 0
    alerted = sorted((e["query"], e["message"]) for e in map(json.loads, events.read_text().splitlines()))
    # Each query once: the fridge, asked on the command line and in the file, keeps the command line's message.
    assert alerted == sorted([(COOK, "Wash your hands!"), ("when I run", "when I run"),
                              ("when I open the fridge", "Fridge!")])
    capsys.readouterr()
    assert run(["run", str(bundle), "--source", str(video), "--queries-file", str(tmp_path / "none.txt")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"sdqes-edge: error: queries file {tmp_path / 'none.txt'} does not exist; give a .txt, .json or .csv file "
        "of queries"]


def test_a_query_repeated_with_another_alert_message_is_watched_once_and_the_warning_says_which_message_is_kept(
        tmp_path, capsys):
    """Two reminders for one event cannot both be watched: the second was dropped with "it is watched once"."""
    from sdqes_edge.cli.common import unique_queries

    path = tmp_path / "q.csv"
    path.write_text("query,response\nwhen I start cooking,Wash your hands!\nWhen I start cooking,Put on gloves!\n")
    assert unique_queries(read_queries_file(str(path))) == [Line("when I start cooking", "Wash your hands!")]
    assert capsys.readouterr().err.splitlines() == [
        "sdqes-edge: warning: the query 'When I start cooking' is given more than once (case and spacing aside); it "
        "is watched once; its first line's alert message 'Wash your hands!' (not 'Put on gloves!') is kept"]
    unique_queries([Line("a", "A"), Line("a", "B"), Line("b", "B"), Line("b", "B", None, None)])
    assert capsys.readouterr().err.rstrip().endswith(
        "each is watched once, as its first line says (1 with another alert message, label or threshold there)")
