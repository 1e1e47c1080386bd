"""A bundle's manifest carries no hash, and the runtimes build the frame, the batch and the query input from it.
Each step graph describes its own shapes and normalization in its metadata (hashed with the graph), so a manifest
edited or damaged after export is refused in one line naming the field, before any library opens the graph: it
failed deep in ONNX Runtime ("Got invalid dimensions for input"), or, for the normalization, not at all. The fps
is the rate to stream at and stays the user's to change.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from sdqes_edge.contract import MAX_FPS, METADATA_KEY
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.runtime.bundle import BundleError, load_bundle
from sdqes_edge.runtime.graph_files import metadata_props


def edited(tmp_path, change) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO_BUNDLE, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def test_the_metadata_is_read_as_onnx_reads_it_without_the_onnx_package():
    graph = DEMO_BUNDLE / "step.fp32.onnx"
    assert metadata_props(graph) == {p.key: p.value for p in onnx.load(str(graph), load_external_data=False)
                                     .metadata_props}
    assert json.loads(metadata_props(graph)[METADATA_KEY])["image_size"] == 64


@pytest.mark.parametrize("field, value, says", [
    ("image_size", 224, "says image_size 224, but step.fp32.onnx was exported with 64"),
    ("batch", 4, "says batch 4, but step.fp32.onnx was exported with 1"),
    ("embed_dim", 512, "says embed_dim 512, but step.fp32.onnx was exported with"),
    ("query_count", 3, "says query_count 3, but step.fp32.onnx was exported with None"),
])
def test_a_manifest_whose_shapes_disagree_with_its_graph_is_refused_naming_the_field(field, value, says, tmp_path):
    bundle = edited(tmp_path, lambda m: m.update({field: value}))
    with pytest.raises(BundleError, match=f"^manifest.json of {bundle} {says}"):
        load_bundle(bundle)


def test_a_manifest_with_another_normalization_than_its_graph_is_refused_rather_than_streamed(tmp_path):
    bundle = edited(tmp_path, lambda m: m["preprocess"].update(mean=[0.5, 0.5, 0.5]))
    with pytest.raises(BundleError, match="says another preprocess than step.fp32.onnx was exported with: the "
                                          "manifest was edited or damaged after export; restore it, or re-export"):
        load_bundle(bundle)


def test_the_rate_to_stream_at_may_be_changed(tmp_path):
    assert load_bundle(edited(tmp_path, lambda m: m.update(fps=2.0))).fps == 2.0


@pytest.mark.parametrize("fps, says", [
    (0, "0 is less than or equal to the minimum of 0"),
    (1e300, "1e[+]300 is greater than the maximum of 1000"),  # stepped the video's first frame without end
])
def test_a_rate_no_camera_gives_is_refused_saying_where_to_set_it(fps, says, tmp_path):
    bundle = edited(tmp_path, lambda m: m.update(fps=fps))
    with pytest.raises(BundleError, match=f"manifest.json is malformed at fps: {says}; set it there, or re-export"):
        load_bundle(bundle)
    assert load_bundle(edited(tmp_path / "fastest", lambda m: m.update(fps=MAX_FPS))).fps == MAX_FPS


def test_run_refuses_such_a_bundle_in_one_line_before_the_first_frame(tmp_path):
    bundle = edited(tmp_path, lambda m: m.update(image_size=224))
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", "0",
                           "--query", "when I start cooking"], capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "says image_size 224, but step.fp32.onnx was exported with 64" in done.stderr


def test_inspect_shows_a_manifests_control_characters_rather_than_obeying_them(tmp_path):
    """The model name and tool versions are someone else's words: "\x1b[2K" in them erased inspect's line."""
    bundle = edited(tmp_path, lambda m: m["model"].update(name="tiny\x1b[2K\rclean bundle"))
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "inspect", str(bundle), "--frames", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "model      tiny\\x1b[2K\\rclean bundle, adapter" in done.stdout and "\x1b" not in done.stdout
