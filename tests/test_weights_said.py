"""What the commands say of a bundle's weights: a preset's export has random ones, whose scores and alerts mean
nothing (run, sdqes-run and the C API are tested in test_native_training_note.py), and a model trained on synthetic
scenes only alerts little on other footage."""

from __future__ import annotations

from conftest import random_model

from sdqes_edge.export import ExportOptions, export_bundle


def test_inspect_says_where_a_bundles_weights_came_from(tmp_path, capsys):
    """A preset's export (random weights, `run` warns of them), the demo's trained checkpoint, and a bundle that does
    not say."""
    from sdqes_edge.cli import run
    from sdqes_edge.demo import DEMO_BUNDLE

    def weights_line(bundle) -> str:
        assert run(["inspect", str(bundle), "--frames", "1"]) == 0
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("weights"))

    assert run(["export", "--preset", "tiny", "--adapter", "st", "--seed", "3", "--out", str(tmp_path / "p"),
                "--quiet"]) == 0
    assert weights_line(tmp_path / "p") == ("weights    random weights (exported from preset tiny+st, seed 3, to "
                                            "measure speed): its scores and alerts mean nothing")
    assert weights_line(DEMO_BUNDLE) == (
        "weights    checkpoint synthetic+qrnn.pt (sdqes-edge-training), trained on synthetic scenes (coloured "
        "squares, rolling balls, a door and a lamp drawn by `sdqes-edge synth`), 120 training streams")
    export_bundle(random_model("qrnn"), tmp_path / "api", ExportOptions(show_progress=False), log=lambda m: None)
    assert weights_line(tmp_path / "api") == ("weights    not recorded (the manifest names no checkpoint, and no "
                                              "preset's random weights)")


def test_demo_and_score_of_a_presets_export_warn_that_its_alerts_mean_nothing(tmp_path, capsys):
    from sdqes_edge.cli import run

    bundle = tmp_path / "preset"
    assert run(["export", "--preset", "tiny", "--adapter", "qrnn", "--out", str(bundle), "--quiet"]) == 0
    assert run(["synth", "--out", str(tmp_path / "corpus"), "--train", "0", "--val", "1", "--test", "0"]) == 0
    capsys.readouterr()
    warning = ("this bundle's model has random weights (exported from preset tiny+qrnn, seed 0, to measure speed): "
               "its scores and alerts mean nothing")
    assert run(["demo", "--bundle", str(bundle), "--out", str(tmp_path / "demo")]) == 0
    assert f"warning: {warning}" in capsys.readouterr().out
    assert run(["score", str(bundle), "--videos", str(tmp_path / "corpus" / "videos"), "--annotations",
                str(tmp_path / "corpus" / "annotations.csv"), "--out", str(tmp_path / "scored"), "--quiet"]) == 0
    assert capsys.readouterr().err.count(f"warning: {warning}") == 1  # once, not once per worker


def test_score_notes_a_model_trained_on_synthetic_scenes_only_as_run_does(tmp_path, capsys):
    """The demo's model scored over a real corpus gives SR figures near 0, which `score` now explains as `run`
    does."""
    from sdqes_edge.cli import run
    from sdqes_edge.demo import DEMO_BUNDLE

    assert run(["synth", "--out", str(tmp_path / "corpus"), "--train", "0", "--val", "1", "--test", "0"]) == 0
    capsys.readouterr()
    assert run(["score", str(DEMO_BUNDLE), "--videos", str(tmp_path / "corpus" / "videos"), "--annotations",
                str(tmp_path / "corpus" / "annotations.csv"), "--out", str(tmp_path / "scored"), "--quiet"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note: this model was trained" in line]
    assert notes == ["sdqes-edge: note: this model was trained on synthetic scenes (coloured squares, rolling balls, "
                     "a door and a lamp drawn by `sdqes-edge synth`), 120 training streams only; on other footage its "
                     "alerts mean little"]
