"""JSON that others give us (a bundle's manifest, queries and graph descriptions, a queries file, a model config) is
refused in one line whatever it holds. Python's json reads nesting by recursion, and a file of a hundred thousand
``[`` raised RecursionError, which no reader caught: a traceback where every other damaged file is one line. A
graph's own description was read with no refusal at all, and a schema refusal quoted the value it refused whole."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from sdqes_edge.contract import METADATA_KEY
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.files import file_sha256, parse_json
from sdqes_edge.model_configs import read_model_config
from sdqes_edge.runtime.bundle import BundleError, load_bundle
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

DEEP = 100_000  # far past Python's recursion limit of 1,000
TOO_DEEP = "[" * DEEP + "]" * DEEP
NESTED_TOO_DEEP = "nested deeper than the thousand or so levels Python reads"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sdqes_edge.cli", *args], capture_output=True, text=True)


def one_line_refusal(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    return done.stderr


def demo_copy(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO_BUNDLE, bundle)
    return bundle


def relisted(bundle: Path, name: str) -> None:
    """The manifest made to list ``name`` as it now is, as a bundle made that way would."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": (bundle / name).stat().st_size, "sha256": file_sha256(bundle / name)}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_json_nested_past_the_recursion_limit_is_refused_as_text_that_is_not_json():
    with pytest.raises(ValueError, match=NESTED_TOO_DEEP):
        parse_json(TOO_DEEP)
    assert parse_json("[" * 100 + "]" * 100) == json.loads("[" * 100 + "]" * 100)


def test_a_manifest_nested_too_deep_is_refused_in_one_line(tmp_path):
    bundle = demo_copy(tmp_path)
    manifest = (bundle / "manifest.json").read_text()
    (bundle / "manifest.json").write_text(manifest.rstrip()[:-1] + f', "extra": {TOO_DEEP}}}')
    with pytest.raises(BundleError, match=f"manifest.json is not valid JSON [(]{NESTED_TOO_DEEP}[)]; re-export"):
        load_bundle(bundle)
    assert "not valid JSON" in one_line_refusal(run_cli("inspect", str(bundle)))


def test_a_schema_refusal_quotes_no_more_of_the_value_than_a_line_holds(tmp_path):
    bundle = demo_copy(tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["fps"] = "1" * 1_000_000
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="malformed at fps: '1+ [.][.][.] 1+' is not of type 'number'") as no:
        load_bundle(bundle)
    assert len(str(no.value).replace(str(bundle), "B")) < 400  # a million characters before


def test_a_queries_file_nested_too_deep_is_refused_in_one_line(tmp_path):
    queries = tmp_path / "queries.json"
    queries.write_text(TOO_DEEP)
    refusal = one_line_refusal(run_cli("run", str(DEMO_BUNDLE), "--source", str(tmp_path / "none.mp4"),
                                       "--queries", str(queries)))
    assert f"{queries} is not valid JSON ({NESTED_TOO_DEEP})" in refusal


@pytest.mark.parametrize("description, says", [
    ("{", "description is not valid JSON"),
    (TOO_DEEP, f"description is not valid JSON [(]{NESTED_TOO_DEEP}[)]"),
    ('["state"]', "description is not the one `sdqes-edge export` writes"),
    ('{"kind": "step"}', "description is not the one `sdqes-edge export` writes"),
])
def test_a_step_graph_whose_description_is_not_ours_is_refused_in_one_line(description, says, tmp_path):
    bundle = demo_copy(tmp_path)
    graph = onnx.load(str(bundle / "step.fp32.onnx"))
    next(p for p in graph.metadata_props if p.key == METADATA_KEY).value = description
    onnx.save(graph, str(bundle / "step.fp32.onnx"))
    with pytest.raises(UserError, match=f"step.fp32.onnx's '{METADATA_KEY}' {says}.*; re-export it$"):
        OnnxRuntimeStep(bundle / "step.fp32.onnx")
    relisted(bundle, "step.fp32.onnx")  # a bundle made so, its hashes whole
    refusal = one_line_refusal(run_cli("run", str(bundle), "--source", str(DEMO_BUNDLE / "manifest.json"),
                                       "--query", "when I start cooking"))
    assert f"'{METADATA_KEY}' description is" in refusal


def test_a_bundles_queries_nested_too_deep_are_refused_naming_them(tmp_path):
    bundle = demo_copy(tmp_path)
    (bundle / "queries.json").write_text(TOO_DEEP)
    (bundle / "query_embeddings.npy").write_bytes((DEMO_BUNDLE / "step.fp32.onnx").read_bytes()[:0])
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["queries"] = {"count": 1, "file": "queries.json", "embeddings": "query_embeddings.npy"}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    for name in ("queries.json", "query_embeddings.npy"):
        relisted(bundle, name)
    with pytest.raises(BundleError, match=f"pre-encoded queries of .* are unusable [(]{NESTED_TOO_DEEP}[)]"):
        load_bundle(bundle)


def test_a_model_config_nested_too_deep_is_refused_naming_it(tmp_path):
    config = tmp_path / "open_clip_config.json"
    config.write_text('{"model_cfg": ' + TOO_DEEP + "}")
    with pytest.raises(UserError, match=f"{config} is neither an open_clip model config .*{NESTED_TOO_DEEP}"):
        read_model_config(config)


def test_a_training_record_nested_too_deep_is_no_record(tmp_path):
    bundle = demo_copy(tmp_path)
    (bundle / "training_record.json").write_text(TOO_DEEP)
    relisted(bundle, "training_record.json")
    assert load_bundle(bundle).training_record is None
