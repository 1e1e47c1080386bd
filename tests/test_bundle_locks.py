"""One program at a time writes a bundle: an export (which replaces the folder whole), a threshold written into it
(``eval --write-threshold``, ``write_thresholds``) or an engine built into it (``build-engine``), each holding the
bundle's lock (runtime/output_locks.py)."""

from __future__ import annotations

import shutil

import pytest
from runtime_fixtures import another_run_writing

from sdqes_edge.cli import run
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.runtime.bundle import write_thresholds


def run_refusal(argv: list[str], capsys) -> str:
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_an_export_into_a_bundle_another_export_is_writing_is_refused_and_the_bundle_kept(tmp_path, capsys):
    """Of two exports into one --out at once, each said it wrote the bundle, and the one that ended last replaced
    the other's without a word."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text('{"format": "an earlier bundle"}')
    with another_run_writing(tmp_path, "bundle") as other:  # as an export holds its bundle until it is in place
        err = run_refusal(["export", "--preset", "tiny", "--adapter", "qrnn", "--out", str(bundle), "--quiet"], capsys)
    assert err.strip() == (f"sdqes-edge: error: --out {bundle} is being written by another run (pid {other.pid}, "
                           "sdqes-edge); stop that run, or give this one another folder")
    assert [p.name for p in bundle.iterdir()] == ["manifest.json"] and not list(tmp_path.glob(".bundle.staging-*"))


def test_a_threshold_written_into_a_bundle_an_export_is_replacing_is_refused_and_the_manifest_kept(
        egosdqes_csv, tmp_path, capsys):
    """The manifest read before the export's replacing was written into the new bundle after it, describing the
    graphs it replaced: the new bundle no longer loaded."""
    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO_BUNDLE, bundle)
    manifest = (bundle / "manifest.json").read_text()
    with another_run_writing(tmp_path, "bundle") as other:  # as an export replacing it holds it
        with pytest.raises(UserError, match=rf"^write_thresholds {bundle} is being written by another run \(pid "
                                            rf"{other.pid}, sdqes-edge\)"):
            write_thresholds(bundle, 0.5)
        err = run_refusal(["eval", "--annotations", str(egosdqes_csv), "--baseline", "oracle", "--calibrate",
                           "--write-threshold", str(bundle), "--plots", "0", "--out", str(tmp_path / "eval")], capsys)
    assert f"error: --write-threshold {bundle} is being written by another run (pid {other.pid}" in err
    assert (bundle / "manifest.json").read_text() == manifest and not (tmp_path / "eval").exists()


def test_a_bundle_requantized_into_a_folder_an_export_is_writing_is_refused(tmp_path):
    """requantize_int8 replaces its --out whole, as an export does: of the two, the one that ended last won."""
    from sdqes_edge.export.requantize import requantize_int8

    with another_run_writing(tmp_path, "new") as other:  # as an export into tmp_path/new holds it
        with pytest.raises(UserError, match=rf"^--out {tmp_path / 'new'} is being written by another run \(pid "
                                            rf"{other.pid}, sdqes-edge\)"):
            requantize_int8(DEMO_BUNDLE, tmp_path / "new", log=lambda m: None)


def test_an_engine_built_into_a_bundle_an_export_is_replacing_is_refused_before_any_gpu_is_looked_for(tmp_path):
    """The engine was written into the folder the export then took away; two builds for one device wrote one
    candidate file between them."""
    from sdqes_edge.export.tensorrt_engine import build_engine

    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO_BUNDLE, bundle)
    with another_run_writing(tmp_path, "bundle") as other:  # as an export replacing it holds it
        with pytest.raises(UserError, match=rf"^build-engine {bundle} is being written by another run \(pid "
                                            rf"{other.pid}, sdqes-edge\)"):
            build_engine(bundle, log=lambda m: None)


@pytest.mark.parametrize("argv, says", [
    (["build-engine", "/"], "/ has no manifest.json, so it is not a finished bundle"),
    (["eval", "--annotations", "{csv}", "--baseline", "oracle", "--calibrate", "--write-threshold", "/"],
     "/ has no manifest.json, so it is not a finished bundle"),
    (["synth", "--out", "/"], "--out / is not empty; give a new folder"),
])
def test_the_root_folder_which_has_no_folder_above_it_for_a_lock_is_refused_in_the_commands_own_words(
        argv, says, egosdqes_csv, capsys):
    """A lock lies beside what it holds, and "/" has no name to put one beside: a traceback (ValueError)."""
    err = run_refusal([a.format(csv=egosdqes_csv) for a in argv], capsys)
    assert says in err
