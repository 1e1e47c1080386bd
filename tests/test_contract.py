"""The deployment contract is defined once (sdqes_edge/contract.py and its manifest schema file) and every
reader holds to it: no contract name is spelled anywhere else, and a manifest the schema refuses is refused
by the Python runtime and by the native one."""

from __future__ import annotations

import ast
import json

import pytest
from native_vectors import REQUIRED_PATHS, manifest_without
from source_tree import REPO, package_modules

from sdqes_edge import contract

CONTRACT_LITERALS = {
    contract.STATE_INPUT_PREFIX, contract.STATE_OUTPUT_PREFIX, contract.QUERY_INPUT, contract.EMBEDDING_OUTPUT,
    contract.LOGITS_OUTPUT, contract.TOKEN_INPUT, contract.QUERY_EMBEDDING_OUTPUT, contract.METADATA_KEY,
    contract.MANIFEST_NAME, contract.MANIFEST_SCHEMA_FILE, contract.BUNDLE_FORMAT, contract.TEXT_GRAPH_NAME,
    contract.QUERIES_NAME, contract.QUERY_EMBEDDINGS_NAME, contract.TRAINING_RECORD_NAME, contract.ENGINES_FOLDER,
    *contract.PRECISIONS,
}


def string_constants(tree: ast.Module):
    """(line, value) of every string constant in code; docstrings (prose about the contract) left out."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_contract_name_is_spelled_outside_the_contract_module():
    found = []
    for name, module in package_modules().items():
        if name == "sdqes_edge.contract":
            continue
        for line, value in string_constants(module.tree):
            if value in CONTRACT_LITERALS:
                found.append(f"{module.path.relative_to(REPO)}:{line} {value!r}")
    assert not found, "import these from sdqes_edge.contract instead:\n" + "\n".join(found)


def test_the_literal_check_can_fail():
    tree = ast.parse('"""mentions state_in. in prose"""\nfeeds = {"state_in." + name: value}\n')
    assert [value for _, value in string_constants(tree) if value in CONTRACT_LITERALS] == ["state_in."]


def test_the_schema_file_is_what_the_runtime_validates_against_and_names_the_precisions():
    schema = json.loads((REPO / "sdqes_edge" / contract.MANIFEST_SCHEMA_FILE).read_text())
    assert contract.manifest_schema() == schema
    assert list(contract.PRECISIONS) == schema["properties"]["graphs"]["properties"]["step"]["propertyNames"]["enum"]
    assert contract.REFERENCE_PRECISION in schema["properties"]["graphs"]["properties"]["step"]["required"]


@pytest.mark.parametrize("path", REQUIRED_PATHS, ids=["/".join(map(str, p)) for p in REQUIRED_PATHS])
def test_the_python_runtime_refuses_a_manifest_without_a_key_the_schema_requires(path, tmp_path):
    from sdqes_edge.runtime.bundle import BundleError, load_bundle

    with pytest.raises(BundleError, match="malformed") as refused:
        load_bundle(manifest_without(path, tmp_path))
    assert "\n" not in str(refused.value)


def test_the_native_runtime_reads_the_bundle_format_this_code_writes():
    header = (REPO / "native" / "include" / "sdqes" / "runtime.hpp").read_text()
    assert f"kBundleFormatVersion = {contract.BUNDLE_FORMAT_VERSION};" in header
    assert f'kBundleFormat = "{contract.BUNDLE_FORMAT}";' in header
    assert f'kStateInputPrefix = "{contract.STATE_INPUT_PREFIX}";' in header
    assert f'kMetadataKey = "{contract.METADATA_KEY}";' in header
    assert f'kQueryInput = "{contract.QUERY_INPUT}";' in header  # a graph exported with --fuse-queries
    assert f'kLogitsOutput = "{contract.LOGITS_OUTPUT}";' in header
    assert f"kMaxFps = {contract.MAX_FPS};" in header
    assert f"kLowestScore = {contract.SCORE_RANGE[0]!r};" in header
    assert f"kHighestScore = {contract.SCORE_RANGE[1]!r};" in header


def test_the_schema_bounds_the_rate_a_bundle_samples_at_as_the_contract_does():
    schema = json.loads((REPO / "sdqes_edge" / contract.MANIFEST_SCHEMA_FILE).read_text())
    assert schema["properties"]["fps"] == {"type": "number", "exclusiveMinimum": 0, "maximum": contract.MAX_FPS}


def test_the_native_runtime_checks_the_same_manifest_fields_against_the_step_graph_as_the_python_one():
    from sdqes_edge.runtime.bundle import DESCRIBED_BY_THE_GRAPH

    header = (REPO / "native" / "include" / "sdqes" / "runtime.hpp").read_text()
    listed = ", ".join(f'"{key}"' for key in DESCRIBED_BY_THE_GRAPH)
    assert f"kDescribedByTheGraph[] = {{{listed}}};" in header
