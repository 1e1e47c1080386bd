"""The benchmark runs end to end in its quick mode, so its code never rots. No timing is asserted."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest


@contextlib.contextmanager
def recording_sessions():
    """Every ONNX Runtime session made in the block, as (graph path, its spin-wait setting: "1" where never set,
    ONNX Runtime's default, spinning). The int8 calibration's own sessions, gone before anything is timed, are
    left out."""
    import inspect

    import onnxruntime

    made = []

    class RecordedSession(onnxruntime.InferenceSession):
        def __init__(self, path, *args, **kwargs):
            super().__init__(path, *args, **kwargs)
            if any("onnxruntime/quantization" in frame.filename for frame in inspect.stack()):
                return
            from sdqes_edge.runtime.ort_sessions import SPIN_WAIT_OPTION

            try:
                made.append((str(path), self.get_session_options().get_session_config_entry(SPIN_WAIT_OPTION)))
            except RuntimeError:
                made.append((str(path), "1"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnxruntime, "InferenceSession", RecordedSession)
        yield made


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    """`sdqes-edge bench --quick --repetitions 3`, run once for the module: every CPU section, int8 included
    (about 30 s). (its results, its folder, the sessions it made)"""
    from sdqes_edge.cli import run as cli

    out, said = tmp_path_factory.mktemp("quick_bench"), io.StringIO()
    with recording_sessions() as sessions, contextlib.redirect_stderr(said):
        assert cli(["bench", "--quick", "--repetitions", "3", "--out", str(out)]) == 0
    return SimpleNamespace(results=json.loads((out / "bench.json").read_text()), out=out, sessions=sessions,
                           stderr=said.getvalue())


@pytest.fixture(scope="module")
def device_rows_on_the_cpu(tmp_path_factory):
    """The rows `--device cuda` adds, run on the CPU as a `--device-only` run with `--threads 1`: (its results,
    files, folder, sessions made, PyTorch's thread count at each line it logged, and before and after it)."""
    import torch

    from sdqes_edge.benchmarks.config import QUICK, BenchConfig
    from sdqes_edge.benchmarks.suite import run

    out = tmp_path_factory.mktemp("device_rows")
    cfg = dataclasses.replace(BenchConfig(**QUICK), repetitions=3, threads=1, device="cpu", device_only=True,
                              int8=False, device_batches=(1, 2), device_scaling_frames=20, scaling_probe=5,
                              e2e_frames=4, device_e2e_frames=6, out=str(out))
    threads_before, threads_seen = torch.get_num_threads(), []
    with recording_sessions() as sessions:
        results, files = run(cfg, log=lambda message: threads_seen.append(torch.get_num_threads()))
    return SimpleNamespace(results=results, files=files, out=out, sessions=sessions, threads_seen=threads_seen,
                           threads_before=threads_before, threads_after=torch.get_num_threads())


def test_bench_quick_writes_every_section_with_the_machine_description(quick_bench):
    results, out = quick_bench.results, quick_bench.out
    rows = results["table"]["rows"]
    assert list(rows) == ["none", "mlp", "st", "qrnn", "retnet", "window4"]
    for name, row in rows.items():
        assert set(row["latency"]) >= {"torch", "ort_fp32", "ort_int8"}, name
        assert row["macs"] > 0 and row["parameters"] > 0
    assert rows["window4"]["macs"] > 3 * rows["qrnn"]["macs"]  # W frames recomputed per output frame
    assert rows["none"]["adapter_parameters"] == 0 and rows["qrnn"]["adapter_parameters"] > 0
    assert "window4 / streaming qrnn (ort_fp32)" in results["table"]["ratios"]
    assert {"cpu", "cores", "int8_instructions", "onnxruntime", "torch"} <= set(results["machine"])
    assert results["machine"]["other_processes_cores"] >= 0.0  # how busy the rest of the machine kept its cores
    assert len(results["scaling"]["streaming"]["per_frame_ms"]) == 300
    assert set(results["batches"]["batches"]) == {"1", "2"}
    assert results["end_to_end"]["frames"] == 10 and results["end_to_end"]["reader_ms_per_frame"] > 0
    # Every precision of one bundle: its step interleaved and alone, and the whole runtime loop.
    assert set(results["precisions"]["rows"]) == {"fp32", "fp16", "int8"}
    assert results["precisions"]["rows"]["fp32"]["speedup_alone"] == 1.0
    assert set(results["end_to_end"]["loop_fps"]) == {"fp32", "fp16", "int8"}
    assert "## Precisions on the CPU" in (out / "bench.md").read_text()
    # The detector's own work per step, the model's step stood in: every query off costs less than every one on.
    alerting = results["alerting"]
    assert alerting["streams"] == 4 and set(alerting["rows"]) == {"1", "20"}
    assert all(row["none_on_ms"] > 0 and row["bare_step_ms"] > 0 for row in alerting["rows"].values())
    assert "## The detector's own work per step (4 streams" in (out / "bench.md").read_text()
    gathering = alerting["gathering"]  # as many stand-in cameras, gathered by the run as `run` gathers them
    assert gathering["cameras"] == 4 and gathering["steps"] >= 3 and gathering["stepping_thread_cpu_ms"] > 0
    for png in ("scaling.png", "latency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "| window4 |" in (out / "bench.md").read_text()
    assert rows["qrnn"]["kernels"] > rows["none"]["kernels"] > 0  # kernels per step, from ORT's profiler


def test_the_bench_warns_of_no_threshold_it_set_out_of_reach_itself(quick_bench):
    # Its alerting section keeps every query off, then on, with thresholds no score reaches or every score passes;
    # the warning a user's query gets for such a threshold had been printed twice by every bench.
    assert "query 0 of the bench" not in quick_bench.stderr
    assert "never reached" not in quick_bench.stderr and "below every score" not in quick_bench.stderr


def test_the_device_section_runs_its_rows_on_the_cpu_where_no_gpu_is(device_rows_on_the_cpu):
    """The rows `--device cuda` adds are device-generic code: here they run on the CPU (no CUDA graphs), as a
    `--device-only` run, which measures them and nothing else."""
    results, files, out = device_rows_on_the_cpu.results, device_rows_on_the_cpu.files, device_rows_on_the_cpu.out
    section = results["device"]
    for name in ("none", "qrnn"):
        for backend in ("torch_fp32", "torch_fp16", "ort_fp32", "ort_fp16"):
            assert section["latency"][f"{name}/{backend}"]["p50_ms"] > 0
    # The window at each precision in that precision's step graph form (tests/test_window_graph.py).
    assert {"window4 / streaming qrnn (ort_fp32, same treatment)",
            "window4 / streaming qrnn (ort_fp16, same treatment)"} <= set(section["ratios"])
    assert section["latency"]["window4/ort_fp16"]["p50_ms"] > 0
    # The fp16 graph with ONNX Runtime's fused operators (the default) beside the same graph in plain ONNX.
    assert section["latency"]["qrnn/ort_fp16_plain_onnx"]["p50_ms"] > 0
    assert "qrnn: ort_fp16 plain ONNX / with ONNX Runtime's fused operators" in section["ratios"]
    assert set(section["batches"]["rows"]) == {f"{n}/{p}/{b}" for n in ("none", "qrnn") for p in ("fp32", "fp16")
                                              for b in (1, 2)} | {"qrnn/fp16/2, 1 idle", "qrnn/fp16 plain ONNX/2"}
    assert "qrnn fp16 at 2 streams: one idle (state kept) / all busy" in section["batches"]["ratios"]
    upload = section["batches"]["frame_upload"]  # the frame going up alone, against the step it is part of
    assert upload["streams"] == 2 and upload["page_locked"] is False  # no CUDA runtime: nothing to lock with
    assert upload["bytes"] == 2 * 3 * 32 * 32 * 4 and 0 < upload["share_of_step"] < 1
    assert "the frame upload alone at 2 streams" in (out / "bench.md").read_text()
    assert section["scaling"]["frames"] == 20 and section["end_to_end"]["ort_device"] == "cpu"
    assert section["end_to_end"]["frames"] == 6  # the device's own stream length, not the CPU loop's
    assert section["kernels_cpu_profile"]["qrnn"]["per_step"] > section["kernels_cpu_profile"]["none"]["per_step"]
    assert {v["fp16_graph_casts"] for v in section["kernels_cpu_profile"].values()} == {2}  # frame in, embedding out
    on_device = section["kernels_on_device"]
    assert on_device["qrnn"]["ort_nodes"] > on_device["none"]["ort_nodes"] > 0
    assert on_device["qrnn/ort_fp16_plain_onnx"]["ort_nodes"] > on_device["qrnn"]["ort_nodes"]
    assert on_device["qrnn"]["gpu_kernels"] is None  # no GPU here: ONNX Runtime's nodes are what runs
    at_most_streams = section["batches"]["kernels_on_device"]  # the same, at the most streams a step takes
    assert at_most_streams["qrnn at 2 streams"]["ort_nodes"] > at_most_streams["none at 2 streams"]["ort_nodes"] > 0
    # Only the device's rows: no CPU table, scaling or plots.
    assert not {"table", "scaling", "batches", "precisions", "end_to_end"} & set(results)
    assert files == [out / "bench.json", out / "bench.md"] and not list(out.glob("*.png"))
    report = (out / "bench.md").read_text()
    assert "## On the device: cpu" in report and "runtime loop on cpu" in report and "| window4 |" not in report
    assert section["end_to_end"]["reader_ms_per_frame"] > 0 and "the source alone" in report
    e2e = section["end_to_end"]  # the loop against its floor: the slower of the source and the step
    floor = max(e2e["reader_ms_per_frame"], e2e["bare_step_ms_per_frame"])
    assert e2e["loop_over_slower_half"] == e2e["loop_ms_per_frame"] / floor and "the slower of the two" in report
    # fp16, the GPU's format, against its own bare step too (the top-level figures are fp32's)
    assert set(e2e["by_precision"]) == {"fp32", "fp16"}
    fp16 = e2e["by_precision"]["fp16"]
    assert fp16["loop_over_step"] == fp16["loop_ms_per_frame"] / fp16["bare_step_ms_per_frame"]
    assert e2e["by_precision"]["fp32"]["loop_ms_per_frame"] == e2e["loop_ms_per_frame"]
    assert "runtime loop on cpu, fp16:" in report
    # The loop's start (opening the video, its first frame) apart from its frames, as the bare step has none.
    assert e2e["loop_start_ms"] > 0 and e2e["loop_with_start_ms_per_frame"] > 0 and e2e["reader_start_ms"] > 0
    assert "ms/frame from its first frame to its last (its start, opening the video and the first frame, " in report
    assert "qrnn at 2 streams" in report
    # The GPU step's targets, read from these rows (tests/test_gpu_targets.py), said not to be this machine's.
    assert "| batch 1: qrnn step, fp16 | <= 1.8 ms |" in report and "This run is tiny on cpu" in report
    assert "| 2 streams: qrnn over backbone, fp16 | <= 1.25x |" in report and "not measured |" not in report


def test_a_loop_is_timed_from_its_first_frame_to_its_last_and_its_start_apart(monkeypatch):
    """A pass over a video starts by opening it and preparing its first frame, once; set against a bare step that
    has no start, the start counted in every frame's cost (on an H200, 0.4 ms a frame over a 4-ms step)."""
    from sdqes_edge.benchmarks import end_to_end

    clock = iter([0.0, 0.050, 0.060, 0.070, 0.080])  # asked; then 50 ms to the first frame, 10 ms to each next
    monkeypatch.setattr(end_to_end.time, "perf_counter", lambda: next(clock))
    timed = end_to_end._Timed.of(lambda: range(4))
    assert timed.start_ms == pytest.approx(50.0) and timed.per_frame_ms == pytest.approx(10.0)
    assert timed.with_start_ms == pytest.approx(80.0 / 4)
    runs = [end_to_end._Timed(1.0, 5.0, 2.0), end_to_end._Timed(3.0, 1.0, 4.0), end_to_end._Timed(2.0, 9.0, 3.0)]
    assert end_to_end._Timed.median(runs) == end_to_end._Timed(2.0, 5.0, 3.0)


def test_the_pytorch_rows_step_a_copy_and_leave_the_model_where_it_was():
    """On a GPU the window and step graphs are traced from the same model after its PyTorch rows; a row that
    moved the model (``Module.to`` moves in place) made that trace fail. PyTorch's ``meta`` device
    runs the same code here: shapes only, no arithmetic, and a real move if one happens."""
    import torch

    from sdqes_edge.benchmarks.device import torch_step
    from sdqes_edge.benchmarks.models import bench_config, bench_frame, bench_model
    from sdqes_edge.config import preset

    model = bench_model(bench_config(preset("tiny"), "qrnn"))
    for precision in ("fp32", "fp16"):
        step = torch_step(model, bench_frame(preset("tiny"), 1), "meta", precision)
        step()
        assert {p.device.type for p in model.parameters()} == {"cpu"}
        assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.parametrize("stop_at, kept, lost", [
    ("at batch", (), ("batches", "scaling", "end_to_end")),  # several streams per step: the batch-1 rows are kept
    ("bundle", ("batches", "scaling"), ("end_to_end",)),  # the device's runtime loop starts by exporting its bundle
])
def test_a_bench_cut_short_keeps_every_section_it_finished(stop_at, kept, lost, tmp_path):
    """A lent GPU's time limit, or Ctrl-C, stops a long bench: bench.json already holds what was measured."""
    import json

    import pytest

    from sdqes_edge.benchmarks.config import QUICK, BenchConfig
    from sdqes_edge.benchmarks.suite import run

    cfg = dataclasses.replace(BenchConfig(**QUICK), repetitions=3, device="cpu", device_only=True, int8=False,
                              device_batches=(1,), device_scaling_frames=10, scaling_probe=5, e2e_frames=4,
                              device_e2e_frames=4, out=str(tmp_path))

    def stop(message: str) -> None:
        if stop_at in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(cfg, log=stop)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["complete"] is False and saved["device"]["latency"]["qrnn/ort_fp32"]["p50_ms"] > 0
    assert set(kept) <= set(saved["device"]) and not set(lost) & set(saved["device"])
    assert not (tmp_path / "bench.json.tmp").exists()


def test_bench_device_only_without_a_device_is_refused_with_the_fix(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "bench", "--quick", "--device-only",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and "add --device cuda" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""  # refused before announcing a run


def test_bench_device_cuda_is_refused_up_front_where_this_onnxruntime_has_no_cuda(tmp_path):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        import pytest

        pytest.skip("this machine has the CUDA execution provider: the refusal cannot be shown here")
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "bench", "--quick", "--device", "cuda",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and "onnxruntime-gpu" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "bench.json").exists() and done.stdout == ""  # refused before announcing a run
    # bench has no --ort-device, which the advice named
    assert done.stderr.rstrip().endswith(", or leave out --device to measure on the CPU alone")


def test_bench_without_matplotlib_says_so_up_front_and_still_writes_its_tables_for_the_adapters_asked(tmp_path,
                                                                                                      monkeypatch):
    from sdqes_edge.benchmarks.config import QUICK, BenchConfig
    from sdqes_edge.benchmarks.suite import run

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed: importing it fails
    # The quick bench, its long stream and loop shortened: what is checked is what is written, not the numbers.
    cfg = dataclasses.replace(BenchConfig(**QUICK), adapters=("qrnn",), repetitions=3, int8=False, scaling_frames=20,
                              scaling_probe=5, growing_window_samples=2, batches=(1,), e2e_frames=4, out=str(tmp_path))
    said = []
    run(cfg, log=said.append)
    assert said[0].startswith("note: no plots: matplotlib is not installed"), said[:3]
    assert (tmp_path / "bench.json").is_file() and (tmp_path / "bench.md").is_file()
    assert not list(tmp_path.glob("*.png"))
    table = json.loads((tmp_path / "bench.json").read_text())["table"]
    assert list(table["rows"]) == ["qrnn", "window4"]  # the sliding window always, beside the kinds asked for
    assert "window4 / streaming qrnn (ort_fp32)" in table["ratios"]


def test_every_onnx_runtime_session_the_bench_makes_keeps_its_workers_from_spinning_between_runs(
        quick_bench, device_rows_on_the_cpu):
    """Candidates are timed interleaved: a session whose idle workers spin after its run takes the cores the next
    candidate needs (PyTorch's tiny QRNN step read 57 ms instead of 1.3 ms on 2 cores). Every section runs in the
    two runs, the sliding window and its int8 graph included, and every session made on the way is checked."""
    graphs = {path.rsplit("/", 1)[-1] for path, _ in quick_bench.sessions}
    assert {"window4.onnx", "window4.int8.onnx", "qrnn.int8.onnx", "text.onnx"} <= graphs, graphs
    assert device_rows_on_the_cpu.sessions  # the device's rows make sessions of their own
    made = quick_bench.sessions + device_rows_on_the_cpu.sessions
    assert [(path, spinning) for path, spinning in made if spinning != "0"] == []


def test_bench_threads_limits_pytorch_as_it_limits_onnx_runtime_and_gives_the_count_back(device_rows_on_the_cpu):
    """--threads 1 gave ONNX Runtime one thread while PyTorch eager kept every core, so the table's
    'torch / ort_fp32' compared unequal machines, silently."""
    run = device_rows_on_the_cpu
    assert set(run.threads_seen) == {1} and run.results["machine"]["torch_threads"] == 1
    assert "1 thread each" in (run.out / "bench.md").read_text()
    assert run.threads_after == run.threads_before


def test_the_cpu_time_other_processes_take_during_a_run_is_measured_and_this_processs_own_is_not():
    """Interleaving does not protect the bench from a job that runs in bursts beside it (a test suite beside
    `bench --quick` made the tiny backbone's PyTorch step 99 ms instead of 2.4 and printed nothing of it)."""
    from sdqes_edge.benchmarks.machine_load import CpuClock, other_processes_cores, read_cpu_clock

    # What this process does is not taken for others' work: its CPU time is read as its own, and taken off the
    # machine's. (Each on its own: the test suite runs on every core, so the others' load moves between any two
    # windows of this test, and comparing a busy window with an idle one measured that, not this.)
    before, started = read_cpu_clock(), time.process_time()
    while time.process_time() - started < 0.6:  # this process's own work: 0.6 s of CPU, however shared the cores
        pass
    after = read_cpu_clock()
    assert after.own_s - before.own_s >= 0.5, "this process's work is not read as its own"
    machine = (CpuClock(wall_s=10.0, busy_s=100.0, own_s=5.0), CpuClock(wall_s=11.0, busy_s=101.6, own_s=6.0))
    assert other_processes_cores(*machine) == pytest.approx(0.6)  # 1.6 cores busy, 1.0 of them this process's
    assert other_processes_cores(machine[0], CpuClock(11.0, 100.9, 6.0)) == 0.0  # ticks late against own time
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the interpreter started
        before = read_cpu_clock()
        time.sleep(1.0)
        beside = other_processes_cores(before, read_cpu_clock())
    finally:
        spinner.kill()
        spinner.wait()
    assert beside >= 0.6  # a whole core spun by another process (shared with nothing: this one slept)


def test_the_report_warns_when_other_processes_kept_the_machine_busy():
    from sdqes_edge.benchmarks.report import markdown

    results = {"config": {"preset": "tiny", "threads": None, "repetitions": 5},
               "machine": {"cpu": "AMD EPYC", "cores": 2, "torch": "2.13.0", "onnxruntime": "1.32.0"}}
    assert "Warning" not in markdown(results)  # results written before the measurement existed
    results["machine"]["other_processes_cores"] = 0.03
    assert "Warning" not in markdown(results)
    results["machine"]["other_processes_cores"] = 1.31
    assert ("**Warning: other processes kept 1.31 cores busy on average during this run, so its times and ratios are "
            "not an idle machine's. Run it again with nothing else running.**") in markdown(results)


def test_the_costliest_gpu_kernels_are_ranked_by_their_time_per_step_with_names_cut_short():
    from types import SimpleNamespace

    from sdqes_edge.benchmarks.kernels_on_device import KERNEL_NAME_CHARS, costliest_kernels, costliest_lines

    def kernel(name, us):  # what PyTorch's profiler gives for one executed kernel: its name and device time
        return SimpleNamespace(name=name, device_time=us)

    long_name = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_nn_align2>" * 20
    executed = [kernel("bias add", 2.0)] * 8 + [kernel(long_name, 8.0)] * 4 + [kernel("split", 1.0)] * 2
    ranked = costliest_kernels(executed, steps=2, top=2)
    assert ranked == [{"name": long_name[:KERNEL_NAME_CHARS], "per_step": 2.0, "us_per_step": 16.0},
                      {"name": "bias add", "per_step": 4.0, "us_per_step": 8.0}]
    lines = costliest_lines({"qrnn": {"costliest_kernels": ranked}, "none": {"gpu_kernels": None}}, shown=1)
    assert lines == [f"- costliest GPU kernels, qrnn: `{long_name[:60]}` 2/step, 16 us"]


def test_a_sliding_window_that_cannot_fit_in_memory_is_refused_before_any_work_naming_the_largest_that_fits(
        tmp_path, monkeypatch, capsys):
    import re

    import sdqes_edge.benchmarks.suite as suite
    from sdqes_edge.benchmarks.config import QUICK, BenchConfig
    from sdqes_edge.cli import run as cli
    from sdqes_edge.errors import DoesNotFit

    monkeypatch.setattr(suite, "available_memory", lambda: 2**30)  # 1 GiB free
    assert cli(["bench", "--quick", "--window", "100000", "--out", str(tmp_path / "b")]) == 1  # as for memory
    said = capsys.readouterr()
    assert said.out == "" and not (tmp_path / "b").exists()  # refused before announcing a run (it was SIGKILLed)
    largest = int(re.search(r"give --window (\d+) or less", said.err).group(1))
    suite.check_config(dataclasses.replace(BenchConfig(**QUICK), window=largest))
    with pytest.raises(DoesNotFit, match=f"--window {largest + 1}: the sliding window holds all its frames"):
        suite.check_config(dataclasses.replace(BenchConfig(**QUICK), window=largest + 1))
