"""What a model writes belongs to that model. State snapshots (`run --save-state` / `--resume`) resume it at any
precision, and a snapshot of another model whose state has the same shapes is refused rather than taken silently;
each query's alert state comes back to the query of its text and its alert policy.
Score traces name their model, so `eval --write-threshold` never calibrates one model's bundle on another's scores.
Exports of a preset are repeatable: the same --seed gives the same weights."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from runtime_fixtures import FPS, QUERY, write_video

from sdqes_edge.annotations import REQUIRED_COLUMNS
from sdqes_edge.cli import run
from sdqes_edge.errors import UserError
from sdqes_edge.files import file_sha256
from sdqes_edge.runtime.bundle import load_bundle
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.sources import VideoFileSource
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores


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


@pytest.mark.filterwarnings("ignore::sdqes_edge.runtime.onnxruntime_backend.SlowPrecisionWarning")  # fp16 on a CPU
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


def test_a_state_file_of_a_model_exported_anew_is_set_aside_and_the_service_starts_fresh(two_models, tmp_path,
                                                                                        capsys):
    """A service's `run --state S` whose bundle was exported anew was refused at every restart (exit 2, which its
    unit rightly does not restart) until someone deleted S. S is renamed aside now, kept whole, with a warning, and
    the new model starts the file afresh; `--resume S`, which asks for that snapshot, still refuses it."""
    bundles, _ = two_models
    video = write_video(tmp_path / "clip.avi", sample_frames(20, 96, 128))
    state = tmp_path / "state.npz"
    command = ["--source", str(video), "--query", QUERY, "--quiet"]
    assert run(["run", str(bundles["seed1"]), *command, "--state", str(state)]) == 0
    old, frames = state.read_bytes(), int(np.load(state)["frame_counts"][0])
    assert run(["run", str(bundles["seed0"]), *command, "--resume", str(state)]) == 2
    assert "was saved by another model" in capsys.readouterr().err
    assert run(["run", str(bundles["seed0"]), *command, "--state", str(state)]) == 0  # the model updated
    [kept] = tmp_path.glob("state.unusable-*.npz")
    assert f"--state {state} was saved by another model" in capsys.readouterr().err
    assert kept.read_bytes() == old
    with np.load(state) as written:  # the new model's, the file streamed from its start once
        assert str(written["model_identity"]) == load_bundle(bundles["seed0"]).model_identity
        assert int(written["frame_counts"][0]) == frames


def test_a_damaged_state_file_is_set_aside_and_the_service_starts_fresh(two_models, tmp_path, capsys):
    bundles, _ = two_models
    video = write_video(tmp_path / "clip.avi", sample_frames(20, 96, 128))
    state = tmp_path / "state.npz"
    state.write_bytes(b"PK\x03\x04 cut short by a power loss")
    assert run(["run", str(bundles["seed0"]), "--source", str(video), "--query", QUERY, "--quiet",
                "--state", str(state)]) == 0
    [kept] = tmp_path.glob("state.unusable-*.npz")
    assert kept.read_bytes() == b"PK\x03\x04 cut short by a power loss"
    assert f"that file is kept as {kept}" in capsys.readouterr().err
    StreamingDetector(bundles["seed0"]).load_state(state)  # the fresh run's snapshot


def test_a_snapshot_written_before_snapshots_named_their_model_still_loads_on_its_shapes(two_models, tmp_path):
    bundles, frames = two_models
    detector = StreamingDetector(bundles["seed0"])
    detector.step([frames[0]])
    with np.load(detector.save_state(tmp_path / "new.npz")) as saved:
        older = {key: saved[key] for key in saved.files if key != "model_identity"}
    np.savez(tmp_path / "older.npz", **older)
    StreamingDetector(bundles["seed1"]).load_state(tmp_path / "older.npz")  # nothing to tell the models apart


def test_score_traces_name_their_model_and_a_threshold_is_never_calibrated_on_another_models(two_models, tmp_path,
                                                                                            capsys):
    bundles, _ = two_models
    video = write_video(tmp_path / "v1.avi", sample_frames(60, 96, 128))
    annotations = tmp_path / "a.csv"
    with annotations.open("w", newline="") as fh:  # the query holds a comma: quoted by the csv module
        csv.writer(fh).writerows([REQUIRED_COLUMNS, ("val", "moments", "v1", QUERY, "Wash!", "cook", 4.0, 10, 60)])
    for name in ("seed0", "seed1"):
        assert run(["run", str(bundles[name]), "--source", str(video), "--query", QUERY, "--quiet",
                    "--scores", str(tmp_path / name / "v1.npz")]) == 0
        assert load_scores(tmp_path / name / "v1.npz").model == load_bundle(bundles[name]).model_identity
    manifest = (bundles["seed0"] / "manifest.json").read_bytes()
    calibrate = ["eval", "--annotations", str(annotations), "--calibrate", "--plots", "0", "--out", str(tmp_path / "r")]
    capsys.readouterr()
    assert run([*calibrate, "--scores", str(tmp_path / "seed1"), "--write-threshold", str(bundles["seed0"])]) == 2
    assert "scored by another model than" in capsys.readouterr().err
    assert (bundles["seed0"] / "manifest.json").read_bytes() == manifest
    (tmp_path / "seed1" / "v1.npz").rename(tmp_path / "seed0" / "v2.npz")
    assert run([*calibrate, "--scores", str(tmp_path / "seed0")]) == 2
    assert "scored by 2 different models" in capsys.readouterr().err


def test_one_query_asked_under_two_alert_policies_resumes_each_with_its_own_alert_state(two_models, tmp_path):
    """An early warning (low threshold, one alert) and a confirmation (high threshold) of one text: the snapshot
    kept one state per text, so on resume both took the confirmation's, and the early warning, which had already
    raised its one alert, raised it again."""
    bundles, frames = two_models
    text = "I start cooking"
    early, confirmed = dict(threshold=0.01, max_alerts=1), dict(threshold=0.99)
    detector = StreamingDetector(bundles["seed0"])
    warning, _ = detector.add_query(text, **early), detector.add_query(text, **confirmed)
    raised = [alert.query_id for frame in frames[:6] for alert in detector.step([frame])[0]]
    assert raised == [warning.id]
    snapshot = detector.save_state(tmp_path / "state.npz")
    resumed = StreamingDetector(bundles["seed0"])
    resumed.add_query(text, **confirmed)  # asked again in another order: matched by policy, not by position
    resumed.add_query(text, **early)
    resumed.load_state(snapshot)
    assert [alert for frame in frames[6:] for alert in resumed.step([frame])[0]] == []
    retuned = StreamingDetector(bundles["seed0"])
    retuned.add_query(text, threshold=0.02, max_alerts=1)  # a policy the snapshot does not hold, of a text it holds
    retuned.load_state(snapshot)  # twice: which one it was is unknown, so it starts afresh
    assert len([alert for frame in frames[6:] for alert in retuned.step([frame])[0]]) == 1


def test_a_snapshot_written_before_alert_policies_were_kept_restores_each_alert_state_by_its_text(two_models,
                                                                                                  tmp_path):
    bundles, frames = two_models
    detector = StreamingDetector(bundles["seed0"])
    detector.add_query(QUERY, threshold=0.01, max_alerts=1)
    assert len(detector.step([frames[0]])[0]) == 1
    with np.load(detector.save_state(tmp_path / "new.npz")) as saved:
        older = {key: saved[key] for key in saved.files if key != "alert_policies"}
    np.savez(tmp_path / "older.npz", **older)
    resumed = StreamingDetector(bundles["seed0"])
    resumed.add_query(QUERY, threshold=0.01, max_alerts=1)
    resumed.load_state(tmp_path / "older.npz")
    assert [alert for frame in frames[1:6] for alert in resumed.step([frame])[0]] == []  # its one alert kept


def test_a_score_trace_given_as_a_snapshot_is_named_as_another_archive_with_the_fix(two_models, tmp_path):
    """`--resume scores.npz` (the run's trace, not its snapshot) was told of a missing 'frame_counts'."""
    from sdqes_edge.traces import StreamScores, save_scores

    bundles, _ = two_models
    trace = save_scores(tmp_path / "scores.npz", StreamScores("clip", FPS, [QUERY], ["0"], np.zeros(1),
                                                              np.zeros((5, 1))))
    with pytest.raises(UserError, match=r"scores.npz is a NumPy archive but not a state snapshot written by "
                                        r"save_state \(a score trace from --scores.*\); give the file save_state "
                                        r"\(run --save-state\) wrote$"):
        StreamingDetector(bundles["seed0"]).load_state(trace)


@pytest.mark.parametrize("io_binding", [False, True], ids=["plain", "bound"])
def test_a_state_to_load_that_is_not_this_graphs_is_refused_naming_the_tensor(step_graphs, io_binding):
    """A tensor missing was a KeyError, one of another batch a reshape error (on TensorRT a copy past its buffer)."""
    paths, _ = step_graphs
    runner = OnnxRuntimeStep(paths[1], io_binding=io_binding)
    state = runner.state_to_numpy(runner.initial_state())
    name = next(iter(state))
    with pytest.raises(UserError, match=f"state_from_numpy: no '{name}'; give every state tensor by name"):
        runner.state_from_numpy({k: v for k, v in state.items() if k != name})
    wider = dict(state, **{name: np.concatenate([state[name]] * 4)})  # four streams' rows for one stream
    with pytest.raises(UserError, match=rf"state_from_numpy: {name} is \[4, .*but this graph's is \[1, "):
        runner.state_from_numpy(wider)
    runner.state_from_numpy(state)  # what state_to_numpy gave loads
