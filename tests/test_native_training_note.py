"""sdqes-run says what its bundle's model was trained on, and warns of a preset's random weights, in `sdqes-edge run`'s
words: the demo's model, trained on synthetic scenes, deployed by the native runtime on real footage alerted with no
word of it, and a preset's export alerted at random under either runtime."""

from __future__ import annotations

import json
import shutil
import subprocess

from sdqes_edge.cli import run
from sdqes_edge.files import file_sha256

RECORD = {"data": {"train": {"seeds": [100000, 100119], "streams": 120}}, "threshold": 0.6}


def test_sdqes_run_notes_a_synthetic_training_as_sdqes_edge_run_does(sdqes_run_on_the_cpu, bundle, video, tmp_path,
                                                                     capsys):
    trained = tmp_path / "trained"
    shutil.copytree(bundle, trained)
    (trained / "training_record.json").write_text(json.dumps(RECORD))
    manifest = json.loads((trained / "manifest.json").read_text())  # listed, as export lists the record it writes
    manifest["files"]["training_record.json"] = {"bytes": (trained / "training_record.json").stat().st_size,
                                                 "sha256": file_sha256(trained / "training_record.json")}
    (trained / "manifest.json").write_text(json.dumps(manifest))

    def notes(stderr: str, program: str) -> list[str]:
        return [line.removeprefix(f"{program}: ") for line in stderr.splitlines() if "note: this model" in line]

    native = subprocess.run([str(sdqes_run_on_the_cpu), str(trained), "--source", video, "--max-frames", "3"],
                            capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    assert run(["run", str(trained), "--source", video, "--max-frames", "3", "--quiet"]) == 0
    python = notes(capsys.readouterr().err, "sdqes-edge")
    assert python == ["note: this model was trained on synthetic scenes (coloured squares, rolling balls, a door and "
                      "a lamp drawn by `sdqes-edge synth`), 120 training streams only; on other footage its alerts "
                      "mean little"]
    assert notes(native.stderr, "sdqes-run") == python
    plain = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--max-frames", "3"],
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and not notes(plain.stderr, "sdqes-run")  # a model of the user's own


def test_both_runtimes_warn_of_a_presets_random_weights_in_the_same_words(sdqes_run_on_the_cpu, video, tmp_path,
                                                                          capfd):
    """`sdqes-edge --help` starts a user with `export --preset tiny ... | run`: that bundle alerted at random, and
    neither runtime said so."""
    from native_fixtures import CApi

    bundle = tmp_path / "preset"
    assert run(["export", "--preset", "tiny", "--adapter", "qrnn", "--fps", "5", "--query", "When I cook",
                "--out", str(bundle), "--quiet"]) == 0
    capfd.readouterr()

    def warned(stderr: str, program: str) -> list[str]:
        return [line.removeprefix(f"{program}: ") for line in stderr.splitlines() if "random weights" in line]

    assert run(["run", str(bundle), "--source", video, "--max-frames", "2", "--quiet"]) == 0
    python = warned(capfd.readouterr().err, "sdqes-edge")
    assert python == ["warning: this bundle's model has random weights (exported from preset tiny+qrnn, seed 0, to "
                      "measure speed): its scores and alerts mean nothing; export a trained model to alert on "
                      "(sdqes-edge export --checkpoint CHECKPOINT --out BUNDLE)"]
    native = subprocess.run([str(sdqes_run_on_the_cpu), str(bundle), "--source", video, "--max-frames", "2"],
                            capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    assert warned(native.stderr, "sdqes-run") == python
    api = CApi(sdqes_run_on_the_cpu.parent / "libsdqes.so")  # a C caller hears it as the bundle opens
    handle = api.bundle_open(str(bundle).encode(), api.error, len(api.error))
    assert handle, api.said()
    assert warned(capfd.readouterr().err, "sdqes") == python
    api.bundle_close(handle)
