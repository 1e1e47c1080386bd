"""What `export` says of an earlier bundle it replaces: what that bundle was given after its export and the new one
will not have (the thresholds are tested in test_query_thresholds.py)."""

from __future__ import annotations

from conftest import random_model

from sdqes_edge.export import ExportOptions, export_bundle


def test_tensorrt_engines_built_for_the_replaced_graphs_are_named_with_the_commands_that_build_them_again(tmp_path):
    """An engine takes minutes to build on a Jetson; re-exporting deleted it without a word, and the next
    `run --backend trt` found none."""
    out, said = tmp_path / "bundle", []
    options = ExportOptions(show_progress=False)
    export_bundle(random_model("qrnn"), out, options, log=said.append)
    for device, precision in (("orin-sm87-trt10.3", "fp16"), ("orin-sm87-trt10.3", "int8"), ("v100-sm70-trt8.6",
                                                                                             "fp16")):
        (out / "engines" / device).mkdir(parents=True, exist_ok=True)
        (out / "engines" / device / f"step.{precision}.engine").write_bytes(b"an engine of the replaced graph")
    said.clear()
    export_bundle(random_model("qrnn"), out, options, log=said.append)
    assert [line for line in said if "TensorRT engines" in line] == [
        f"warning: --out {out} holds TensorRT engines built from the graphs it replaces (orin-sm87-trt10.3 fp16, "
        "orin-sm87-trt10.3 int8, v100-sm70-trt8.6 fp16), which go with them: build them again on each device "
        f"(sdqes-edge build-engine {out} --precision fp16; sdqes-edge build-engine {out} --precision int8)"]
    assert not (out / "engines").exists()
    said.clear()
    export_bundle(random_model("qrnn"), out, options, log=said.append)  # none now: nothing to say
    assert not [line for line in said if line.startswith("warning:")]

