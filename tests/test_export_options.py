"""What an export is asked is checked before any work. ``ExportOptions`` from the Python API as the command line's
arguments are: a value of the wrong type (a config file's "2", a fraction, a precision name not in a tuple, a bare
query text) is a one-line error saying what to pass, not a TypeError from a comparison or an AttributeError deep in
the export. And the folder it replaces holds nothing of the user's but the earlier bundle."""

from __future__ import annotations

import pytest

from sdqes_edge.errors import UserError
from sdqes_edge.export.options import ExportOptions, Query, check_options


@pytest.mark.parametrize("options, words", [
    (dict(batch="2"), r"^batch is a whole number, not '2'$"),
    (dict(batch=1.5), r"^batch is a whole number, not 1.5$"),
    (dict(verify_frames="32"), r"^verify_frames is a whole number, not '32'$"),
    (dict(fps="1"), r"^fps is a number, not '1'$"),
    (dict(threshold=True), r"^threshold is a number, not True$"),
    (dict(precisions="fp16"), r"^precisions is a tuple of names, not the text 'fp16': precisions=\('fp16',\)$"),
    (dict(queries=["when I start cooking"]), r"^queries are Query\(text, response\) items: .*sdqes_edge.export$"),
    (dict(queries="when I start cooking"), r"^queries are Query\(text, response\) items"),
    (dict(fuse_queries="no"), r"^fuse_queries is True or False, not 'no'$"),  # "no" was taken as yes
    (dict(truncate_queries=1), r"^truncate_queries is True or False, not 1$"),
    (dict(show_progress=None), r"^show_progress is True or False, not None$"),
])
def test_an_option_of_the_wrong_type_is_refused_in_one_line(options, words):
    with pytest.raises(UserError, match=words):
        check_options(ExportOptions(**options), lambda message: None)


def test_lists_and_numpy_numbers_of_the_right_kind_are_taken_as_plain_python_values():
    import numpy as np

    checked = check_options(ExportOptions(batch=np.int64(2), fps=np.float32(2.0), precisions=["fp16"],
                                          queries=[Query("when I start cooking", "Wash your hands!")]),
                            lambda message: None)
    assert checked.precisions == ("fp32", "fp16")
    assert (type(checked.batch), type(checked.fps)) == (int, float)  # the manifest's JSON takes them


def test_a_bundle_folder_holding_files_export_did_not_write_is_not_replaced(tmp_path):
    """A checkpoint kept beside the bundle's files (the very one being exported) was deleted with the folder when
    the new bundle replaced it whole. The bundle's own files, its training record and its engines (derived from
    the graphs being replaced) are not the user's."""
    import json

    from sdqes_edge.export.options import check_target

    bundle = tmp_path / "bundle"
    (bundle / "engines" / "orin").mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps({"files": {"step.fp32.onnx": {}}}))
    for name in ("step.fp32.onnx", "training_record.json", "engines/orin/step.fp16.engine"):
        (bundle / name).write_bytes(b"x")
    check_target(bundle)  # an earlier bundle: replaced
    (bundle / "model.ckpt").write_bytes(b"the user's weights")
    with pytest.raises(UserError, match=r"^--out .*bundle is a bundle that also holds files export did not write "
                                        r"\(model.ckpt\); .* they would be deleted: move them out"):
        check_target(bundle)


def test_the_fp16_graphs_operators_are_checked_and_named_where_no_fp16_graph_is_written():
    with pytest.raises(UserError, match=r"^unknown --fp16-operators tensorrt; choose from onnx, onnxruntime$"):
        check_options(ExportOptions(fp16_operators="tensorrt"), lambda message: None)
    said = []
    check_options(ExportOptions(fp16_operators="onnx"), said.append)
    assert said == ["--fp16-operators is only used for fp16, which this export does not write; ignoring it (add "
                    "--precision fp16 to write it)"]
    said.clear()
    check_options(ExportOptions(fp16_operators="onnx", precisions=("fp32", "fp16")), said.append)
    assert said == []


def test_the_fp32_graphs_operators_are_checked():
    with pytest.raises(UserError, match=r"^unknown --fp32-operators tensorrt; choose from onnx, onnxruntime$"):
        check_options(ExportOptions(fp32_operators="tensorrt"), lambda message: None)


@pytest.mark.parametrize("args, message", [
    (["--preset", "tiny", "--fuse-queries"], "--fuse-queries fixes the number of queries"),
    (["--preset", "tiny", "--opset", "13"], "--opset must be one of"),
    (["--preset", "tiny", "--verify-frames", "4"], "--verify-frames must be >= 16"),
    (["--preset", "tiny", "--fps", "5000"], "argument --fps: give a positive number of frames per second up to 1000, "
                                            "not 5000"),
    (["--checkpoint", "/nonexistent.ckpt"], "nonexistent.ckpt"),
    (["--preset", "tiny", "--query", ""], "a query is empty"),
    (["--preset", "tiny", "--query", "   "], "a query is empty"),
    (["--preset", "tiny", "--query", "wash " * 80], "over the model's limit of 77"),
])
def test_export_arguments_are_checked_up_front(args, message, tmp_path, capsys):
    """In this process, as the command line runs them (a subprocess each spent 3 s importing torch): an exception
    other than the one-line refusal fails the test as a traceback would."""
    from sdqes_edge.cli import run

    try:
        code = run(["export", *args, "--out", str(tmp_path / "b")])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert "attention heads" not in out  # nothing about a model that was never read
    assert not (tmp_path / "b").exists()


def test_export_bundle_given_something_other_than_a_model_and_its_options_says_what_to_pass(tmp_path):
    """A state dict, or options as a dict, failed on a missing attribute (AttributeError: ... no attribute 'cfg')."""
    from runtime_fixtures import random_model

    from sdqes_edge.export import export_bundle

    model = random_model("qrnn")
    with pytest.raises(UserError, match=r"^export_bundle takes an SDQESModel, not a OrderedDict; from a checkpoint: "
                                        r"model, _ = sdqes_edge.checkpoints.load_model\(path\)$"):
        export_bundle(model.state_dict(), tmp_path / "bundle")
    with pytest.raises(UserError, match=r"^export options are an ExportOptions \(sdqes_edge.export\), not a dict: "
                                        r"ExportOptions\(\*\*options\)$"):
        export_bundle(model, tmp_path / "bundle", {"precisions": ("fp32",)})
    assert not (tmp_path / "bundle").exists()


def test_a_model_whose_weights_turned_nan_is_refused_before_anything_is_traced(tmp_path):
    """Its graph was traced and then found not to match the model ("please report this"): NaN matches nothing."""
    import torch
    from runtime_fixtures import random_model

    from sdqes_edge.export import export_bundle

    model = random_model("qrnn")
    with torch.no_grad():
        model.text.ln_final.weight[0] = float("nan")
    with pytest.raises(UserError, match=r"^the model holds NaN or infinite weights in text.ln_final.weight: .*"
                                        r"did its training diverge\? Export it from before its weights turned NaN$"):
        export_bundle(model, tmp_path / "bundle", log=lambda line: None)
    assert not (tmp_path / "bundle").exists()


def test_a_model_exported_between_training_steps_is_left_training(tmp_path):
    """Export runs the model in eval mode; the user's model was left in it, its dropout off for the steps after."""
    from runtime_fixtures import random_model

    from sdqes_edge.export import export_bundle

    model = random_model("qrnn").train()
    export_bundle(model, tmp_path / "bundle", ExportOptions(verify_frames=16), log=lambda line: None)
    assert model.training and all(module.training for module in model.modules())
    assert (tmp_path / "bundle" / "manifest.json").is_file()


def test_a_threshold_no_score_reaches_is_refused_and_one_below_every_score_is_said():
    """p = sigmoid(cos) lies in [0.2689, 0.7311]: a bundle exported at --threshold 0.9 (a detector's usual
    confidence) never alerted, without a word."""
    said = []
    with pytest.raises(UserError, match=r"^--threshold 0.9 is never reached: p = sigmoid\(cos\) is at most 0.7311 "
                                        r"\(a cosine is at most 1\), so a query at it never alerts; give one between "
                                        r"0.2689 and 0.7311"):
        check_options(ExportOptions(threshold=0.9), said.append)
    with pytest.raises(UserError, match=r"^the threshold 0.75 of the query 'when I cook' is never reached"):
        check_options(ExportOptions(queries=(Query("when I cook", "Wash!", threshold=0.75),)), said.append)
    assert said == []
    check_options(ExportOptions(threshold=0.2), said.append)
    assert said == ["--threshold 0.2 is below every score: p = sigmoid(cos) is at least 0.2689 (a cosine is at least "
                    "-1), so a query at it alerts at its first frame and never again; give one between 0.2689 and "
                    "0.7311 (a calibrated one: sdqes-edge eval --calibrate)"]
    check_options(ExportOptions(threshold=0.7), said.append)  # inside: nothing said
    assert len(said) == 1
