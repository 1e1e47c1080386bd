"""A bundle written by an earlier version of the format code still loads and gives the same numbers.

``tests/vectors/format1_bundle`` is the demo bundle as shipped until the demo model was retrained for int8, exported
before the contract module existed (format version 1).
``tests/vectors/demo_bundle_format1_outputs.json`` holds what the runtime computed from it with the code
that wrote it (commit named in the file): probabilities for two queries over a stream with the state
carried, the last embedding, and every final state tensor. Re-record only when the bundle itself changes:
``python tests/test_bundle_compatibility.py --record``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
FORMAT1_BUNDLE = REPO_ROOT / "tests" / "vectors" / "format1_bundle"
RECORDED = REPO_ROOT / "tests" / "vectors" / "demo_bundle_format1_outputs.json"
QUERIES = ("I start cooking", "I wash my hands")
FRAMES = 24


def stream_outputs(bundle: Path, work: Path) -> dict:
    """Run the bundle over a seeded stream of frames through the public detector API; everything it gives."""
    from sdqes_edge.runtime.detector import StreamingDetector
    from sdqes_edge.runtime.sinks import Sink
    from sdqes_edge.runtime.sources import Frame

    probabilities: list[list[float]] = []

    class Probabilities(Sink):
        def on_frame(self, stream, frame_bgr, time_s, probs, events):
            probabilities.append([probs[qid] for qid in sorted(probs)])

    detector = StreamingDetector(bundle)
    for text in QUERIES:
        detector.add_query(text)
    detector.add_sink(Probabilities())
    rng = np.random.default_rng(7)
    for index in range(FRAMES):
        image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        detector.step([Frame(image=image, time=float(index), index=index)])
    with np.load(detector.save_state(work / "state.npz")) as saved:
        state = {key[len("state/"):]: saved[key] for key in saved.files if key.startswith("state/")}
    return {"batch": detector.batch, "fps": detector.fps, "state_names": list(state),
            "probabilities": probabilities, "last_embedding": detector.last_embeddings[0].tolist(),
            "final_state": {name: value.ravel().tolist() for name, value in state.items()}}


def test_a_bundle_written_by_the_format_1_code_loads_and_gives_the_recorded_numbers(tmp_path):
    recorded = json.loads(RECORDED.read_text())
    assert json.loads((FORMAT1_BUNDLE / "manifest.json").read_text())["format_version"] == 1
    now = stream_outputs(FORMAT1_BUNDLE, tmp_path)
    assert (now["batch"], now["fps"], now["state_names"]) == (recorded["batch"], recorded["fps"],
                                                              recorded["state_names"])
    np.testing.assert_allclose(now["probabilities"], recorded["probabilities"], atol=1e-6)
    np.testing.assert_allclose(now["last_embedding"], recorded["last_embedding"], atol=1e-5)
    # The state holds values up to ~40 after 24 frames: fp32 rounding differs between CPUs' kernels (AVX2 against
    # AVX-512) by a few ulp of each value, so the bound is relative as well as absolute.
    for name, values in recorded["final_state"].items():
        np.testing.assert_allclose(now["final_state"][name], values, rtol=1e-5, atol=1e-5, err_msg=name)


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                            text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        outputs = stream_outputs(FORMAT1_BUNDLE, Path(scratch))
    RECORDED.write_text(json.dumps({"recorded_with_commit": commit, **outputs}) + "\n")
    print(f"wrote {RECORDED}")
