"""Shared fixtures: small models with random (non-identity) adapters, and the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Fixtures of their own modules, available to every test: `exported` (a tiny QRNN bundle), `native_build`.
pytest_plugins = ["runtime_fixtures", "native_fixtures"]

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SDQES_SHARED", REPO_ROOT.parent / "shared"))
EGOSDQES_CSV = SHARED / "data" / "egosdqes_all.csv"

# Every adapter configuration the model supports, named for test ids.
ADAPTER_CASES = [
    ("none", {}),
    ("mlp", {"per_block": 1}), ("mlp", {"per_block": 2}),
    ("st", {"per_block": 1}), ("st", {"per_block": 2}), ("st", {"per_block": 1, "lookback": 3}),
    ("qrnn", {"per_block": 1}), ("qrnn", {"per_block": 2}),
    ("qrnn", {"per_block": 1, "qrnn_downsample": False, "ratio": 0.25, "lookback": 2, "qrnn_layers": 2}),
    ("retnet", {"per_block": 1}), ("retnet", {"per_block": 2}),
]


# The suite runs on every core (pyproject's addopts: pytest-xdist's `-n auto --dist loadfile`), a test file whole on
# one worker so that its module fixtures are made once. The native runtime's files go to one worker together: their
# session fixture builds the C++ runtime (a minute on two cores), which two workers would each build.
NATIVE_TEST_FILES = frozenset({"test_native.py", "test_native_onnxruntime.py", "test_native_c_api.py",
                               "test_native_memory.py"})


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; without xdist the suite runs in one process
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NativeFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "native runtime" if Path(file).name in NATIVE_TEST_FILES else file

    return NativeFilesTogether(config, log)


def case_id(case) -> str:
    kind, fields = case
    return kind + "".join(f"-{k}={v}" for k, v in fields.items())


def tiny_config(kind: str, **fields):
    from sdqes_edge.config import preset, with_authors_adapter

    base = preset("tiny")
    return base if kind == "none" else with_authors_adapter(base, kind, **fields)


def random_model(kind: str, seed: int = 0, **fields):
    """A tiny model whose adapters have random weights, so every temporal path contributes."""
    import torch

    from sdqes_edge.model import SDQESModel
    from sdqes_edge.model.init import randomize_adapters

    torch.manual_seed(seed)
    return randomize_adapters(SDQESModel(tiny_config(kind, **fields)).eval(), seed=seed)


@pytest.fixture(scope="session")
def cpu_kernel_build(tmp_path_factory):
    """``sdqes-edge build-ort-ops --cpu`` run once, as a user runs it: (its CompletedProcess, the library's path)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("ort_ops")
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "build-ort-ops", "--cpu", "--out", str(out)],
                          capture_output=True, text=True)
    return done, out / "libsdqes_ort_ops.so"


def step_graph_forms(model, folder: Path) -> dict[str, Path]:
    """``model``'s two-stream step graph in the three forms the fused operators are checked in: plain fp32, fp32
    with ONNX Runtime's operators (the fused nodes, beside the plain graph's arithmetic), and fp16."""
    from sdqes_edge.contract import ONNX_RUNTIME_OPERATORS
    from sdqes_edge.export.graphs import export_step_graph

    paths = {"plain": folder / "plain.onnx", "fp32": folder / "fp32.onnx", "fp16": folder / "fp16.onnx"}
    export_step_graph(model, paths["plain"], batch=2)
    export_step_graph(model, paths["fp32"], batch=2, operators=ONNX_RUNTIME_OPERATORS)
    export_step_graph(model, paths["fp16"], batch=2, precision="fp16")
    return paths


@pytest.fixture(scope="module")
def kernel_library(cpu_kernel_build):
    """The library's CPU kernels (a ``runtime.fused_ops.FusedOps``), built here as a user builds them; skipped, with
    the reason, where they cannot be."""
    from sdqes_edge.runtime.fused_ops import load_fused_ops

    built, library = cpu_kernel_build
    if built.returncode != 0:
        pytest.skip(f"the kernel library did not build here: {built.stderr.strip().splitlines()[-3:]}")
    return load_fused_ops(library)


@pytest.fixture(scope="session")
def egosdqes_csv() -> Path:
    if not EGOSDQES_CSV.is_file():
        pytest.skip(f"EgoSDQES annotations not found at {EGOSDQES_CSV} (set SDQES_SHARED to the shared folder)")
    return EGOSDQES_CSV


def op_counts(path):
    """How many nodes of each operator type the ONNX graph at ``path`` has (a ``collections.Counter``)."""
    from collections import Counter

    import onnx

    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def assert_same_stream(graphs, frame_shape, frames: int = 24, atol: float = 1e-6, seed: int = 3,
                       second_options: dict | None = None):
    """Two step graphs (paths) give the same embedding every frame and the same final state, over a stream
    of random frames with each graph's own state carried. ``atol`` holds the (normalized) embeddings; the states,
    not normalized, are held to it absolutely up to magnitude 1 and relatively above (as export.verify.state_error
    holds them). ``second_options``: keywords of the second graph's ``OnnxRuntimeStep``."""
    import numpy as np

    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

    rng = np.random.default_rng(seed)
    runners = [OnnxRuntimeStep(graphs[0]), OnnxRuntimeStep(graphs[1], **(second_options or {}))]
    states = [r.initial_state() for r in runners]
    for _ in range(frames):
        frame = rng.standard_normal(frame_shape).astype(np.float32)
        results = [r.step(frame, s) for r, s in zip(runners, states)]
        np.testing.assert_allclose(results[1].embedding, results[0].embedding, atol=atol)
        states = [r.state for r in results]
    final = [r.state_to_numpy(s) for r, s in zip(runners, states)]
    for name, value in final[0].items():
        np.testing.assert_allclose(final[1][name], value, atol=atol, rtol=atol, err_msg=name)
