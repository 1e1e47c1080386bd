"""The benchmark runs end to end in its quick mode, so its code never rots. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_quick_writes_every_section_with_the_machine_description(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "bench", "--quick", "--repetitions", "3",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "bench.json").read_text())
    rows = results["table"]["rows"]
    assert list(rows) == ["none", "mlp", "st", "qrnn", "retnet", "window4"]
    for name, row in rows.items():
        assert set(row["latency"]) >= {"torch", "ort_fp32", "ort_int8"}, name
        assert row["macs"] > 0 and row["parameters"] > 0
    assert rows["window4"]["macs"] > 3 * rows["qrnn"]["macs"]  # W frames recomputed per output frame
    assert rows["none"]["adapter_parameters"] == 0 and rows["qrnn"]["adapter_parameters"] > 0
    assert "window4 / streaming qrnn (ort_fp32)" in results["table"]["ratios"]
    assert {"cpu", "cores", "onnxruntime", "torch"} <= set(results["machine"])
    assert len(results["scaling"]["streaming"]["per_frame_ms"]) == 300
    assert set(results["batches"]["batches"]) == {"1", "2"}
    assert results["end_to_end"]["frames"] == 10
    for png in ("scaling.png", "latency.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert "| window4 |" in (tmp_path / "bench.md").read_text()
