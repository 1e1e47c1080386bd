"""What `export` says of an earlier bundle it replaces (what that bundle was given after its export and the new one
will not have; the thresholds are tested in test_query_thresholds.py), and what `inspect` says of a bundle's
weights."""

from __future__ import annotations

from conftest import random_model

from sdqes_edge.export import ExportOptions, export_bundle


def test_tensorrt_engines_built_for_the_replaced_graphs_are_named_with_the_commands_that_build_them_again(tmp_path):
    """An engine takes minutes to build on a Jetson; re-exporting deleted it without a word, and the next
    `run --backend trt` found none."""
    out, said = tmp_path / "bundle", []
    options = ExportOptions(show_progress=False)
    export_bundle(random_model("qrnn"), out, options, log=said.append)
    for device, precision in (("orin-sm87-trt10.3", "fp16"), ("orin-sm87-trt10.3", "int8"), ("v100-sm70-trt8.6",
                                                                                             "fp16")):
        (out / "engines" / device).mkdir(parents=True, exist_ok=True)
        (out / "engines" / device / f"step.{precision}.engine").write_bytes(b"an engine of the replaced graph")
    said.clear()
    export_bundle(random_model("qrnn"), out, options, log=said.append)
    assert [line for line in said if "TensorRT engines" in line] == [
        f"warning: --out {out} holds TensorRT engines built from the graphs it replaces (orin-sm87-trt10.3 fp16, "
        "orin-sm87-trt10.3 int8, v100-sm70-trt8.6 fp16), which go with them: build them again on each device "
        f"(sdqes-edge build-engine {out} --precision fp16; sdqes-edge build-engine {out} --precision int8)"]
    assert not (out / "engines").exists()
    said.clear()
    export_bundle(random_model("qrnn"), out, options, log=said.append)  # none now: nothing to say
    assert not [line for line in said if line.startswith("warning:")]


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
