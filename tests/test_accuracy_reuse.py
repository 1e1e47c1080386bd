"""What `sdqes-edge accuracy` takes again from its results folder: only a run trained with the table's own options,
and only a bundle exported from that run's checkpoint at its threshold. Anything else is made again, and said."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from conftest import random_model
from test_training import SMALL, small_options

from sdqes_edge.benchmarks.accuracy import _bundle_of, _refusals_of, export_formats
from sdqes_edge.files import file_sha256
from sdqes_edge.runtime.bundle import load_bundle


def _accuracy(out, *options: str) -> subprocess.CompletedProcess:
    """The per-format table alone, of the backbone's seed-0 model (no adapter table)."""
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "accuracy", "--kinds", "--formats", "none",
                           "--seeds", "0", *small_options(), *options, "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


def test_a_run_trained_with_other_options_is_trained_again_and_its_formats_scored_from_a_bundle_of_that_model(
        tmp_path):
    """A table of --steps 4 into the folder of a table of --steps 3 scored the 3-step model under the 4-step recipe,
    and ONNX Runtime's rows from the bundle of whatever model had been exported there first."""
    _accuracy(tmp_path)
    again = _accuracy(tmp_path, "--steps", "4")
    run_dir = tmp_path / "runs" / "none-seed0"
    assert (f"note: {run_dir} holds a run trained with other options (--steps 3, not 4); it is trained again with "
            "these") in again.stdout
    assert json.loads((run_dir / "synthetic.record.json").read_text())["options"]["steps"] == 4
    manifest = json.loads((run_dir / "bundle" / "manifest.json").read_text())
    assert manifest["checkpoint"]["sha256"] == file_sha256(run_dir / "synthetic.pt")
    # The bundle carries the run's record, as `export --checkpoint` of its checkpoint writes it.
    assert load_bundle(run_dir / "bundle").training_record["options"]["steps"] == 4
    # The same table once more takes both back: nothing trained, nothing exported.
    last = _accuracy(tmp_path, "--steps", "4")
    assert "reusing the finished run" in last.stdout and "exporting" not in last.stdout
    assert json.loads((run_dir / "bundle" / "manifest.json").read_text())["created"] == manifest["created"]


def test_a_bundle_of_another_checkpoint_or_threshold_is_exported_again_and_its_refusals_dropped(tmp_path):
    model, bundle = random_model("none"), tmp_path / "none" / "bundle"
    earlier = {"file": "synthetic.pt", "sha256": "a" * 64, "source_format": "sdqes-edge-training"}
    export_formats(model, bundle, 0.5, SMALL, log=lambda _: None, checkpoint=earlier)
    # What a refusal of the earlier model's export had left beside its bundle.
    (bundle.parent / "refused.json").write_text(json.dumps({"fp16": "drifts beyond its tolerance"}))
    (bundle.parent / "step.fp16.refused.onnx").write_bytes(b"the earlier model's fp16 graph")

    retrained = dict(earlier, sha256="b" * 64)
    said: list[str] = []
    precisions, refused = export_formats(model, bundle, 0.5, SMALL, log=said.append, checkpoint=retrained)
    assert any(line.startswith("exporting to") for line in said)
    assert precisions == ["fp16", "fp32", "int8"] and refused == {}
    assert json.loads((bundle / "manifest.json").read_text())["checkpoint"] == retrained
    assert not (bundle.parent / "step.fp16.refused.onnx").exists()

    said.clear()
    export_formats(model, bundle, 0.6, SMALL, log=said.append, checkpoint=retrained)  # a threshold calibrated anew
    assert json.loads((bundle / "manifest.json").read_text())["thresholds"]["default"] == 0.6
    said.clear()
    assert export_formats(model, bundle, 0.6, SMALL, log=said.append, checkpoint=retrained) == (precisions, {})
    assert said == []  # read back, not made again
    (bundle / "manifest.json").write_text('{"checkpoint": ')  # damaged: a bundle to export again, as export replaces it
    assert _bundle_of(bundle, retrained, 0.6, SMALL.fps) is None


def test_a_run_whose_record_cannot_be_read_is_trained_again_and_said(tmp_path):
    """A record cut short (or edited) ended the table in a JSONDecodeError traceback."""
    from sdqes_edge.benchmarks.accuracy import trained_run

    options = dataclasses.replace(SMALL, adapter="none")
    run_dir = tmp_path / "none-seed0"
    run_dir.mkdir()
    (run_dir / "synthetic.pt").write_bytes(b"a checkpoint")
    (run_dir / "synthetic.record.json").write_text('{"options": {"steps": 3')
    said: list[str] = []
    record = trained_run(options, run_dir, said.append, lambda: None, None)
    assert said[0] == (f"note: {run_dir} holds a run whose record synthetic.record.json cannot be read; it is "
                       "trained again with these")
    assert record["options"]["steps"] == SMALL.steps and (run_dir / "synthetic.pt").read_bytes() != b"a checkpoint"


def test_a_bundle_whose_refusals_cannot_be_read_or_do_not_name_what_it_lacks_is_exported_again(tmp_path):
    """A refusals file cut short ended the table in a JSONDecodeError traceback; one deleted while the bundle lacked
    a refused precision left that precision's row out of the table without a word."""
    model, bundle = random_model("none"), tmp_path / "none" / "bundle"
    checkpoint = {"file": "synthetic.pt", "sha256": "a" * 64, "source_format": "sdqes-edge-training"}
    export_formats(model, bundle, 0.5, SMALL, log=lambda _: None, checkpoint=checkpoint)
    refusals, shipped = bundle.parent / "refused.json", ["fp16", "fp32", "int8"]
    # Each damage makes the refusals unusable, so the bundle beside them is not taken back (each export is 8 s: the
    # one below shows what follows for them all).
    for damage in ('{"fp16": ', '["fp16"]', '{"fp16": 3}', '{"int8": "drifts beyond its tolerance"}'):
        refusals.write_text(damage)
        assert _refusals_of(refusals, shipped) is None, damage
    refusals.write_text('{"fp16": ')
    said: list[str] = []
    assert export_formats(model, bundle, 0.5, SMALL, log=said.append, checkpoint=checkpoint) == (shipped, {})
    assert any(line.startswith("exporting to") for line in said)
    assert json.loads(refusals.read_text()) == {}
    assert _refusals_of(refusals, shipped) == {}  # what the export wrote is read back
    # A bundle that lacks fp16 with no refusal on record of it is not taken back either.
    assert _refusals_of(refusals, ["fp32", "int8"]) is None
    refusals.unlink()
    assert _refusals_of(refusals, ["fp32", "int8"]) is None and _refusals_of(refusals, shipped) == {}
