"""sdqes-run notes what its bundle's model was trained on, in `sdqes-edge run`'s words: the demo's model, trained
on synthetic scenes, deployed by the native runtime on real footage alerted with no word of it."""

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
