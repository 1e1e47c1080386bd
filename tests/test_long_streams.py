"""20,000 frames of streaming: every adapter's state stays finite and stops growing, and the memory stays flat."""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from sdqes_edge.model.retention import SimpleRetention
from sdqes_edge.runtime.soak import SoakBlock, SoakReport
from sdqes_edge.tolerances import SOAK_STATE_GROWTH

LONG_STREAM = 20_000


@pytest.mark.parametrize("kind", ["st", "qrnn", "retnet"])
def test_twenty_thousand_frames_through_the_runtime_keep_the_state_finite_and_bounded_and_the_memory_flat(
        kind, tmp_path):
    """CI's version of `sdqes-edge check --soak 100000`: the exported step graph, as a deployment runs it (reader
    thread, preprocessing, scoring, alert log, score trace), 10 blocks of 2,000 frames, in a process of its own as a
    deployment's is (in a test worker's, what its earlier tests left behind moved the memory by 5.5 MiB once)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from sdqes_edge.export import ExportOptions, export_bundle
    from sdqes_edge.runtime.soak import soak_bundle

    bundle = tmp_path / kind
    export_bundle(random_model(kind, per_block=2), bundle, ExportOptions(show_progress=False), log=lambda m: None)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as own_process:
        report = own_process.submit(soak_bundle, bundle, frames=LONG_STREAM, block=2_000, sample_every=50).result()
    print(f"\n{kind}: max |state| per block {[round(b.max_state_abs, 4) for b in report.blocks]} "
          f"(largest {report.blocks[-1].largest_state}), fastest-growing {report.growing_state} "
          f"{report.state_growth:.3f}x, "
          f"memory after warm-up {report.rss_growth_bytes / 2**20:+.2f} MiB, "
          f"{report.frames / report.seconds:.0f} frames/s")
    assert [b.end_frame for b in report.blocks] == list(range(2_000, LONG_STREAM + 1, 2_000))
    assert report.finite and all(0 < b.max_state_abs < 1e3 for b in report.blocks)
    assert report.bounded
    assert report.flat, f"memory grew {report.rss_growth_bytes / 2**20:.1f} MiB after warm-up"
    assert report.ok


def test_check_soak_reports_each_kinds_state_growth_and_memory_and_exits_0_when_both_hold(capsys):
    from sdqes_edge.cli import run

    assert run(["check", "--adapters", "st", "--frames", "4", "--soak", "400", "--soak-block", "100"]) == 0
    verdict = [line for line in capsys.readouterr().out.splitlines() if line.startswith("st: state")]
    assert len(verdict) == 1 and "finite" in verdict[0] and "(bounded)" in verdict[0] and "(flat)" in verdict[0]
    assert verdict[0].endswith("  ok")


def blocks_of(magnitudes: dict[str, list[float]], blocks: int = 4) -> list[SoakBlock]:
    """``blocks`` soak blocks of 100 frames with these per-tensor magnitudes, block by block."""
    return [SoakBlock((i + 1) * 100, {name: series[i] for name, series in magnitudes.items()}, 0)
            for i in range(blocks)]


@pytest.mark.parametrize("magnitudes, growing", [
    ({"h": [3.0, 3.2, 3.1, 3.2]}, None),  # in its range from the warm-up on
    ({"h": [1.0, 2.0, 3.0, 4.0]}, "h"),  # sums its input without decay: twice as large in the later half
    ({"h": [2.0, 2.0, 2.0, 2.0 * SOAK_STATE_GROWTH * 1.01]}, "h"),  # one late excursion past the bound is enough
    ({"history": [9.0, 9.0, 9.0, 9.0], "h": [0.1, 0.2, 0.3, 0.4]}, "h"),  # a large tensor cannot hide a small one
    ({"h": [0.0, 1e-9, 0.0, 5e-7]}, None),  # rounding noise around zero is not growth
    ({}, None),  # no state at all (a bundle without adapters)
])
def test_a_soak_calls_each_state_tensor_bounded_when_its_later_half_stays_within_its_earlier_range(magnitudes,
                                                                                                 growing):
    report = SoakReport(400, finite=True, blocks=blocks_of(magnitudes))
    assert report.bounded is (growing is None)
    assert report.ok is (growing is None)
    if growing:
        assert report.growing_state == growing and report.state_growth > SOAK_STATE_GROWTH


def test_retnet_step_in_fp16_stays_finite_far_past_where_absolute_xpos_overflows():
    """Absolute xPos factors leave fp16's range after ~4,500 frames; the relative step never forms them."""
    torch.manual_seed(0)
    retention = SimpleRetention(dim=16, gamma=0.5, scale_base=512)
    x = torch.randn(6_000, 4, 16)
    state32 = torch.zeros(4, 16, 16)
    state16 = state32.half()
    half = retention.half()
    full = SimpleRetention(dim=16, gamma=0.5, scale_base=512)
    full.load_state_dict({k: v.float() for k, v in half.state_dict().items()})
    with torch.no_grad():
        for t in range(x.shape[0]):
            out16, state16 = half.step(x[t].half(), state16)
            out32, state32 = full.step(x[t], state32)
    assert torch.isfinite(state16).all() and torch.isfinite(out16).all()
    assert (out16.float() - out32).abs().max().item() < 0.05 * out32.abs().max().item() + 1e-3
