"""The step form, run frame by frame with its state carried, IS the window form (DESIGN.md section 5)."""

from __future__ import annotations

import pytest
import torch
from conftest import ADAPTER_CASES, case_id, random_model, tiny_config

from sdqes_edge.config import TEMPORAL_ADAPTER_KINDS
from sdqes_edge.errors import UserError
from sdqes_edge.model import SDQESModel
from sdqes_edge.model.adapters import STEP_WIDTH_MULTIPLE, step_width
from sdqes_edge.tolerances import FP32_EMBEDDING_ATOL

BATCH, FRAMES = 2, 12


def run_steps(model, frames):
    return model.step_frames(frames)


@pytest.mark.parametrize("case", ADAPTER_CASES, ids=case_id)
def test_step_over_frames_reproduces_forward_clip(case):
    kind, fields = case
    model = random_model(kind, **fields)
    frames = torch.randn(BATCH, FRAMES, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        window = model.forward_clip(frames)
        steps, _ = run_steps(model, frames)
    assert window.shape == (BATCH, FRAMES, model.cfg.embed_dim)
    assert (steps - window).abs().max().item() <= FP32_EMBEDDING_ATOL


@pytest.mark.parametrize("case", ADAPTER_CASES, ids=case_id)
def test_streams_in_a_batch_do_not_influence_each_other(case):
    kind, fields = case
    model = random_model(kind, **fields)
    frames = torch.randn(BATCH, FRAMES, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        together, state_together = run_steps(model, frames)
        alone, state_alone = run_steps(model, frames[1:])
    assert (together[1:] - alone).abs().max().item() <= FP32_EMBEDDING_ATOL
    for joint, single in zip(state_together, state_alone):
        assert (joint[1:] - single).abs().max().item() <= FP32_EMBEDDING_ATOL


@pytest.mark.parametrize("kind", TEMPORAL_ADAPTER_KINDS)
def test_temporal_adapters_see_the_previous_frame_and_others_do_not(kind):
    frames = torch.randn(1, 4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    altered = frames.clone()
    altered[:, 2] += 1.0
    for name, expect_change in ((kind, True), ("mlp", False), ("none", False)):
        model = random_model(name)
        with torch.no_grad():
            moved = (model.forward_clip(altered)[:, 3] - model.forward_clip(frames)[:, 3]).abs().max().item()
        assert (moved > 1e-4) == expect_change, name


def test_state_spec_names_say_where_state_lives_and_batch_is_axis_0():
    model = random_model("qrnn", per_block=2)
    spec = model.state_spec(batch=3)
    assert spec.names[:2] == ["block00.adapter1.qrnn0_x_history", "block00.adapter1.qrnn0_h"]
    assert all(t.shape[0] == 3 for t in spec)
    state = model.init_state(3)
    assert [tuple(s.shape) for s in state] == [t.shape for t in spec]
    assert all(float(s.abs().max()) == 0.0 for s in state)
    _, next_state = model.step(torch.zeros(3, 3, 32, 32), state)
    assert [tuple(s.shape) for s in next_state] == [t.shape for t in spec]


def test_step_refuses_a_state_list_of_the_wrong_length():
    model = random_model("st")
    state = model.init_state(1)
    with pytest.raises(UserError, match=rf"^step takes the state as model.init_state\(batch\) makes it \({len(state)} "
                                        rf"tensors\) or as the step before returned it, not list of {2 * len(state)}$"):
        model.step(torch.zeros(1, 3, 32, 32), state + state)
    with pytest.raises(ValueError, match="state spec has"):  # the tower itself, as the exporter traces it
        model.visual.step(torch.zeros(1, 3, 32, 32), state + state)


@pytest.mark.parametrize("kind", ["mlp", "st", "qrnn", "retnet"])
def test_untrained_adapters_are_the_identity(kind):
    """Paper init: zero up-projection, so adding adapters changes nothing until they are trained."""
    torch.manual_seed(0)
    plain = SDQESModel(tiny_config("none")).eval()
    adapted = SDQESModel(tiny_config(kind)).eval()
    adapted.load_state_dict(plain.state_dict(), strict=False)
    frames = torch.randn(1, 5, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(adapted.forward_clip(frames), plain.forward_clip(frames), atol=1e-6)


def test_qrnn_forget_gate_init_is_weight_zero_bias_five():
    model = SDQESModel(tiny_config("qrnn"))
    layer = model.visual.transformer.resblocks[0].adapter1.qrnn.layers[0]
    assert float(layer.conv1d_f.weight.detach().abs().max()) == 0.0
    assert torch.all(layer.conv1d_f.bias == 5.0)


def test_embeddings_are_l2_normalized_in_both_forms():
    model = random_model("retnet")
    frames = torch.randn(2, 3, 3, 32, 32)
    with torch.no_grad():
        window = model.forward_clip(frames)
        emb, _ = model.step(frames[:, 0], model.init_state(2))
    assert torch.allclose(window.norm(dim=-1), torch.ones(2, 3), atol=1e-5)
    assert torch.allclose(emb.norm(dim=-1), torch.ones(2), atol=1e-5)


@pytest.mark.parametrize("kind, lookback", [("qrnn", 1), ("st", 1), ("st", 3)])
def test_the_step_carries_its_bottleneck_widened_to_whole_16_byte_rows_with_columns_that_stay_zero(kind, lookback):
    # At the QR-Adapter's ratio tiny's bottleneck is 44 features (0.35 x 128), as ViT-B/16's is 268: the step
    # form carries 48 (272), so the product writing them is aligned for a GPU's fp16 kernels, and the extra
    # columns are exactly zero
    model = random_model(kind, lookback=lookback, ratio=0.35)
    bottleneck = model.cfg.adapter.bottleneck(model.cfg.vision.width)
    assert bottleneck % STEP_WIDTH_MULTIPLE != 0  # the case this test is about
    history = next(iter(model.state_spec(batch=2)))
    assert history.shape[-1] == lookback * step_width(bottleneck) and history.shape[-1] % STEP_WIDTH_MULTIPLE == 0
    frames = torch.randn(2, 6, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, state = run_steps(model, frames)
    carried = state[0].reshape(2, -1, lookback, step_width(bottleneck))  # [B, L, frames, widened features]
    assert float(carried[..., :bottleneck].abs().max()) > 0.0
    assert float(carried[..., bottleneck:].abs().max()) == 0.0
