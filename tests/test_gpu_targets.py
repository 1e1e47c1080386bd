"""The GPU step's targets, read from a `bench --device cuda` run and set beside their bounds: the H200 run kept in
benchmarks/results is the specification of how each is read."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sdqes_edge.benchmarks.gpu_targets import markdown, measured_targets

H200_RUN = Path(__file__).parents[1] / "benchmarks" / "results" / "device-h200-2026-11-27.json"


@pytest.fixture()
def h200() -> dict:
    return json.loads(H200_RUN.read_text())


def by_what(rows: list[dict]) -> dict[str, dict]:
    return {row["what"]: row for row in rows}


def test_each_target_of_the_h200_run_is_read_from_its_own_rows_and_set_beside_its_bound(h200):
    rows = by_what(measured_targets(h200))
    latency, batches = h200["device"]["latency"], h200["device"]["batches"]["rows"]
    assert rows["batch 1: qrnn step, fp16"]["value"] == latency["qrnn/ort_fp16"]["p50_ms"]
    assert rows["batch 1: backbone step, fp16"]["value"] == latency["none/ort_fp16"]["p50_ms"]
    assert rows["batch 1: 4-frame window over streaming, fp16, same treatment"]["value"] == pytest.approx(
        latency["window4/ort_fp16"]["p50_ms"] / latency["qrnn/ort_fp16"]["p50_ms"])
    assert rows["32 streams: qrnn over backbone, fp16"]["value"] == pytest.approx(
        batches["qrnn/fp16/32"]["step_ms"] / batches["none/fp16/32"]["step_ms"])
    assert rows["32 streams: qrnn step, fp16"]["value"] == pytest.approx(batches["qrnn/fp16/32"]["frames_per_s"])
    assert rows["32 streams: qrnn fp32 over fp16"]["value"] == pytest.approx(
        batches["qrnn/fp32/32"]["step_ms"] / batches["qrnn/fp16/32"]["step_ms"])
    # That run predates the loop's fp16 row: its fp32 loop over its bare step.
    loop = rows["runtime loop on an mp4 over the bare step (the worse precision)"]
    assert loop["value"] == pytest.approx(1 + h200["device"]["end_to_end"]["overhead"])
    assert [row["met"] for row in rows.values()] == [False, True, False, False, True, True, False]


def test_a_ratio_just_past_its_bound_is_not_shown_as_equal_to_it(h200):
    loop = measured_targets(h200)[-1]
    assert loop["bound"] == "<= 1.1x" and loop["shown"] == "1.103x" and loop["met"] is False


def test_with_the_kernel_library_timed_each_figure_is_the_better_of_with_and_without(h200):
    run = copy.deepcopy(h200)
    latency, batches = run["device"]["latency"], run["device"]["batches"]["rows"]
    latency["qrnn/ort_fp16_sdqes_kernels"] = dict(latency["qrnn/ort_fp16"], p50_ms=1.5)
    latency["window4/ort_fp16_sdqes_kernels"] = dict(latency["window4/ort_fp16"], p50_ms=3.0)
    batches["qrnn/fp16 with sdqes_edge kernels/32"] = {"step_ms": 5.0, "frames_per_s": 6400.0}
    rows = by_what(measured_targets(run))
    assert rows["batch 1: qrnn step, fp16"]["value"] == 1.5 and rows["batch 1: qrnn step, fp16"]["met"]
    assert rows["batch 1: 4-frame window over streaming, fp16, same treatment"]["value"] == pytest.approx(3.0 / 1.5)
    assert rows["32 streams: qrnn over backbone, fp16"]["value"] == pytest.approx(5.0 / 4.5, rel=1e-2)
    assert rows["32 streams: qrnn step, fp16"]["value"] == pytest.approx(32 * 1000.0 / 5.0)
    # Slower with the library: the figure stays that of the step without it.
    latency["qrnn/ort_fp16_sdqes_kernels"]["p50_ms"] = 2.5
    assert by_what(measured_targets(run))["batch 1: qrnn step, fp16"]["value"] == latency["qrnn/ort_fp16"]["p50_ms"]


def test_the_loops_worse_precision_is_the_figure_and_a_run_cut_short_leaves_its_targets_unmeasured(h200):
    run = copy.deepcopy(h200)
    run["device"]["end_to_end"]["by_precision"] = {"fp32": {"loop_over_step": 1.04}, "fp16": {"loop_over_step": 1.2}}
    assert measured_targets(run)[-1]["value"] == 1.2
    del run["device"]["end_to_end"], run["device"]["batches"]  # a lent GPU's time ran out after batch 1
    rows = by_what(measured_targets(run))
    assert rows["32 streams: qrnn step, fp16"]["met"] is None and rows["32 streams: qrnn step, fp16"]["shown"] == "-"
    assert rows["batch 1: qrnn step, fp16"]["met"] is False
    assert "| runtime loop on an mp4 over the bare step (the worse precision) | <= 1.1x | - | not measured |" in (
        markdown(run))


def test_a_run_off_the_targets_machine_says_only_its_ratios_compare(h200):
    assert not any(line.startswith("This run is") for line in markdown(h200))
    run = copy.deepcopy(h200)
    run["config"]["preset"], run["device"]["device"] = "tiny", "cpu"
    assert "This run is tiny on cpu: the times are not the targets' machine's, and only the ratios compare." in (
        markdown(run))
