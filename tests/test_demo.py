"""The shipped demo: a verified bundle with its training record, and `sdqes-edge demo` on a device without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import cv2
import pytest
from test_json_nested_too_deep import relisted

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.runtime.bundle import load_bundle
from sdqes_edge.synthetic import EVENT_KINDS
from sdqes_edge.train_options import DEMO_SEED, TrainOptions, is_training_seed


def run_cli(*args: str, block_torch: bool = True) -> subprocess.CompletedProcess:
    prefix = "import sys; sys.modules['torch'] = None\n" if block_torch else "import sys\n"
    code = prefix + "from sdqes_edge.cli import run\nsys.exit(run(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)


def test_the_shipped_bundle_loads_verified_with_the_record_of_how_it_was_trained():
    bundle = load_bundle(DEMO_BUNDLE)  # checks every listed file against its sha256
    assert bundle.manifest["model"]["vision"]["image_size"] == 64
    assert bundle.precisions == ["fp32", "int8"]
    # The int8 graph passed the exporter's drift check over 2,000 frames of a training stream.
    drift = bundle.manifest["graphs"]["step"]["int8"]["verification"]
    assert drift["frames"] >= 2000 and drift["min_cosine"] >= 0.99 and drift["passed"]
    record = json.loads((DEMO_BUNDLE / "training_record.json").read_text())
    assert record["command"].startswith("sdqes-edge train --adapter qrnn --seed 0")
    assert abs(bundle.default_threshold - record["threshold"]) < 1e-6  # calibrated on validation, then shipped
    options = TrainOptions(**record["options"])
    assert options.model_config().adapter.kind == "qrnn"
    size = sum(f.stat().st_size for f in DEMO_BUNDLE.rglob("*") if f.is_file())
    assert size < 12 * 2**20  # a few MB in the package


def test_the_demo_alerts_on_a_fresh_stream_without_torch_and_writes_what_it_says(tmp_path):
    assert not is_training_seed(DEMO_SEED)
    done = run_cli("demo", "--out", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["queries"] == len(EVENT_KINDS) and summary["seed"] == DEMO_SEED
    assert f"{summary['hits']} of {len(EVENT_KINDS)} queries alerted" in done.stdout
    for outcome in summary["outcomes"]:
        assert f"{outcome['start_time']:.1f} s" in done.stdout  # every ground-truth start is printed
    assert summary["hits"] >= 3  # the shipped model finds most event starts of the demo stream
    for name in ("stream.avi", "annotated.avi", "alerts.jsonl", "scores.npz", "scores.png"):
        assert (tmp_path / "demo" / name).stat().st_size > 0
    annotated = cv2.VideoCapture(str(tmp_path / "demo" / "annotated.avi"))
    assert int(annotated.get(cv2.CAP_PROP_FRAME_COUNT)) == 60  # one annotated frame per sampled second
    alerts = [json.loads(line) for line in (tmp_path / "demo" / "alerts.jsonl").read_text().splitlines()]
    assert len(alerts) == sum(len(o["alerts"]) for o in summary["outcomes"])


def test_the_demo_uses_the_alert_policy_chosen_on_validation_streams_and_reports_false_alerts(tmp_path):
    """The shipped bundle records a policy from scripts/calibrate_demo_policy.sh (validation seeds only)."""
    from sdqes_edge.demo import DEMO_BUNDLE
    from sdqes_edge.runtime.bundle import load_bundle

    policy = load_bundle(DEMO_BUNDLE).manifest["thresholds"]["policy"]
    assert policy["chosen_on"]["split"] == "val" and policy["cooldown_s"] > 0
    done = run_cli("demo", "--out", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert f"{policy['cooldown_s']:g} s cooldown (policy chosen on the validation streams)" in done.stdout
    assert "false alerts:" in done.stdout and "per minute of stream" in done.stdout
    assert summary["false_alerts"] == sum(o["false_alerts"] for o in summary["outcomes"])
    assert sum(len(o["alerts"]) for o in summary["outcomes"]) <= 2 * summary["queries"]  # repeats held back


def test_a_missing_bundle_is_one_line_and_exit_2_with_the_fix_for_whose_bundle_it_is(tmp_path, monkeypatch):
    """--bundle of the user's own that is not there was told to reinstall sdqes-edge; the shipped one still is."""
    done = run_cli("demo", "--bundle", str(tmp_path / "nowhere"), "--out", str(tmp_path / "demo"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert (f"bundle {tmp_path / 'nowhere'} does not exist; make one with `sdqes-edge export --out "
            f"{tmp_path / 'nowhere'}`") in done.stderr
    assert not (tmp_path / "demo").exists()  # refused before anything was written
    from sdqes_edge import demo

    monkeypatch.setattr(demo, "DEMO_BUNDLE", tmp_path / "shipped")  # a package whose bundle was lost
    with pytest.raises(UserError, match=r"^the demo bundle is missing at .*shipped; reinstall sdqes-edge, or make "
                                        r"one with `sdqes-edge train`"):
        demo.run_demo(7, tmp_path / "demo", "sdqes-edge", tmp_path / "shipped")


def test_bad_demo_arguments_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("mine")
    for args, message in ((["--seed", "-1"], "argument --seed: give a seed from 0 to"),
                          (["--out", str(tmp_path / "file")], "is a file")):
        done = run_cli("demo", *args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr
    assert (tmp_path / "file").read_text() == "mine"


def test_a_second_demo_in_its_folder_replaces_the_first_and_a_folder_of_the_users_own_is_left_alone(tmp_path):
    """The alert log is appended to: a second demo in one folder logged both runs' alerts, and a user's own
    alerts.jsonl in --out got the demo's appended to it (and their stream.avi was written over)."""
    for _ in range(2):
        assert run_cli("demo", "--out", str(tmp_path / "demo")).returncode == 0
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    logged = (tmp_path / "demo" / "alerts.jsonl").read_text().splitlines()
    assert len(logged) == sum(len(o["alerts"]) for o in summary["outcomes"])  # this run's alerts alone
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "alerts.jsonl").write_text("mine\n")
    done = run_cli("demo", "--out", str(tmp_path / "mine"))
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "already holds alerts.jsonl, not from an earlier demo; the demo would write over it: give a new folder "
        "(default sdqes-demo)")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["alerts.jsonl"]
    assert (tmp_path / "mine" / "alerts.jsonl").read_text() == "mine\n"


def test_a_demo_into_a_folder_another_demo_is_writing_is_refused(tmp_path):
    """The second wrote its stream.avi over the video the first was reading."""
    from runtime_fixtures import another_run_writing

    with another_run_writing(tmp_path, "demo") as first:  # as a demo holds its --out until it ends
        done = run_cli("demo", "--out", str(tmp_path / "demo"))
    assert done.returncode == 2 and done.stderr.strip() == (
        f"sdqes-edge: error: --out {tmp_path / 'demo'} is being written by another run (pid {first.pid}, "
        "sdqes-edge); stop that run, or give this one another folder")
    assert not (tmp_path / "demo").exists()


def test_a_seed_from_a_training_split_is_run_with_a_warning(tmp_path):
    done = run_cli("demo", "--seed", "100003", "--out", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stderr
    assert "warning: seed 100003 is in a training" in done.stderr


def test_run_says_when_a_bundle_was_trained_on_synthetic_scenes_only(tmp_path):
    import cv2

    from sdqes_edge.demo import DEMO_BUNDLE
    from sdqes_edge.sample import sample_frames

    video = tmp_path / "kitchen.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 2.0, (96, 72))
    for frame in sample_frames(6, 72, 96):
        writer.write(frame)
    writer.release()
    done = run_cli("run", str(DEMO_BUNDLE), "--source", str(video), "--query", "when I start cooking", "--quiet",
                   "--ort-device", "cpu")
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "was trained on" in line]
    assert len(notes) == 1 and "synthetic scenes" in notes[0] and "alerts mean little" in notes[0]
    # A CPU user running fp32 is pointed at the int8 graph the bundle carries; one running int8 is not.
    assert any("--precision int8" in line for line in done.stderr.splitlines())
    int8 = run_cli("run", str(DEMO_BUNDLE), "--source", str(video), "--query", "when I start cooking", "--quiet",
                   "--precision", "int8")
    assert int8.returncode == 0, int8.stderr
    assert "int8, CPUExecutionProvider" in int8.stderr and "--precision int8" not in int8.stderr


def test_the_demo_runs_the_int8_graph_and_alerts_as_fp32_does(tmp_path):
    """The shipped int8 graph on the demo stream: the same alerts at the bundle's threshold and policy."""
    summaries = {}
    for precision in ("fp32", "int8"):
        done = run_cli("demo", "--out", str(tmp_path / precision), "--precision", precision)
        assert done.returncode == 0, done.stderr
        summaries[precision] = json.loads((tmp_path / precision / "summary.json").read_text())
    assert summaries["int8"]["precision"] == "int8"
    assert [o["alerts"] for o in summaries["int8"]["outcomes"]] == [o["alerts"] for o in summaries["fp32"]["outcomes"]]


def test_a_bundle_whose_training_record_says_less_is_demoed_with_what_it_says(tmp_path):
    """A record without test scores ended the demo in a KeyError traceback; its texts are someone else's data."""
    import shutil

    bundle = shutil.copytree(DEMO_BUNDLE, tmp_path / "bundle")
    record = json.loads((bundle / "training_record.json").read_text())
    del record["test"]
    record["command"] = "sdqes-edge train \x1b[2J--seed 0"
    (bundle / "training_record.json").write_text(json.dumps(record))
    relisted(bundle, "training_record.json")  # as a bundle exported with such a record lists it
    done = run_cli("demo", "--bundle", str(bundle), "--out", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("model: synthetic+qrnn (trained by `sdqes-edge train \\x1b[2J--seed 0`), threshold ")


@pytest.mark.parametrize("train", [{"seeds": [100000, 100119]}, 5, {"seeds": [1], "streams": "many"}, None])
def test_a_training_record_that_says_its_data_otherwise_says_nothing_of_it(train):
    """`run` read a record's training streams by key: one without them ended the run in a traceback."""
    from sdqes_edge.train_options import training_data_words

    assert training_data_words({"data": {"train": train}}) is None
    assert training_data_words({"data": {"train": {"seeds": [100000, 100119], "streams": 120}}}).endswith(
        ", 120 training streams")
