"""State snapshots (`run --save-state` / `--resume`) belong to one model: they resume it at any precision, and a
snapshot of another model whose state has the same shapes is refused rather than taken silently. Exports of a
preset are repeatable: the same --seed gives the same weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from runtime_fixtures import FPS, write_video

from sdqes_edge.cli import run
from sdqes_edge.errors import UserError
from sdqes_edge.files import file_sha256
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.runtime.sources import VideoFileSource
from sdqes_edge.sample import sample_frames


def export_preset(out: Path, *extra: str) -> Path:
    assert run(["export", "--preset", "tiny", "--adapter", "qrnn", "--fps", str(FPS), "--verify-frames", "16",
                "--drift-frames", "16", "--quiet", "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """Bundles of two models with the same shapes (seeds 0 and 1; the first twice, and with fp16), and frames."""
    root = tmp_path_factory.mktemp("snapshots")
    bundles = {"seed0": export_preset(root / "seed0", "--precision", "fp32", "fp16"),
               "seed0-again": export_preset(root / "seed0-again"),
               "seed1": export_preset(root / "seed1", "--seed", "1")}
    video = write_video(root / "clip.avi", sample_frames(30, 96, 128))
    return bundles, list(VideoFileSource(video, FPS).sampled())


def test_an_export_of_a_preset_is_repeated_exactly_by_its_seed(two_models):
    bundles, _ = two_models
    graph = "step.fp32.onnx"
    assert file_sha256(bundles["seed0"] / graph) == file_sha256(bundles["seed0-again"] / graph)
    assert file_sha256(bundles["seed0"] / graph) != file_sha256(bundles["seed1"] / graph)


def test_a_snapshot_resumes_its_model_at_another_precision_and_in_a_repeated_export(two_models, tmp_path):
    bundles, frames = two_models
    detector = StreamingDetector(bundles["seed0"])
    for frame in frames[:6]:
        detector.step([frame])
    snapshot = detector.save_state(tmp_path / "state.npz")
    detector.step([frames[6]])
    for bundle, precision, atol in ((bundles["seed0-again"], "fp32", 0.0), (bundles["seed0"], "fp16", 2e-2)):
        resumed = StreamingDetector(bundle, precision=precision)
        resumed.load_state(snapshot)
        resumed.step([frames[6]])
        np.testing.assert_allclose(resumed.last_embeddings, detector.last_embeddings, rtol=0, atol=atol)


def test_a_snapshot_of_another_model_with_the_same_shapes_is_refused(two_models, tmp_path):
    bundles, frames = two_models
    detector = StreamingDetector(bundles["seed1"])
    detector.step([frames[0]])
    snapshot = detector.save_state(tmp_path / "seed1.npz")
    with pytest.raises(UserError, match="was saved by another model") as refusal:
        StreamingDetector(bundles["seed0"]).load_state(snapshot)
    assert "start afresh without --resume" in str(refusal.value)


def test_a_snapshot_written_before_snapshots_named_their_model_still_loads_on_its_shapes(two_models, tmp_path):
    bundles, frames = two_models
    detector = StreamingDetector(bundles["seed0"])
    detector.step([frames[0]])
    with np.load(detector.save_state(tmp_path / "new.npz")) as saved:
        older = {key: saved[key] for key in saved.files if key != "model_identity"}
    np.savez(tmp_path / "older.npz", **older)
    StreamingDetector(bundles["seed1"]).load_state(tmp_path / "older.npz")  # nothing to tell the models apart
