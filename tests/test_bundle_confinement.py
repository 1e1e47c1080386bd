"""A bundle is someone else's data: nothing in it makes us read a file outside it, including the weights an
ONNX graph keeps in another file (external data), which ONNX Runtime before 1.24 and TensorRT's parser open
wherever the graph says."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import random_model
from onnx import helper, numpy_helper

from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.runtime.bundle import BundleError, load_bundle
from sdqes_edge.runtime.graph_files import TENSOR_HOLDERS, external_data_locations
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.sample import sample_frames

STEP = "step.fp32.onnx"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("confinement") / "bundle"
    export_bundle(random_model("qrnn"), out, ExportOptions(show_progress=False), log=lambda m: None)
    return out


def _external(tensor: onnx.TensorProto, location: str) -> bytes:
    """Make ``tensor`` keep its bytes at ``location`` -> those bytes."""
    data = numpy_helper.to_array(tensor).tobytes()
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return data


def _rehash(copy: Path, *names: str) -> None:
    """Record the sha256 of ``names`` in the manifest, as someone who made the bundle this way would."""
    manifest = json.loads((copy / "manifest.json").read_text())
    for name in names:
        content = (copy / name).read_bytes()
        manifest["files"][name] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _largest_initializer(graph: onnx.ModelProto) -> onnx.TensorProto:
    return max(graph.graph.initializer, key=lambda t: len(t.raw_data))


def plant(case: str, bundle: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of ``bundle`` whose step graph reads tensor bytes the way ``case`` says, with every sha256 in the
    manifest right -> (the copy, the file outside it holding the bytes, or the unlisted file inside)."""
    copy, secret = tmp_path / "bundle", tmp_path / "secret.bin"
    shutil.copytree(bundle, copy)
    graph = onnx.load(str(copy / STEP))
    if case == "constant node":  # a tensor inside a node's attribute, not an initializer
        value = helper.make_tensor("c", onnx.TensorProto.FLOAT, [4], np.arange(4, dtype=np.float32))
        graph.graph.node.append(helper.make_node("Constant", [], ["unused"], value=value))
        tensor, location = graph.graph.node[-1].attribute[0].t, "../secret.bin"
    else:
        tensor = _largest_initializer(graph)
        location = {"parent folder": "../secret.bin", "absolute path": str(secret), "symlink leading out": "w.bin",
                    "file of the bundle the manifest does not list": "w.bin"}[case]
    secret.write_bytes(_external(tensor, location))
    if case == "symlink leading out":
        (copy / "w.bin").symlink_to(secret)
    if case == "file of the bundle the manifest does not list":
        secret = copy / "w.bin"
        shutil.move(tmp_path / "secret.bin", secret)
    (copy / STEP).write_bytes(graph.SerializeToString())
    _rehash(copy, STEP)
    return copy, secret


CASES = ["parent folder", "absolute path", "symlink leading out", "file of the bundle the manifest does not list",
         "constant node"]


@pytest.mark.parametrize("case", CASES)
def test_a_graph_reading_tensor_data_from_outside_the_bundles_listed_files_is_refused_by_the_loader(
        case, bundle, tmp_path):
    copy, _ = plant(case, bundle, tmp_path)
    with pytest.raises(BundleError, match=f"{STEP} reads tensor data from .*which is not a file of the bundle "
                                          "listed in manifest.json") as refused:
        load_bundle(copy)
    assert "\n" not in str(refused.value)


def test_run_refuses_such_a_bundle_in_one_line_before_any_library_opens_the_graph(bundle, tmp_path):
    copy, secret = plant("parent folder", bundle, tmp_path)
    video = tmp_path / "clip.avi"
    import cv2

    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 5.0, (160, 120))
    for frame in sample_frames(5, 120, 160):
        writer.write(frame)
    writer.release()
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(copy), "--source", str(video),
                           "--query", "a door opens", "--quiet"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "reads tensor data from '../secret.bin'" in done.stderr
    assert "ONNX Runtime" not in done.stderr  # refused by the loader, not by whichever ORT is installed


def test_external_data_the_manifest_lists_with_its_sha256_loads_and_steps_as_the_graph_did(bundle, tmp_path):
    """What the rule allows: a graph whose weights sit in a listed, hashed file of the bundle (a model past
    protobuf's 2 GB would need it)."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    graph = onnx.load(str(copy / STEP))
    (copy / "step.fp32.weights").write_bytes(_external(_largest_initializer(graph), "step.fp32.weights"))
    (copy / STEP).write_bytes(graph.SerializeToString())
    _rehash(copy, STEP, "step.fp32.weights")
    assert external_data_locations(copy / STEP) == ["step.fp32.weights"]
    loaded = load_bundle(copy)
    original, moved = OnnxRuntimeStep(bundle / STEP), OnnxRuntimeStep(loaded.step_graph())
    frames = Preprocessor.from_description(loaded.image_size, loaded.manifest["preprocess"]).batch(sample_frames(8))
    states = [original.initial_state(), moved.initial_state()]
    for frame in frames[:, None]:  # [8, 1, 3, R, R]
        a, b = original.step(frame, states[0]), moved.step(frame, states[1])
        np.testing.assert_array_equal(a.embedding, b.embedding)
        states = [a.state, b.state]
    for name in states[0]:
        np.testing.assert_array_equal(states[0][name], states[1][name])


def test_the_exporter_writes_no_external_data(bundle):
    assert [name for name in json.loads((bundle / "manifest.json").read_text())["files"]
            if name.endswith(".onnx") and external_data_locations(bundle / name)] == []


def test_the_tensor_holders_the_reader_enters_are_every_path_to_a_tensor_in_onnxs_schema():
    """The wire-format reader enters only the messages that can hold a tensor; derived here from onnx's own
    descriptors, so a field onnx adds that can hold one fails this test."""
    root = onnx.ModelProto.DESCRIPTOR
    reaches: dict[str, bool] = {}

    def holds_tensor(message, seen=()) -> bool:
        if message.full_name == "onnx.TensorProto":
            return True
        if message.full_name in seen:
            return reaches.get(message.full_name, False)
        found = False
        for field in message.fields:
            if field.message_type is not None and holds_tensor(field.message_type, (*seen, message.full_name)):
                found = True
        reaches[message.full_name] = reaches.get(message.full_name, False) or found
        return reaches[message.full_name]

    holds_tensor(root)
    derived: dict[str, dict[int, str]] = {}
    pending, visited = [root], set()
    while pending:
        message = pending.pop()
        if message.name in visited or message.full_name == "onnx.TensorProto":
            continue
        visited.add(message.name)
        for field in message.fields:
            target = field.message_type
            if target is not None and (target.full_name == "onnx.TensorProto" or reaches.get(target.full_name)):
                derived.setdefault(message.name, {})[field.number] = target.name
                pending.append(target)
    assert derived == TENSOR_HOLDERS



def test_a_listed_graph_that_is_not_protobuf_is_refused_in_one_line(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    (copy / STEP).write_bytes(b"stub of a graph, hashed but not a graph")
    _rehash(copy, STEP)
    with pytest.raises(BundleError, match=f"{STEP} is not an ONNX graph") as refused:
        load_bundle(copy)
    assert "\n" not in str(refused.value)


def _length_field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (tag, varint length, payload)."""
    head = bytearray()
    for value in (number << 3 | 2, len(payload)):
        while value >= 0x80:
            head.append(value & 0x7F | 0x80)
            value >>= 7
        head.append(value)
    return bytes(head) + payload


def test_a_graph_whose_subgraphs_nest_past_protobufs_limit_is_refused_in_one_line(bundle, tmp_path):
    """The reader walks the messages that can hold a tensor by recursion: 3,000 nested subgraphs (30 KB, ModelProto
    -> GraphProto -> NodeProto -> AttributeProto -> GraphProto ...) were a RecursionError. No library reads messages
    nested past protobuf's own limit of 100, and neither does this."""
    graph = b""
    for _ in range(3000):
        graph = _length_field(1, _length_field(5, _length_field(6, graph)))  # node -> attribute -> its graph
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    (copy / STEP).write_bytes(_length_field(7, graph))
    _rehash(copy, STEP)
    with pytest.raises(BundleError, match=f"{STEP} is not an ONNX graph [(]messages nested deeper than protobuf's "
                                          "limit of 100[)]"):
        load_bundle(copy)


@pytest.mark.parametrize("name", ["manifest.json", "training.json", "engines"])
def test_a_name_the_runtime_looks_for_itself_is_not_followed_out_of_the_bundle_by_a_symlink(name, bundle, tmp_path):
    """The manifest, the training record and the engines folder are found by their names, not through the
    manifest: a symlink in their place led the loader to read the file it points to, wherever that was."""
    from sdqes_edge.contract import ENGINES_FOLDER, TRAINING_RECORD_NAME
    from sdqes_edge.runtime.tensorrt_backend import DeviceInfo, find_engine

    name = {"training.json": TRAINING_RECORD_NAME, "engines": ENGINES_FOLDER}.get(name, name)
    copy, outside = tmp_path / "bundle", tmp_path / "outside"
    shutil.copytree(bundle, copy)
    outside.mkdir()
    if name == "manifest.json":
        shutil.move(copy / name, outside / name)
    elif name == TRAINING_RECORD_NAME:
        (outside / name).write_text(json.dumps({"steps": 1}))
    else:
        (outside / "jetson-orin-sm87-trt10.3.0").mkdir()
    (copy / name).symlink_to(outside / name if name != ENGINES_FOLDER else outside)
    with pytest.raises(BundleError, match=f"/bundle/{name}.* leads outside the bundle through a symlink; nothing "
                                          "outside a bundle is read") as refused:
        if name == "manifest.json":
            load_bundle(copy)
        elif name == TRAINING_RECORD_NAME:
            load_bundle(copy).training_record
        else:
            find_engine(load_bundle(copy), "fp16", DeviceInfo("Orin", (8, 7), "10.3.0"))
    assert "\n" not in str(refused.value)


def test_build_engine_writes_nothing_through_an_engines_folder_that_is_a_symlink_out(bundle, tmp_path):
    """It probed the folder with a file of its own and then kept its engine and timing cache there: outside."""
    from sdqes_edge.contract import ENGINES_FOLDER
    from sdqes_edge.export.tensorrt_engine import build_engine

    copy, outside = tmp_path / "bundle", tmp_path / "outside"
    shutil.copytree(bundle, copy)
    outside.mkdir()
    (copy / ENGINES_FOLDER).symlink_to(outside)
    with pytest.raises(BundleError, match=f"{ENGINES_FOLDER} leads outside the bundle through a symlink"):
        build_engine(copy, log=lambda m: None)  # refused before it looks for a GPU
    assert list(outside.iterdir()) == []
