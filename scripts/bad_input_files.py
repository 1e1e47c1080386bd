"""The broken files `scripts/bad_input_table.py` gives the command line: checkpoints of other layouts, annotation
CSVs with one mistake each, queries files, bundles edited by hand; each as a user (or a maker of bundles) makes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

Q = "when I start cooking"


def edit_manifests(b: Path, t: Path) -> None:
    """The manifests of the copies of ``b`` in ``t`` edited by hand, each in one way."""
    from sdqes_edge.files import file_sha256

    edits = {
        "escaping": lambda m: m["files"].update(
            {"../bundle/step.fp32.onnx": {"sha256": file_sha256(b / "step.fp32.onnx"), "bytes": 1}}),
        "newer": lambda m: m.update(format_version=99),
        "nan-fps": lambda m: m.update(fps=float("nan")),  # Python's json writes NaN; JSON has none
        "fast-fps": lambda m: m.update(fps=1e300),
        "resized": lambda m: m.update(image_size=2 * m["image_size"]),
        "label-threshold": lambda m: m["thresholds"].update(per_label={"open_door": 1.5}),
    }
    for name, edit in edits.items():
        m = json.loads((b / "manifest.json").read_text())
        edit(m)
        (t / name / "manifest.json").write_text(json.dumps(m))


def add_query_to_texts_alone(bundle: Path, out: Path) -> None:
    """A copy of ``bundle`` with a second query in queries.json but not in its embeddings, the sha256 made right."""
    from sdqes_edge.files import file_sha256

    shutil.copytree(bundle, out)
    texts = json.loads((out / "queries.json").read_text())
    (out / "queries.json").write_text(json.dumps(texts + [{"text": "when I open the fridge", "response": "Close it"}]))
    m = json.loads((out / "manifest.json").read_text())
    m["files"]["queries.json"]["sha256"] = file_sha256(out / "queries.json")
    (out / "manifest.json").write_text(json.dumps(m))


def checkpoint_files(t: Path, clip_state: dict) -> None:
    """Checkpoints of other layouts and conventions, with the configs beside them."""
    import torch
    from safetensors.torch import save_file

    (t / "hf-vision").mkdir()
    save_file({"vision_model.embeddings.patch_embedding.weight": torch.zeros(64, 3, 8, 8)},
              str(t / "hf-vision" / "model.safetensors"))
    (t / "hf-vision" / "config.json").write_text(json.dumps({"model_type": "clip"}))
    (t / "bilinear").mkdir()
    save_file(clip_state, str(t / "bilinear" / "open_clip_model.safetensors"))
    model_cfg = {"vision_cfg": {"width": 64}, "text_cfg": {"heads": 1}}
    (t / "bilinear" / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": model_cfg, "preprocess_cfg": {"interpolation": "bilinear"}}))
    torch.save(dict(clip_state, **{"token_embedding.weight": clip_state["token_embedding.weight"][:1000]}),
               t / "other-vocab.pt")
    torch.save(dict(clip_state, **{"visual.ln_pre.bias": clip_state["visual.ln_pre.bias"] * float("nan")}),
               t / "diverged.pt")
    (t / "sharded").mkdir()  # what save_pretrained writes for large weights: shards and the index listing them
    halves = [dict(list(clip_state.items())[k::2]) for k in range(2)]
    for k, half in enumerate(halves):
        save_file(half, str(t / "sharded" / f"model-0000{k + 1}-of-00002.safetensors"))
    weight_map = {name: f"model-0000{k + 1}-of-00002.safetensors" for k, half in enumerate(halves) for name in half}
    (t / "sharded" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def annotation_files(t: Path) -> None:
    """Annotation CSVs with one mistake each, and a trace of a split other than eval's default."""
    import numpy as np

    from sdqes_edge.traces import StreamScores, save_scores

    (t / "a.csv").write_text("split,video_uid,query,video_start_time\n")
    header = "split,source,video_uid,query,response,label,video_start_time,video_fps,video_length"
    (t / "badrow.csv").write_text(f"{header}\ntrain,moments,v1,{Q},Wash!,cook,12.5,30,900\n"
                                  f"train,moments,v1,{Q},Wash!,cook,1:05,30,900\n")
    (t / "milliseconds.csv").write_text(f"{header}\ntrain,moments,v1,{Q},Wash!,cook,12500,30,900\n")
    (t / "emptyquery.csv").write_text(f"{header}\ntrain,moments,v1, ,Wash!,cook,12.5,30,900\n")
    long_query = "Tell me when " + "the very " * 40 + "red ball starts rolling."
    (t / "longquery.csv").write_text(f"{header}\ntrain,moments,clip,{long_query},Rolling!,rolls,0.5,5,5\n")
    (t / "semicolons.csv").write_text(header.replace(",", ";") + "\n")
    (t / "splits.csv").write_text(f"{header}\nval,moments,v1,{Q},Wash!,cook,12.5,30,900\n"
                                  f"test,moments,v2,{Q},Wash!,cook,12.5,30,900\n")
    (t / "test-traces").mkdir()
    save_scores(t / "test-traces" / "v2.npz", StreamScores("v2", 1.0, [Q], ["0"], np.zeros(1), np.zeros((30, 1))))
    (t / "own-traces").mkdir()
    save_scores(t / "own-traces" / "v2.npz", StreamScores("v2", 1.0, ["when the kettle boils"], ["0"], np.zeros(1),
                                                          np.zeros((30, 1))))


def read_weights_from(bundle: Path, location: str) -> None:
    """Make the bundle's fp32 step graph keep its largest weight at ``location`` (ONNX external data), with the
    manifest's sha256 of the graph made right, as the maker of such a bundle would."""
    import onnx
    from onnx import numpy_helper

    from sdqes_edge.files import file_sha256

    graph = onnx.load(str(bundle / "step.fp32.onnx"))
    tensor = max(graph.graph.initializer, key=lambda x: len(x.raw_data))
    (bundle / location).write_bytes(numpy_helper.to_array(tensor).tobytes())
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    (bundle / "step.fp32.onnx").write_bytes(graph.SerializeToString())
    m = json.loads((bundle / "manifest.json").read_text())
    m["files"]["step.fp32.onnx"] = {"sha256": file_sha256(bundle / "step.fp32.onnx"),
                                    "bytes": (bundle / "step.fp32.onnx").stat().st_size}
    (bundle / "manifest.json").write_text(json.dumps(m))


def queries_files(t: Path) -> None:
    """Queries files as a spreadsheet or an editor leaves them, each with its alert messages where none is read."""
    (t / "message-column.csv").write_text(f'query,message\n"{Q}",Wash your hands.\n')
    (t / "message-key.json").write_text(json.dumps([{"text": Q, "message": "Wash your hands."}]))
    # Excel's "Unicode Text": UTF-16 with its byte-order mark, the columns separated by tabs.
    (t / "spreadsheet.txt").write_bytes(f"\ufeffquery\tresponse\n{Q}\tWash your hands.\n".encode("utf-16-le"))
