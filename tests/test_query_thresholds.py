"""Each query's alert threshold: its own (a `threshold` column in --queries-file, "threshold" in a JSON one), else
--threshold, else the bundle's for its label, else the bundle's default. `eval --calibrate --per-label
--write-threshold BUNDLE` records one threshold per EgoSDQES label, and a query asked with its label (a `label`
column, "label" in JSON, `add_query(label=...)`) alerts at it, in `run`, in the detector and in `score`'s report.
They were written into the bundle and then used by nothing: every query alerted at the default, without a word."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from runtime_fixtures import QUERY, write_video
from test_corpus import cli
from test_queries_watch import queries_csv

from sdqes_edge.annotations import load_annotations
from sdqes_edge.cli import run
from sdqes_edge.cli.queries_file import read_queries_file
from sdqes_edge.cli.queries_watch import Asked, LineAsker, QueriesFileWatcher, file_signature, keyed
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.evaluation import evaluate_with, match_traces
from sdqes_edge.export import ExportOptions, Query
from sdqes_edge.export.options import check_options
from sdqes_edge.runtime.bundle import BundleError, load_bundle, write_thresholds
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.sample import sample_frames
from sdqes_edge.synthetic import write_dataset
from sdqes_edge.traces import load_scores

KETTLE, DOOR, SIT = "Tell me when the kettle boils.", "When the door opens, tell me.", "When I sit down."
# Every query alerts on its first frame at DEFAULT (an untrained model scores about 0.5), none ever at NEVER (a cosine
# past 0.9946): each inside the scores p = sigmoid(cos) can take, [0.2689, 0.7311], where a threshold is a query's.
DEFAULT, NEVER = 0.3, 0.73


@pytest.fixture(scope="module")
def calibrated(exported) -> Path:
    """The module's bundle with a default threshold every frame crosses and one label's threshold none does."""
    _, bundle = exported
    write_thresholds(bundle, DEFAULT, {"boil_water": NEVER, "open_door": 0.25})
    return bundle


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> Path:
    return write_video(tmp_path_factory.mktemp("labels") / "clip.avi", sample_frames(20, 96, 128))


def alerted(events: Path) -> list[str]:
    return [json.loads(line)["query"] for line in events.read_text().splitlines()]


def alerted_under(events: Path) -> list[tuple[float, str | None]]:
    """Each alert's threshold and label, as the alert log records them."""
    return [(alert["threshold"], alert["label"]) for alert in map(json.loads, events.read_text().splitlines())]


def test_a_query_takes_its_labels_threshold_else_the_default_and_a_given_threshold_overrides_both(calibrated):
    assert load_bundle(calibrated).label_thresholds == {"boil_water": NEVER, "open_door": 0.25}
    detector = StreamingDetector(calibrated)
    kettle = detector.add_query(KETTLE, label="boil_water")
    door = detector.add_query(DOOR, label="cook_food")  # a label calibrated for no query: the default
    plain = detector.add_query(QUERY)
    given = detector.add_query("When I sit down.", threshold=0.5, label="boil_water")
    assert detector.thresholds() == {kettle.id: NEVER, door.id: DEFAULT, plain.id: DEFAULT, given.id: 0.5}
    assert kettle.label == "boil_water" and plain.label is None
    detector.close()


def test_the_recorded_hysteresis_follows_the_labels_threshold(exported, tmp_path):
    """The recorded policy is a margin below the threshold, so a label's threshold keeps it."""
    bundle = shutil.copytree(exported[1], tmp_path / "bundle")
    write_thresholds(bundle, 0.5, {"open_door": 0.25}, policy={"exit_margin": 0.1, "cooldown_s": 20.0})
    detector = StreamingDetector(bundle)
    door = detector.add_query(DOOR, label="open_door")
    assert door.policy.threshold == 0.25 and door.policy.exit_threshold == pytest.approx(0.15)
    assert door.policy.cooldown_s == 20.0
    detector.close()


@pytest.mark.parametrize("per_label, says", [
    ({"open_door": 1.5}, "1.5"), ({"open_door": 0.0}, "0.0"), ({"open_door": "high"}, "'high'")])
def test_a_label_threshold_that_is_no_probability_is_refused_as_the_bundle_loads(exported, tmp_path, per_label,
                                                                                  says):
    bundle = shutil.copytree(exported[1], tmp_path / "bundle")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["thresholds"]["per_label"] = per_label
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=says) as refusal:
        load_bundle(bundle)
    assert "\n" not in str(refusal.value)


def test_run_alerts_each_line_of_the_queries_file_at_its_own_threshold_else_its_labels(calibrated, video, tmp_path,
                                                                                      capsys):
    queries = tmp_path / "queries.csv"
    with open(queries, "w", newline="") as f:  # the EgoSDQES annotations' columns, as a user may pass them
        csv.writer(f).writerows([("query", "response", "label", "threshold"), (KETTLE, "Tea!", "boil_water", ""),
                                 (DOOR, "Someone is here.", "", ""), (QUERY, "Sanitize!", "wipe_table", ""),
                                 (SIT, "Sit up straight.", "boil_water", NEVER)])  # its own first
    events = tmp_path / "alerts.jsonl"
    assert run(["run", str(calibrated), "--source", str(video), "--queries-file", str(queries), "--events",
                str(events)]) == 0
    assert alerted(events) == [DOOR, QUERY]  # the kettle's label asks for more than any frame gives
    assert alerted_under(events) == [(DEFAULT, None), (DEFAULT, "wipe_table")]
    header = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("streaming"))
    assert (f"threshold {DEFAULT:.4f}; 2 at a threshold of their own; 1 with a label the bundle has no threshold "
            "for (ort") in header
    # --threshold is every query's but those with their own: the label's is not taken
    events = tmp_path / "given.jsonl"
    assert run(["run", str(calibrated), "--source", str(video), "--queries-file", str(queries), "--events",
                str(events), "--threshold", "0.002"]) == 0
    assert alerted(events) == [KETTLE, DOOR, QUERY]
    assert alerted_under(events) == [(0.002, "boil_water"), (0.002, None), (0.002, "wipe_table")]


def test_run_says_when_the_bundles_label_thresholds_go_unused_and_inspect_counts_them(calibrated, video, capsys):
    assert run(["run", str(calibrated), "--source", str(video), "--query", KETTLE, "--quiet"]) == 0
    assert ("the bundle's thresholds for 2 query labels are unused: give each query its label, a 'label' column in "
            "--queries-file") in capsys.readouterr().err
    assert run(["inspect", str(calibrated)]) == 0
    assert f"default threshold {DEFAULT:.4f} (2 query labels with their own)" in capsys.readouterr().out


def test_an_exported_bundles_own_queries_keep_their_labels_and_thresholds(tmp_path, video, capsys):
    """`export --queries-file` with label and threshold columns: the bundle's queries carry them, and a run without
    queries of its own asks with them; one with its own says that they replace the bundle's."""
    from conftest import random_model

    from sdqes_edge.export import export_bundle

    bundle = tmp_path / "bundle"
    queries = (Query(KETTLE, "Tea!", "boil_water"), Query(DOOR, "Someone is here."), Query(SIT, "Sit up.", None, NEVER))
    export_bundle(random_model("qrnn"), bundle, ExportOptions(fps=5.0, queries=queries, show_progress=False),
                  log=lambda m: None)
    assert [(q.get("label"), q.get("threshold")) for q in load_bundle(bundle).queries()[0]] == [
        ("boil_water", None), (None, None), (None, NEVER)]
    write_thresholds(bundle, DEFAULT, {"boil_water": NEVER})
    events = tmp_path / "alerts.jsonl"
    assert run(["run", str(bundle), "--source", str(video), "--events", str(events), "--quiet"]) == 0
    assert alerted(events) == [DOOR]
    assert "not asked" not in capsys.readouterr().err
    events = tmp_path / "replaced.jsonl"
    assert run(["run", str(bundle), "--source", str(video), "--events", str(events), "--query", QUERY, "--quiet"]) == 0
    assert alerted(events) == [QUERY]
    assert (f"sdqes-edge: note: the bundle's own 3 queries ({KETTLE!r}, ...) are not asked: --query and "
            "--queries-file replace them; give them there too to ask them as well") in capsys.readouterr().err
    # Those asked again in the same words are asked: the note names only the ones left out.
    assert run(["run", str(bundle), "--source", str(video), "--query", KETTLE, "--query", DOOR, "--quiet"]) == 0
    assert (f"sdqes-edge: note: the bundle's own 1 query ({SIT!r}) is not asked: --query and "
            "--queries-file replace them; give them there too to ask them as well") in capsys.readouterr().err


@pytest.mark.parametrize("new_row, said, threshold", [
    ((KETTLE, "Tea!", "boil_water", ""), "a new label for", NEVER),
    ((KETTLE, "Tea!", "", "0.7"), "a new threshold for", 0.7),
])
def test_a_new_label_or_threshold_in_the_watched_file_keeps_the_query_and_its_alert_state_under_it(
        calibrated, tmp_path, capsys, new_row, said, threshold):
    """The query goes on under its new policy: an event going on does not alert again (its state was begun anew,
    and a threshold lowered mid-event alerted twice for it), and its alerts so far still count."""
    path = queries_csv(tmp_path / "queries.csv", (KETTLE, "Tea!"))
    detector = StreamingDetector(calibrated)
    ask = LineAsker(detector)
    watched = {key: Asked(line, ask(line)) for key, line in keyed(read_queries_file(str(path))).items()}
    watcher = QueriesFileWatcher(detector, str(path), watched, set(), ask, file_signature(str(path)))
    (before,) = detector.queries.queries.values()
    alert_state = detector.streams[0].alerts[before.id]
    assert alert_state.update(0.99, 0.0)  # its event is going on, alerted
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([("query", "response", "label", "threshold"), new_row])
    watcher.check(), watcher.check()
    (query,) = detector.queries.queries.values()
    assert query.id == before.id and query.policy.threshold == threshold and query.message == "Tea!"
    assert detector.thresholds() == {query.id: threshold}
    assert detector.streams[0].alerts[query.id] is alert_state and alert_state.policy == query.policy
    assert alert_state.active and alert_state.alerts == 1 and not alert_state.update(0.999999999, 1.0)
    detector.close()
    assert capsys.readouterr().err.splitlines() == [
        f"sdqes-edge: --queries-file {path} changed: {said} {KETTLE!r}; 1 query streaming"]


def test_score_reports_at_each_labels_threshold_as_run_alerts(tmp_path):
    """The report of `score` (no --threshold) is eval's per-label evaluation at the bundle's thresholds; with
    --threshold it is one threshold for all, from the same traces."""
    corpus = tmp_path / "corpus"
    write_dataset(corpus, {"test": [0, 1]}, seconds=20.0, fps=2.0)
    annotations = load_annotations(str(corpus / "annotations.csv"))
    label = annotations[0].label
    bundle = shutil.copytree(DEMO_BUNDLE, tmp_path / "bundle")
    default = load_bundle(bundle).default_threshold
    write_thresholds(bundle, default, {label: NEVER})

    def score(*extra: str) -> dict:
        done = cli("score", str(bundle), "--annotations", str(corpus / "annotations.csv"), "--videos",
                   str(corpus / "videos"), "--out", str(tmp_path / "scored"), "--workers", "1", "--quiet", *extra)
        assert done.returncode == 0, done.stderr
        return json.loads((tmp_path / "scored" / "eval.json").read_text())

    report = score()
    (row_name,) = report["results"]
    own = sum(a.label == label for a in annotations)
    assert 0 < own < len(annotations) and f"threshold {default:.4f}, {own} queries at their label's" in row_name
    assert report["per_label"] == {label: NEVER}
    traces = [load_scores(p) for p in sorted((tmp_path / "scored" / "traces").glob("*.npz"))]
    matched = match_traces(annotations, traces)
    expected = evaluate_with(matched.traces, [a.label for a in matched.annotations], default, {label: NEVER})
    assert report["results"][row_name] == json.loads(json.dumps(expected.to_dict()))
    # --threshold: one threshold for every query, from the traces already scored
    (row_name,) = score("--threshold", f"{default}")["results"]
    assert "at their label's" not in row_name


def test_a_new_threshold_the_runs_policy_refuses_keeps_the_old_one_and_is_tried_at_the_next_change(
        calibrated, tmp_path, capsys):
    path = tmp_path / "queries.csv"

    def write(threshold: str) -> None:
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([("query", "response", "label", "threshold"),
                                     (KETTLE, "Tea!", "boil_water", threshold)])

    def edit(threshold: str) -> list[str]:
        write(threshold)
        watcher.check(), watcher.check()
        return capsys.readouterr().err.splitlines()

    write("")  # at its label's threshold, NEVER
    detector = StreamingDetector(calibrated)
    ask = LineAsker(detector, exit_threshold=0.5)  # run --exit-threshold 0.5
    watched = {key: Asked(line, ask(line)) for key, line in keyed(read_queries_file(str(path))).items()}
    watcher = QueriesFileWatcher(detector, str(path), watched, set(), ask, file_signature(str(path)))
    (kettle,) = detector.queries.queries.values()
    (said,) = edit("0.4")  # below the exit threshold
    assert said.startswith(f"sdqes-edge: warning: --queries-file's query {KETTLE!r} keeps its threshold {NEVER:g}: ")
    assert "exit threshold 0.5 must lie in [0, threshold 0.4]" in said
    assert detector.thresholds() == {kettle.id: NEVER}
    assert edit("0.7") == [f"sdqes-edge: --queries-file {path} changed: a new threshold for {KETTLE!r}; 1 query "
                            "streaming"]
    assert detector.thresholds() == {kettle.id: 0.7}
    detector.close()


@pytest.mark.parametrize("query, says", [
    (Query(KETTLE, "Tea!", None, 1.5), f"the threshold of the query {KETTLE!r} is a probability"),
    (Query(KETTLE, "Tea!", None, True), "not True"),
    (Query(KETTLE, "Tea!", 3), f"the label of the query {KETTLE!r} is text, not 3"),
    # Written as it was, and the bundle then refused by every runtime ("queries.json is not a list of ...").
    (Query(KETTLE, 5), f"the alert message (response) of the query {KETTLE!r} is text, not 5"),
    (Query(KETTLE, None), f"the alert message (response) of the query {KETTLE!r} is text, not None"),
])
def test_export_refuses_a_query_whose_message_label_or_threshold_the_bundle_could_not_hold(query, says):
    with pytest.raises(UserError, match=re.escape(says)):
        check_options(ExportOptions(queries=(query,)), warn=lambda m: None)
    assert check_options(ExportOptions(queries=(Query(KETTLE, "Tea!", "boil", np.float32(0.7)),)),
                         warn=lambda m: None).queries


def test_set_query_policy_changes_a_querys_threshold_and_label_as_add_query_would_choose_them(calibrated):
    """From Python as from the watched file: the same query, a threshold chosen as for a new query, and the index of
    duplicate queries kept true (a query moved onto another's policy warns; moved away, it does not)."""
    import warnings

    from sdqes_edge.runtime import DuplicateQueryWarning

    detector = StreamingDetector(calibrated)
    kettle = detector.add_query(KETTLE, label="boil_water")
    other = detector.add_query(KETTLE, threshold=0.4)
    assert detector.set_query_policy(kettle.id, label="open_door") is kettle
    assert (kettle.label, kettle.policy.threshold) == ("open_door", 0.25)
    with pytest.warns(DuplicateQueryWarning, match=f"already active as {other.id}") as seen:
        detector.set_query_policy(kettle.id, threshold=0.4)
    assert seen[0].filename == __file__ and kettle.label is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", DuplicateQueryWarning)
        detector.set_query_policy(kettle.id, threshold=0.3)
        detector.remove_query(other.id)
        detector.add_query(KETTLE, threshold=0.4)  # no longer active under that policy
    with pytest.raises(UserError, match="no query with id 'q9'"):
        detector.set_query_policy("q9", threshold=0.3)
    detector.close()


@pytest.mark.parametrize("ask", ["add_query", "set_query_policy"])
def test_a_policy_option_misnamed_is_refused_naming_the_options_there_are(calibrated, ask):
    """add_query(text, cooldown=10) was a TypeError about default_policy(), a method the program never called."""
    detector = StreamingDetector(calibrated)
    query = detector.add_query(KETTLE)
    with pytest.raises(UserError, match=r"^cooldown is no option of a query's alert policy: give threshold, "
                                        r"exit_threshold, cooldown_s \(seconds\), max_alerts or label$"):
        getattr(detector, ask)(KETTLE if ask == "add_query" else query.id, cooldown=10)
    assert [q.id for q in detector.queries.queries.values()] == [query.id]  # nothing added, nothing changed
    detector.close()


def test_thresholds_chosen_after_export_are_named_as_not_kept_when_the_bundle_is_exported_again(tmp_path):
    """eval --write-threshold's calibrated threshold, thresholds per label and alert policy were replaced by the new
    export's default without a word; they are not carried over, since the new model may score otherwise."""
    from conftest import random_model

    from sdqes_edge.export import export_bundle

    out = tmp_path / "bundle"
    said: list[str] = []
    options = ExportOptions(show_progress=False)
    export_bundle(random_model("qrnn"), out, options, log=said.append)
    export_bundle(random_model("qrnn"), out, options, log=said.append)
    assert not [line for line in said if "thresholds chosen" in line]  # export's own default: nothing to say
    write_thresholds(out, 0.61, {"cook": 0.55}, {"split": "val"}, policy={"cooldown_s": 10.0})
    export_bundle(random_model("qrnn"), out, options, log=said.append)
    assert [line for line in said if "thresholds chosen" in line] == [
        f"warning: --out {out} holds alert thresholds chosen after its export (default 0.61, 1 per label, an alert "
        "policy; eval --write-threshold), which the new bundle does not keep, since its model may score otherwise: "
        f"choose them again with `sdqes-edge eval ... --calibrate --write-threshold {out}`"]
    assert load_bundle(out).manifest["thresholds"] == {"default": ExportOptions().threshold}
