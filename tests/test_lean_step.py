"""The step graph is lean where a GPU pays per kernel: each adapter adds at most 10 executed kernels, and no
state tensor goes through a reshape on its way in or out (ONNX Runtime's profiler counts kernels on the CPU)."""

from __future__ import annotations

import onnx
import pytest
from conftest import random_model

from sdqes_edge.contract import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX
from sdqes_edge.export import graphs
from sdqes_edge.runtime.kernels import count_kernels

MAX_KERNELS_PER_ADAPTER = 10  # issue 13's target for the QRNN and ST adapters


def exported(kind: str, path, **fields):
    model = random_model(kind, **fields)
    graphs.export_step_graph(model, path)
    return model, path


@pytest.fixture(scope="module")
def backbone_kernels(tmp_path_factory):
    _, path = exported("none", tmp_path_factory.mktemp("lean") / "none.onnx")
    return count_kernels(path).per_step


@pytest.mark.parametrize("kind", ["qrnn", "st"])
def test_an_adapter_adds_at_most_ten_kernels_to_a_step(kind, backbone_kernels, tmp_path):
    model, path = exported(kind, tmp_path / f"{kind}.onnx", per_block=2)
    adapters = 2 * model.cfg.vision.layers
    per_adapter = (count_kernels(path).per_step - backbone_kernels) / adapters
    assert per_adapter <= MAX_KERNELS_PER_ADAPTER, f"{kind}: {per_adapter:.1f} kernels per adapter"


@pytest.mark.parametrize("kind", ["qrnn", "st", "retnet"])
def test_no_state_tensor_is_reshaped_on_its_way_in_or_out(kind, tmp_path):
    _, path = exported(kind, tmp_path / f"{kind}.onnx")
    nodes = onnx.load(str(path)).graph.node
    views = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
    reading = [n.op_type for n in nodes for i in n.input if i.startswith(STATE_INPUT_PREFIX)]
    writing = [n.op_type for n in nodes for o in n.output if o.startswith(STATE_OUTPUT_PREFIX)]
    assert reading and not views & set(reading), reading
    assert writing and not views & set(writing), writing
