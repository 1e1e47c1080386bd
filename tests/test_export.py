"""The export contract: a bundle's step graph computes what the model computes, with the state carried.

Every check streams frames through ONNX Runtime with the state fed back by
name and compares embeddings and every next-state tensor to PyTorch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import random_model

from sdqes_edge.config import ModelConfig
from sdqes_edge.contract import METADATA_KEY
from sdqes_edge.errors import UserError
from sdqes_edge.export import ExportOptions, Query, export_bundle
from sdqes_edge.export.drift import VerificationError
from sdqes_edge.export.verify import verify_step_graph
from sdqes_edge.runtime.bundle import BundleError, load_bundle
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.sample import sample_frames
from sdqes_edge.tolerances import FP32_EMBEDDING_ATOL, FP32_STATE_ATOL

KINDS = ["none", "mlp", "st", "qrnn", "retnet"]
STREAM_FRAMES = 32
QUIET = dict(show_progress=False)


def quiet_export(model, out, **options):
    return export_bundle(model, out, ExportOptions(**QUIET, **options), log=lambda m: None)


def stream_frames(model, count: int, batch: int = 1) -> np.ndarray:
    """[count, batch, 3, R, R] preprocessed frames of the sample clip."""
    cfg = model.cfg
    pre = Preprocessor.from_config(cfg)
    frames = pre.batch(sample_frames(count + batch))
    return np.stack([frames[b : b + count] for b in range(batch)], axis=1)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """One exported bundle per adapter kind (tiny preset, random adapters, 2 per block)."""
    root = tmp_path_factory.mktemp("bundles")
    made = {}
    for kind in KINDS:
        model = random_model(kind)
        made[kind] = (model, quiet_export(model, root / kind).out)
    return made


@pytest.mark.parametrize("kind", KINDS)
def test_onnx_step_matches_pytorch_over_32_frames_with_every_state_tensor(kind, bundles):
    model, out = bundles[kind]
    bundle = load_bundle(out)
    runner = OnnxRuntimeStep(bundle.step_graph("fp32"))
    frames = torch.from_numpy(stream_frames(model, STREAM_FRAMES))
    torch_state, onnx_state = model.init_state(1), runner.initial_state()
    for t in range(STREAM_FRAMES):
        with torch.no_grad():
            expected, torch_state = model.step(frames[t], torch_state)
        result = runner.step(frames[t].numpy(), onnx_state)
        assert np.abs(result.embedding - expected.numpy()).max() <= FP32_EMBEDDING_ATOL
        for name, tensor in zip(runner.spec.names, torch_state):
            assert np.abs(result.state[name] - tensor.numpy()).max() <= FP32_STATE_ATOL, (t, name)
        onnx_state = result.state
    if kind in ("st", "qrnn", "retnet"):
        assert any(np.abs(s).max() > 0 for s in onnx_state.values()), "the state never left its initial value"


@pytest.mark.parametrize("kind", KINDS)
def test_the_step_graph_follows_the_contract(kind, bundles):
    model, out = bundles[kind]
    graph = onnx.load(str(out / "step.fp32.onnx"))
    onnx.checker.check_model(graph, full_check=True)
    spec = model.state_spec(1)
    inputs = [i.name for i in graph.graph.input]
    outputs = [o.name for o in graph.graph.output]
    assert inputs == ["frame"] + [t.input_name for t in spec]
    assert outputs == ["embedding"] + [t.output_name for t in spec]
    state_shapes = {t.input_name: t.graph_shape for t in spec} | {t.output_name: t.graph_shape for t in spec}
    for value in list(graph.graph.input) + list(graph.graph.output):  # static shapes, streams on axis 0
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        assert all(d > 0 for d in dims), value.name
        if value.name in state_shapes:  # streams and tokens merged, stream-major: [B*L, ...]
            assert tuple(dims) == state_shapes[value.name], value.name
        else:
            assert dims[0] == 1, value.name
    assert "LayerNormalization" in {n.op_type for n in graph.graph.node}
    assert not {"If", "Loop", "Scan"} & {n.op_type for n in graph.graph.node}
    description = json.loads({p.key: p.value for p in graph.metadata_props}[METADATA_KEY])
    assert description["state"] == spec.to_list()
    assert ModelConfig.from_dict(description["model"]) == model.cfg


def test_a_bare_graph_describes_its_own_initial_state(bundles):
    model, out = bundles["qrnn"]
    lone = out.parent / "lone.onnx"
    shutil.copy(out / "step.fp32.onnx", lone)
    runner = OnnxRuntimeStep(lone)
    assert [s.shape for s in runner.initial_state().values()] == [t.shape for t in model.state_spec(1)]


def test_swapping_two_state_outputs_when_feeding_back_is_caught(bundles):
    model, out = bundles["qrnn"]
    runner = OnnxRuntimeStep(out / "step.fp32.onnx")
    same_shape = [n for n in runner.spec.names if n.endswith("qrnn0_h")][:2]

    def swapped(state):
        state = dict(state)
        state[same_shape[0]], state[same_shape[1]] = state[same_shape[1]], state[same_shape[0]]
        return state

    frames = stream_frames(model, 16)
    assert verify_step_graph(model, runner, frames).passed
    report = verify_step_graph(model, runner, frames, feedback=swapped)
    assert not report.passed
    assert report.max_state_error > FP32_STATE_ATOL


def test_batched_streams_and_fused_query_scoring(tmp_path):
    model = random_model("qrnn")
    queries = (Query("When I start cooking, remind me to wash my hands.", "Wash your hands."),
               Query("As I start to drink my beverage, remind me to check the shopping list.", "Check the list."))
    result = quiet_export(model, tmp_path / "b", batch=2, fuse_queries=True, queries=queries)
    bundle = load_bundle(result.out)
    names, embeddings = bundle.queries()
    assert [n["response"] for n in names] == ["Wash your hands.", "Check the list."]
    with torch.no_grad():
        np.testing.assert_allclose(embeddings, model.encode_text([q.text for q in queries]).numpy(), atol=1e-4)
    runner = OnnxRuntimeStep(bundle.step_graph())
    bound = OnnxRuntimeStep(bundle.step_graph(), io_binding=True)  # the GPU's path: queries in a bound buffer too
    frames = stream_frames(model, 20, batch=2)
    state, bound_state = runner.initial_state(), bound.initial_state()
    for t, frame in enumerate(frames):
        asked = embeddings if t < 10 else embeddings[::-1].copy()  # new query values reach the bound buffer
        step, bound_step = runner.step(frame, state, asked), bound.step(frame, bound_state, asked)
        np.testing.assert_allclose(step.logits, step.embedding @ asked.T, atol=1e-5)
        np.testing.assert_array_equal(bound_step.logits, step.logits)
        np.testing.assert_array_equal(bound_step.embedding, step.embedding)
        state, bound_state = step.state, bound_step.state
    assert step.logits.shape == (2, 2)
    assert result.verification.passed and result.verification.batch == 2
    # The TensorRT backends bind no query input: such a bundle is refused before any GPU is looked for.
    from sdqes_edge.export.tensorrt_engine import build_engine

    with pytest.raises(UserError, match="re-export without --fuse-queries"):
        build_engine(result.out, "fp16")


def test_fp16_and_int8_variants_are_measured_against_fp32_over_a_long_stream(tmp_path):
    model = random_model("qrnn")
    result = quiet_export(model, tmp_path / "v", precisions=("fp16", "int8"), drift_frames=500)
    reports = {r.precision: r for r in result.variants}
    assert set(reports) == {"fp16", "int8"}
    for precision, report in reports.items():
        assert report.frames == 500 and report.passed
        entry = result.manifest["graphs"]["step"][precision]["verification"]
        assert entry["min_cosine"] == report.min_cosine and entry["passed"]
    assert reports["fp16"].min_cosine > reports["int8"].min_cosine  # int8 loses more than fp16
    graph = onnx.load(str(tmp_path / "v" / "step.int8.onnx"))
    ops = {n.op_type for n in graph.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    zero_points = [onnx.numpy_helper.to_array(i) for i in graph.graph.initializer if i.name.endswith("zero_point")]
    weights = [z for z in zero_points if z.dtype == np.int8]  # activations are uint8 by default (test_int8.py)
    assert weights and all((z == 0).all() for z in weights)  # weights are always symmetric
    fp16 = onnx.load(str(tmp_path / "v" / "step.fp16.onnx"))
    inputs = {i.name: i.type.tensor_type.elem_type for i in fp16.graph.input}
    assert inputs.pop("frame") == onnx.TensorProto.FLOAT  # the frame in fp32, the state in fp16 (test_lean_step.py)
    assert set(inputs.values()) == {onnx.TensorProto.FLOAT16}
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in fp16.graph.initializer)


def test_a_failed_verification_leaves_the_existing_bundle_byte_for_byte(tmp_path, monkeypatch):
    from sdqes_edge.export import exporter

    out = tmp_path / "bundle"
    quiet_export(random_model("qrnn"), out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    trace = exporter._trace

    def traced_from_other_weights(model, *args, **kwargs):  # as a tracing bug would: the graph is not the model
        traced = trace(model, *args, **kwargs)
        with torch.no_grad():
            next(p for n, p in model.named_parameters() if ".adapter1." in n).mul_(2.0)
        return traced

    monkeypatch.setattr(exporter, "_trace", traced_from_other_weights)
    with pytest.raises(VerificationError, match="does not match the model"):
        quiet_export(random_model("qrnn", seed=1), out)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]  # no staging directory left behind


def test_export_refuses_to_overwrite_a_directory_that_is_not_a_bundle(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(UserError, match="not a bundle"):
        quiet_export(random_model("none"), tmp_path / "photos")


def test_export_refuses_a_folder_that_is_not_a_bundle_before_it_loads_the_checkpoint(tmp_path, capsys):
    """It loaded the checkpoint (a ViT-B/16 takes a while) and only then refused the folder."""
    from sdqes_edge.cli import run

    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "model.pt").write_bytes(b"\x00" * 64)  # loading it would fail: the folder must be refused first
    assert run(["export", "--checkpoint", str(tmp_path / "model.pt"), "--out", str(tmp_path / "photos")]) == 2
    out, err = capsys.readouterr()
    assert "is a non-empty directory that is not a bundle" in err and "checkpoint" not in err and out == ""


@pytest.mark.parametrize("damage, message", [
    (lambda b: (b / "step.fp32.onnx").write_bytes(b"\x08garbage"), "step.fp32.onnx does not match the sha256"),
    (lambda b: (b / "text.onnx").unlink(), "text.onnx is missing"),
    (lambda b: (b / "manifest.json").write_text("{"), "not valid JSON"),
    (lambda b: (b / "manifest.json").write_text((b / "manifest.json").read_text().replace('"fps": 1.0', '"fps": NaN')),
     "not valid JSON [(]NaN is not a JSON number[)]"),  # NaN passes the schema's "fps > 0": NaN <= 0 is false too
])
def test_the_loader_refuses_a_damaged_bundle_naming_the_file(damage, message, bundles, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(bundles["st"][1], copy)
    damage(copy)
    with pytest.raises(BundleError, match=message):
        load_bundle(copy)


def test_the_loader_refuses_a_manifest_whose_sha256_no_longer_matches(bundles, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(bundles["st"][1], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["text.onnx"]["sha256"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="text.onnx does not match the sha256"):
        load_bundle(copy)


def test_the_loader_refuses_state_wiring_that_disagrees_with_the_spec(bundles, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(bundles["qrnn"][1], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["state"] = manifest["state"][::-1]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="disagree with the state spec"):
        load_bundle(copy)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdqes_edge.cli", *args], capture_output=True, text=True)


def test_export_a_lightning_checkpoint_from_the_command_line_infers_everything(tmp_path):
    from test_checkpoints import lightning_checkpoint

    model = random_model("st")
    ckpt = lightning_checkpoint(model, str(tmp_path / "last.ckpt"))
    done = run_cli("export", "--checkpoint", ckpt, "--out", str(tmp_path / "b"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "exporting" not in done.stdout  # --quiet: no progress lines, only the result and what to run next
    assert done.stdout.splitlines()[-1].endswith(f"then: sdqes-edge run {tmp_path / 'b'} --source VIDEO --query TEXT")
    manifest = load_bundle(tmp_path / "b").manifest
    assert ModelConfig.from_dict(manifest["model"]).adapter == model.cfg.adapter
    assert manifest["checkpoint"]["source_format"] == "sdqes-lightning"
    inspected = run_cli("inspect", str(tmp_path / "b"))
    assert inspected.returncode == 0 and "match their sha256" in inspected.stdout
    # what to do next on this machine first: it has no engine to build unless it is an NVIDIA device
    assert inspected.stdout.splitlines()[-1].startswith(f"next: sdqes-edge run {tmp_path / 'b'} --source VIDEO")


def test_a_sigterm_during_export_removes_the_staging_and_keeps_the_old_bundle(tmp_path):
    out = tmp_path / "bundle"
    quiet_export(random_model("qrnn"), out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    process = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", "export", "--preset", "tiny", "--adapter",
                                "qrnn", "--out", str(out), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    staging = tmp_path / f".bundle.staging-{process.pid}"
    deadline = time.monotonic() + 120
    while not staging.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr and "interrupted (SIGTERM)" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_the_next_export_removes_staging_folders_of_exports_that_died(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".bundle.staging-{int(dead.stdout)}"
    (stale / "tokenizer").mkdir(parents=True)
    (stale / "step.fp32.onnx").write_bytes(b"half a graph")
    running = tmp_path / f".bundle.staging-{os.getppid()}"  # a live process: maybe a concurrent export
    running.mkdir()
    quiet_export(random_model("none"), tmp_path / "bundle")
    assert not stale.exists() and running.exists()


def test_a_corrupted_bundle_is_refused_by_the_command_line_in_one_line(bundles, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(bundles["mlp"][1], copy)
    with open(copy / "step.fp32.onnx", "ab") as fh:
        fh.write(b"\0")
    done = run_cli("inspect", str(copy))
    assert done.returncode == 2 and "step.fp32.onnx" in done.stderr and "Traceback" not in done.stderr


def test_a_device_without_torch_loads_and_steps_a_bundle(bundles):
    """What runs on the headset: the bundle loader, ONNX Runtime step and `inspect`, with torch unimportable."""
    _, out = bundles["retnet"]
    code = ("import sys; sys.modules['torch'] = None\n"
            "from sdqes_edge.runtime.bundle import load_bundle\n"
            "from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep\n"
            "from sdqes_edge.runtime.preprocess import Preprocessor\n"
            "from sdqes_edge.sample import sample_frames\n"
            f"b = load_bundle({str(out)!r})\n"
            "r = OnnxRuntimeStep(b.step_graph())\n"
            "pre = Preprocessor.from_description(b.image_size, b.manifest['preprocess'])\n"
            "s = r.initial_state()\n"
            "for f in pre.batch(sample_frames(4)): s = r.step(f[None], s).state\n"
            "from sdqes_edge.cli import run\n"
            f"sys.exit(run(['inspect', {str(out)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ran        8 sample frames" in done.stdout


def write_video(path: Path, frames: np.ndarray, fps: float = 5.0) -> Path:
    """A real video file made with OpenCV (MJPG in AVI: decodable wherever OpenCV is)."""
    import cv2

    height, width = frames.shape[1:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (width, height))
    assert writer.isOpened()
    for frame in frames:
        writer.write(frame)
    writer.release()
    return path


def test_int8_is_calibrated_on_frames_of_the_users_video(tmp_path):
    video = write_video(tmp_path / "kitchen.avi", sample_frames(40, seed=3))
    result = quiet_export(random_model("st"), tmp_path / "b", precisions=("int8",), drift_frames=64,
                          calibration_video=video, calibration_frames=24)
    assert [r.precision for r in result.variants] == ["int8"] and result.variants[0].passed
    # The drift check streamed the user's footage too, and the manifest says so.
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["graphs"]["step"]["int8"]["verification"]["frames_from"] == "kitchen.avi"


def test_an_unreadable_calibration_video_is_refused_before_anything_is_written(tmp_path):
    video = tmp_path / "broken.mp4"
    video.write_bytes(b"\x00" * 64)
    with pytest.raises(UserError, match="broken.mp4"):
        quiet_export(random_model("st"), tmp_path / "b", precisions=("int8",), calibration_video=video)
    assert not (tmp_path / "b").exists()


def test_export_options_that_do_not_apply_are_warned_on_stderr_as_the_commands_own_warnings(tmp_path, capsys):
    """They came on stdout, as "warning: ..." among the progress lines; and --seed with --checkpoint, which seeds
    only a preset's random weights, was dropped with no word."""
    from sdqes_edge.cli import run

    assert run(["export", "--preset", "tiny", "--calibration-frames", "10", "--vision-heads", "2", "--quiet", "--out",
                str(tmp_path / "preset")]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in out and err.splitlines() == [
        "sdqes-edge: warning: --vision-heads ignored with --preset (the preset fixes its head counts and activation)",
        "sdqes-edge: warning: --calibration-frames is only used for int8, which this export does not write; ignoring "
        "it (add --precision int8 to write it)"]
    torch.save(random_model("none").clip_state_dict(), tmp_path / "model.pt")
    assert run(["export", "--checkpoint", str(tmp_path / "model.pt"), "--seed", "3", "--quiet", "--out",
                str(tmp_path / "checkpoint")]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "sdqes-edge: warning: --seed is ignored with --checkpoint (it seeds a preset's random weights)"]
