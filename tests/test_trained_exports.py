"""An export of a checkpoint `sdqes-edge train` made takes what its training record says of its deployment: the
threshold calibrated on its validation streams and the rate it was trained at, unless the command line says
otherwise; and the bundle carries the record, so that a run can say what the model was trained on."""

from __future__ import annotations

import json

import pytest
from test_training import SMALL, small_options

from sdqes_edge.checkpoints import load_model
from sdqes_edge.cli import run
from sdqes_edge.config import DEFAULT_THRESHOLD
from sdqes_edge.runtime.bundle import load_bundle
from sdqes_edge.training import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(the checkpoint of a SMALL run, its record)"""
    result = train(SMALL, tmp_path_factory.mktemp("trained"), log=lambda _: None)
    return result.checkpoint, result.record


def _export(checkpoint, out, *options: str) -> None:
    assert run(["export", "--checkpoint", str(checkpoint), "--out", str(out), *options]) == 0


def test_the_checkpoints_calibrated_threshold_becomes_the_bundles_and_its_record_goes_with_it(trained, tmp_path,
                                                                                               capsys):
    """The bundle had the default 0.57, a threshold no validation stream chose, and no record."""
    checkpoint, record = trained
    assert load_model(str(checkpoint))[1].training_record == record
    _export(checkpoint, tmp_path / "bundle")
    assert (f"threshold {record['threshold']:.4f}: calibrated on validation streams when this model was trained "
            "(its record); --threshold gives another") in capsys.readouterr().out
    bundle = load_bundle(tmp_path / "bundle")  # the record listed with the bundle's files, its sha256 checked
    assert bundle.manifest["thresholds"]["default"] == record["threshold"] != DEFAULT_THRESHOLD
    assert bundle.manifest["fps"] == SMALL.fps
    assert bundle.training_record == record and "training_record.json" in bundle.manifest["files"]


def test_a_threshold_given_is_the_bundles_and_a_rate_unlike_the_trained_one_is_warned_about(trained, tmp_path,
                                                                                             capsys):
    checkpoint, record = trained
    _export(checkpoint, tmp_path / "bundle", "--threshold", "0.6", "--fps", "2")
    said = capsys.readouterr()
    assert "calibrated on validation streams" not in said.out
    assert said.err.strip() == (
        "sdqes-edge: warning: --fps 2 is not the 1 fps this model was trained at (its record): its adapters learnt "
        "how frames 1 s apart follow each other, and at another rate their memory spans another time; give --fps 1, "
        "or train at this rate (train --fps 2)")
    manifest = load_bundle(tmp_path / "bundle").manifest
    assert manifest["thresholds"]["default"] == 0.6 and manifest["fps"] == 2.0


def test_a_checkpoint_without_a_training_record_keeps_the_defaults(tmp_path, capsys):
    import torch
    from conftest import random_model

    model = random_model("qrnn")
    torch.save({"state_dict": model.clip_state_dict()}, tmp_path / "plain.pt")  # as open_clip's training saves
    assert load_model(str(tmp_path / "plain.pt"))[1].training_record is None
    _export(tmp_path / "plain.pt", tmp_path / "bundle", "--quiet")
    bundle = load_bundle(tmp_path / "bundle")
    assert bundle.manifest["thresholds"]["default"] == DEFAULT_THRESHOLD and bundle.training_record is None


def test_the_export_train_prints_next_makes_a_bundle_at_the_calibrated_threshold_whole(tmp_path, capsys):
    """It printed --threshold rounded to four places, a threshold no validation stream chose either."""
    assert run(["train", *small_options(), "--out", str(tmp_path / "run")]) == 0
    command = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert command[:3] == ["next:", "sdqes-edge", "export"] and "--threshold" not in command
    args = command[2:]
    args[args.index("--out") + 1] = str(tmp_path / "bundle")
    assert run(args) == 0
    record = json.loads((tmp_path / "run" / "synthetic+qrnn.record.json").read_text())
    assert load_bundle(tmp_path / "bundle").manifest["thresholds"]["default"] == record["threshold"]


def test_what_the_weights_do_not_store_is_read_from_the_record_not_guessed_by_clips_rule(trained, tmp_path):
    """Head counts and the MLP activation are not in the weights: the record's model config gives them, where CLIP's
    rule (width // 64) had been taken, and said to be taken "for no model config beside the checkpoint"."""
    import torch

    from sdqes_edge.checkpoints import load_resolving_unstored
    from sdqes_edge.train_options import CHECKPOINT_RECORD_KEY

    checkpoint, _ = trained
    saved = torch.load(checkpoint, weights_only=True)
    saved[CHECKPOINT_RECORD_KEY]["model"]["vision"]["heads"] = 2  # width 64: CLIP's rule gives 1
    torch.save(saved, tmp_path / "two-heads.pt")
    model, _, unstored = load_resolving_unstored(str(tmp_path / "two-heads.pt"))
    assert model.cfg.vision.heads == 2 and model.cfg.text.heads == 1
    assert unstored.rule == ("attention heads: vision 2 (from its training record), text 1 (from its training "
                             "record); MLP activation QuickGELU (from its training record); preprocessing CLIP's "
                             "(from its training record)")
    assert load_model(tmp_path / "two-heads.pt")[0].cfg.vision.heads == 2  # the Python API reads it too
    # A flag still comes first.
    assert load_resolving_unstored(str(tmp_path / "two-heads.pt"), vision_heads=4)[0].cfg.vision.heads == 4


def test_info_on_a_checkpoint_names_its_export_as_what_comes_next(trained, capsys):
    """It named `check`, which checks presets with random weights and never reads the checkpoint."""
    checkpoint, _ = trained
    assert run(["info", "--checkpoint", str(checkpoint)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"next: sdqes-edge export --checkpoint {checkpoint} --out bundles/synthetic-qrnn")
