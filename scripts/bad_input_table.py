"""Write docs/bad-input.md: every bad input a user can give, run through the real command line.

    .venv/bin/python scripts/bad_input_table.py        (about a minute: exports one tiny bundle)

Each case is run as a user would run it; the table records the exit status and the one line printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Beside this script, on its sys.path.
from bad_input_files import (
    Q,
    add_query_to_texts_alone,
    annotation_files,
    checkpoint_files,
    edit_manifests,
    queries_files,
    read_weights_from,
)

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "bad-input.md"
WARNED = "sdqes-edge: warning:"
LONG_NAME = "a" * 300  # past the 255 bytes a name every Linux file system holds


def cases(b: Path, t: Path) -> list[tuple]:
    """(what the user did, argv[, a module this machine lacks]); b: a good bundle, t: a scratch folder with broken
    files in it."""
    return run_cases(b, t) + export_cases(t) + other_cases(b, t)


def run_cases(b: Path, t: Path) -> list[tuple[str, list[str]]]:
    """Bad bundles, sources, queries and options given to `sdqes-edge run` (and a misspelt command)."""
    run = ["run", str(b), "--source", str(t / "clip.avi"), "--query", Q]

    def bundle(name: str) -> list[str]:  # the broken bundle t/name, run on any source
        return ["run", str(t / name), "--source", "x.mp4", "--query", Q]

    return [
        ("bundle folder does not exist", bundle("nope")), ("a file given as the bundle", bundle("garbage.mp4")),
        ("manifest is not JSON", bundle("garbled")), ("a graph changed after export", bundle("changed")),
        ("manifest names a file outside the bundle", bundle("escaping")),
        ("a graph reads its weights from a file outside the bundle", bundle("reaching")),
        ("bundle of a newer format", bundle("newer")),
        ("manifest with a NaN fps", bundle("nan-fps")),
        ("manifest with an fps no camera gives (1e300)", bundle("fast-fps")),
        ("manifest nested 100,000 levels deep", bundle("deep")),
        ("manifest edited to another image size than its graph's", bundle("resized")),
        ("manifest with a label's threshold outside (0, 1)", bundle("label-threshold")),
        ("manifest.json a symlink to a file outside the bundle", bundle("linked")),
        ("a query added to queries.json alone (sha256 resealed)", ["run", str(t / "requeried"), "--source", "x.mp4"]),
        ("video file missing", ["run", str(b), "--source", str(t / "missing.mp4"), "--query", Q]),
        ("a bundle path holding a terminal's control characters (shown, not obeyed)", bundle("\x1b[2Jbundle")),
        ("a queries CSV with a cell past the csv module's 128 KiB",
         ["run", str(b), "--source", str(t / "clip.avi"), "--queries-file", str(t / "long-cell.csv")]),
        ("video unreadable", ["run", str(b), "--source", str(t / "garbage.mp4"), "--query", Q]),
        ("a still image as the source", ["run", str(b), "--source", str(t / "photo.jpg"), "--query", Q]),
        ("a folder of videos as the source", ["run", str(b), "--source", str(t / "videos"), "--query", Q]),
        ("camera index absent", ["run", str(b), "--source", "7", "--query", Q]),
        ("camera device file absent (a USB camera not plugged in yet)",
         ["run", str(b), "--source", "/dev/v4l/by-id/usb-cam-video-index0", "--query", Q]),
        ("stream URL that does not open (its password hidden)",
         ["run", str(b), "--source", "rtsp://admin:s3cret@127.0.0.1:9/live", "--query", Q]),
        ("empty query", ["run", str(b), "--source", str(t / "clip.avi"), "--query", " "]),
        ("query over 77 tokens", ["run", str(b), "--source", str(t / "clip.avi"), "--query", "word " * 80]),
        ("threshold outside (0, 1)", [*run, "--threshold", "1.5"]), ("--max-frames 0", [*run, "--max-frames", "0"]),
        ("threshold no score reaches (0.9: p = sigmoid(cos) is at most 0.7311)", [*run, "--threshold", "0.9"]),
        ("--watch-queries without a --queries-file to watch", [*run, "--watch-queries"]),
        ("a queries file whose threshold is not a probability",
         ["run", str(b), "--source", str(t / "clip.avi"), "--queries-file", str(t / "thresholds.csv")]),
        *[(what, ["run", str(b), "--source", str(t / "clip.avi"), "--queries-file", str(t / name)]) for what, name in (
            ("a queries CSV whose alert messages are in a 'message' column", "message-column.csv"),
            ("a JSON queries file whose entries have a 'message' key", "message-key.json"),
            ("a spreadsheet saved as Unicode Text (UTF-16, tabs) given as a .txt queries file", "spreadsheet.txt"))],
        ("--threads 0", [*run, "--threads", "0"]),
        ("--ort-device cuda where ONNX Runtime is the CPU build", [*run, "--ort-device", "cuda"]),
        ("--ort-ops names no kernel library", [*run, "--ort-ops", str(t / "libsdqes_ort_ops.so")]),
        ("--ort-ops names a file that is not a library", [*run, "--ort-ops", str(t / "garbage.mp4")]),
        ("--cooldown nan", [*run, "--cooldown", "nan"]),
        ("--exit-threshold above --threshold", [*run, "--threshold", "0.5", "--exit-threshold", "0.9"]),
        ("an option the command does not have", [*run, "--treshold", "0.5"]),
        ("a query of several words without quotes",
         ["run", str(b), "--source", str(t / "clip.avi"), "--query", "when", "I", "start", "cooking"]),
        ("a shell glob after --source", ["run", str(b), "--source", str(t / "clip.avi"), str(t / "garbage.mp4"),
                                         "--query", Q]),
        ("a misspelt command", ["exprot", "--preset", "tiny"]),
    ] + run_output_cases(run, t)


def run_output_cases(run: list[str], t: Path) -> list[tuple[str, list[str]]]:
    """Bad output paths and state files given to `sdqes-edge run` (``run``: a good run's argv)."""
    return [
        ("--annotate with a container OpenCV cannot write", [*run, "--annotate", str(t / "out.gif")]),
        ("--annotate without an extension", [*run, "--annotate", str(t / "outvideo")]),
        ("--annotate is a folder", [*run, "--annotate", str(t)]),
        ("--annotate-segment below 0", [*run, "--annotate", str(t / "out.mp4"), "--annotate-segment", "-10"]),
        ("--events is a folder", [*run, "--events", str(t)]),
        ("--events cannot be written", [*run, "--events", "/proc/version"]),
        ("--scores under a file", [*run, "--scores", str(t / "garbage.mp4" / "s")]),
        ("--events through symbolic links in a loop", [*run, "--events", str(t / "loop-a" / "alerts.jsonl")]),
        ("--events another run is writing", [*run, "--events", str(t / "held" / "alerts.jsonl")]),
        ("--annotate with a name too long for the file system", [*run, "--annotate", str(t / (LONG_NAME + ".mp4"))]),
        ("--events and --scores one file", [*run, "--events", str(t / "o.npz"), "--scores", str(t / "o.npz")]),
        ("--annotate the video --source reads", [*run, "--annotate", str(t / "clip.avi")]),
        ("--events a file of the bundle", [*run, "--events", str(Path(run[1]) / "manifest.json")]),
        ("--save-state is a folder", [*run, "--save-state", str(t)]),
        ("--resume from a file that is not a snapshot", [*run, "--resume", str(t / "garbage.mp4")]),
        ("--resume from a snapshot cut short", [*run, "--resume", str(t / "cut.npz")]),
        ("--state beside --save-state", [*run, "--state", str(t / "s.npz"), "--save-state", str(t / "o.npz")]),
        ("--resume from a snapshot of another model with the same shapes",
         ["run", str(t / "other"), "--source", str(t / "clip.avi"), "--query", Q, "--resume", str(t / "state.npz")]),
    ]


def export_cases(t: Path) -> list[tuple[str, list[str]]]:
    """Bad checkpoints, model configs and options given to `sdqes-edge export`."""
    return [
        ("export: checkpoint missing", ["export", "--checkpoint", str(t / "none.pt"), "--out", str(t / "x")]),
        ("export: checkpoint that is not a checkpoint", ["export", "--checkpoint", str(t / "garbage.mp4"),
                                                         "--out", str(t / "x")]),
        ("export: checkpoint cut short", ["export", "--checkpoint", str(t / "half.pt"), "--out", str(t / "x")]),
        ("export: a folder as the checkpoint", ["export", "--checkpoint", str(t / "photos"), "--out", str(t / "x")]),
        ("export: one shard of sharded weights given as the checkpoint",
         ["export", "--checkpoint", str(t / "sharded" / "model-00001-of-00002.safetensors"), "--out", str(t / "x")]),
        ("export: a transformers CLIP vision tower alone",
         ["export", "--checkpoint", str(t / "hf-vision" / "model.safetensors"), "--out", str(t / "x")]),
        ("export: a model config given as the checkpoint",
         ["export", "--checkpoint", str(t / "hf-vision" / "config.json"), "--out", str(t / "x")]),
        ("export: an open_clip config asking for bilinear resizing",
         ["export", "--checkpoint", str(t / "bilinear" / "open_clip_model.safetensors"), "--out", str(t / "x")]),
        ("export: a text tower trained with another tokenizer", ["export", "--checkpoint", str(t / "other-vocab.pt"),
                                                                 "--out", str(t / "x")]),
        ("export: a checkpoint saved after training diverged (NaN weights)",
         ["export", "--checkpoint", str(t / "diverged.pt"), "--out", str(t / "x")]),
        ("export: empty query", ["export", "--preset", "tiny", "--query", "", "--out", str(t / "x")]),
        ("export: head count that does not divide the width", ["export", "--checkpoint", str(t / "tiny.pt"),
                                                               "--vision-heads", "3", "--out", str(t / "x")]),
        ("export: a queries file that is a JSON object, not a list",
         ["export", "--preset", "tiny", "--queries-file", str(t / "queries.json"), "--out", str(t / "x")]),
        ("export: more streams than memory holds", ["export", "--preset", "tiny", "--batch", "100000", "--out",
                                                    str(t / "x")]),
        ("export: --fps inf", ["export", "--preset", "tiny", "--fps", "inf", "--out", str(t / "x")]),
        ("export: a --threshold no score reaches", ["export", "--preset", "tiny", "--threshold", "0.8", "--out",
                                                    str(t / "x")]),
        ("export: --out is a file", ["export", "--preset", "tiny", "--out", str(t / "garbage.mp4")]),
        ("export: --out empty (an unset shell variable)", ["export", "--preset", "tiny", "--out", ""]),
        ("export: over a folder that is not a bundle", ["export", "--preset", "tiny", "--out", str(t / "photos")]),
        ("export: into a folder another export is writing", ["export", "--preset", "tiny", "--out",
                                                             str(t / "exporting")]),
        ("export: over a bundle that holds the checkpoint being exported",
         ["export", "--checkpoint", str(t / "kept" / "tiny.pt"), "--out", str(t / "kept")]),
    ]


def other_cases(b: Path, t: Path) -> list[tuple]:
    """Bad input to eval, score, synth, train, build-engine, build-ort-ops, bench and inspect."""
    score = ["score", str(b), "--annotations", str(t / "splits.csv"), "--videos", str(t), "--out", str(t / "scored")]
    return [
        ("eval: a CSV without the EgoSDQES columns",
         ["eval", "--annotations", str(t / "a.csv"), "--scores", str(t / "photos")]),
        ("eval: an annotation row whose start time is not a number",
         ["eval", "--annotations", str(t / "badrow.csv"), "--baseline", "oracle", "--split", "train"]),
        ("eval: an annotation row whose start time is in milliseconds (past its video's end)",
         ["eval", "--annotations", str(t / "milliseconds.csv"), "--baseline", "oracle", "--split", "train"]),
        ("eval: an annotation row whose query is empty",
         ["eval", "--annotations", str(t / "emptyquery.csv"), "--baseline", "oracle", "--split", "train"]),
        ("score: an annotation query over the model's 77 tokens",
         ["score", str(b), "--annotations", str(t / "longquery.csv"), "--videos", str(t), "--out", str(t / "scored")]),
        ("score: a video folder holding none of the annotated videos", score),
        ("score: a --precision the bundle has no step graph of", [*score, "--precision", "int8"]),
        ("score: --ort-device cuda where ONNX Runtime is the CPU build", [*score, "--ort-device", "cuda"]),
        ("score: --ray with --ort-device cuda", [*score, "--ray", "--ort-device", "cuda"]),
        ("eval: annotations a spreadsheet saved with ';' between columns",
         ["eval", "--annotations", str(t / "semicolons.csv"), "--baseline", "oracle"]),
        ("eval: traces of test streams, evaluated on eval's default split (val)",
         ["eval", "--annotations", str(t / "splits.csv"), "--scores", str(t / "test-traces")]),
        ("eval: traces that `run` wrote with a query of the user's own",
         ["eval", "--annotations", str(t / "splits.csv"), "--split", "test", "--scores", str(t / "own-traces")]),
        ("eval: annotations missing", ["eval", "--annotations", str(t / "none.csv"), "--baseline", "oracle"]),
        ("eval: a folder given as the annotations", ["eval", "--annotations", str(t), "--baseline", "oracle"]),
        ("eval: a negative --seed", ["eval", "--annotations", str(t / "a.csv"), "--baseline", "random", "--seed",
                                     "-1"]),
        ("demo: --out is a folder of the user's own holding an alerts.jsonl", ["demo", "--out", str(t / "mine")]),
        ("synth: more streams than the disk holds (100000000 for 1000)",
         ["synth", "--out", str(t / "s"), "--train", "100000000"]),
        ("synth: streams too short for every event to start in them", ["synth", "--out", str(t / "s"), "--seconds",
                                                                        "10"]),
        ("train: a negative --seed", ["train", "--seed", "-1", "--out", str(t / "x")]),
        ("train: a learning rate at which training diverges",
         ["train", "--lr", "1e30", "--steps", "3", "--train-streams", "2", "--val-streams", "1", "--test-streams", "1",
          "--stream-seconds", "20", "--window", "8", "--out", str(t / "trained")]),
        ("build-engine: a bundle whose graph scores the queries (--fuse-queries)",
         ["build-engine", str(t / "fused"), "--precision", "fp16"]),
        ("build-engine: a negative --verify-frames", ["build-engine", str(b), "--verify-frames", "-1"]),
        ("build-engine: an int8 engine from a bundle without an int8 graph",
         ["build-engine", str(b), "--precision", "int8"]),
        ("build-engine: a bundle where engines cannot be stored", ["build-engine", str(t / "blocked")]),
        ("build-ort-ops: --out is a file", ["build-ort-ops", "--out", str(t / "garbage.mp4")]),
        ("bench: preset with an adapter", ["bench", "--preset", "tiny+qrnn"]),
        ("bench: --device-only without --device", ["bench", "--quick", "--device-only"]),
        ("bench: a sliding window too long for this machine's memory", ["bench", "--quick", "--window", "10000000"]),
        ("check: more frames than memory holds at once", ["check", "--frames", "100000000"]),
        ("bench --out cannot be written", ["bench", "--quick", "--out", "/proc/bench"]),
        ("inspect: --frames 0", ["inspect", str(b), "--frames", "0"]),
        ("export on a device that installed sdqes-edge[runtime] alone (no torch)",
         ["export", "--preset", "tiny", "--out", str(t / "x")], "torch"),
    ]


def prepare(t: Path) -> Path:
    import cv2
    import numpy as np
    import torch

    from sdqes_edge.config import preset
    from sdqes_edge.export import ExportOptions, Query, export_bundle
    from sdqes_edge.model import SDQESModel
    from sdqes_edge.runtime.detector import StreamingDetector

    (t / "loop-a").symlink_to("loop-b")  # links that lead round to each other
    (t / "loop-b").symlink_to("loop-a")
    model = SDQESModel(preset("tiny+qrnn")).eval()
    b = t / "bundle"
    export_bundle(model, b, ExportOptions(show_progress=False), log=lambda m: None)
    export_bundle(SDQESModel(preset("tiny+qrnn")).eval(), t / "other", ExportOptions(show_progress=False),
                  log=lambda m: None)
    fused = ExportOptions(show_progress=False, fuse_queries=True, queries=(Query(Q, "Wash your hands."),))
    export_bundle(model, t / "fused", fused, log=lambda m: None)
    torch.save(SDQESModel(preset("tiny")).eval().clip_state_dict(), t / "tiny.pt")
    whole = (t / "tiny.pt").read_bytes()
    (t / "half.pt").write_bytes(whole[: len(whole) // 2])
    checkpoint_files(t, SDQESModel(preset("tiny")).eval().clip_state_dict())
    writer = cv2.VideoWriter(str(t / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 5, (64, 48))
    for _ in range(5):
        writer.write(np.zeros((48, 64, 3), np.uint8))
    writer.release()
    (t / "videos").mkdir()
    for name in ("kitchen.avi", "hall.avi"):
        (t / "videos" / name).write_bytes((t / "clip.avi").read_bytes())
    cv2.imwrite(str(t / "videos" / "thumbnail.png"), np.zeros((48, 64, 3), np.uint8))
    StreamingDetector(b).save_state(t / "state.npz")
    (t / "cut.npz").write_bytes((t / "state.npz").read_bytes()[:600])  # a copy that stopped half-way
    (t / "garbage.mp4").write_bytes(b"\x00\x01" * 100)
    cv2.imwrite(str(t / "photo.jpg"), np.zeros((48, 64, 3), np.uint8))
    (t / "photos").mkdir()
    (t / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    (t / "queries.json").write_text(json.dumps({"text": Q, "response": "Wash your hands."}))
    annotation_files(t)
    queries_files(t)
    (t / "mine").mkdir()
    (t / "mine" / "alerts.jsonl").write_text("{}\n")
    (t / "thresholds.csv").write_text(f'query,response,threshold\n"{Q}",Wash your hands.,high\n')
    for name in ("garbled", "changed", "escaping", "reaching", "newer", "blocked", "nan-fps", "fast-fps", "resized",
                 "label-threshold", "deep"):
        shutil.copytree(b, t / name)
    read_weights_from(t / "reaching", "../weights.bin")
    (t / "blocked" / "engines").write_text("a file where the engines folder goes")
    (t / "garbled" / "manifest.json").write_text("{")
    (t / "deep" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    (t / "changed" / "text.onnx").write_bytes(b"changed")
    edit_manifests(b, t)
    shutil.copytree(b, t / "kept")
    shutil.copy(t / "tiny.pt", t / "kept" / "tiny.pt")
    shutil.copytree(b, t / "linked", ignore=shutil.ignore_patterns("manifest.json"))
    (t / "linked" / "manifest.json").symlink_to(b / "manifest.json")
    add_query_to_texts_alone(t / "fused", t / "requeried")
    _other_run_and_odd_files(t)
    return b


OTHER_RUNS: list[subprocess.Popen] = []  # what stands for a run already going, killed once the table is made


def _other_run_and_odd_files(t: Path) -> None:
    """Another run holding held/alerts.jsonl and the bundle folder exporting/ (runtime/output_locks.py); a queries
    CSV with a cell past 128 KiB."""
    code = ("import sys, time; from sdqes_edge.runtime.output_locks import hold; "
            "[hold(path, '--out') for path in sys.argv[1:]]; print('held', flush=True); time.sleep(600)")
    OTHER_RUNS.append(subprocess.Popen([sys.executable, "-c", code, str(t / "held" / "alerts.jsonl"),
                                        str(t / "exporting")], stdout=subprocess.PIPE, text=True))
    OTHER_RUNS[-1].stdout.readline()  # held
    (t / "long-cell.csv").write_text(f"query,response\n{Q}," + "x" * 200_000 + "\n")


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        b = prepare(t)
        for what, argv, *lacking in cases(b, t):
            # A module the machine lacks is blocked as the torch-free tests block it (None in sys.modules).
            entry = ["-c", f"import sys; sys.modules[{lacking[0]!r}] = None\nfrom sdqes_edge.cli import main\nmain()"
                     ] if lacking else ["-m", "sdqes_edge.cli"]
            done = subprocess.run([sys.executable, *entry, *argv], capture_output=True, text=True,
                                  env=dict(os.environ, COLUMNS="200"))
            # The refusal's lines: a warning printed before it (an option the command drops) is not part of it.
            lines = [line for line in done.stderr.strip().splitlines() if line and not line.startswith(WARNED)]
            message = lines[-1] if lines else done.stdout.strip().splitlines()[-1]
            shown = message.replace(tmp, "…").replace(LONG_NAME, "aaa…(300 letters)").replace("|", "\\|")
            shown = re.sub(r"pid \d+", "pid 1234", shown)  # the other run's, another each time
            rows.append(f"| {what} | {done.returncode} | {len(lines)} | `{shown}` |")
            print(f"{done.returncode} {what}: {shown[:120]}")
    OUT.write_text("# Bad input, and what sdqes-edge says\n\n"
                   "Every case below was run through the command line by `scripts/bad_input_table.py` (which "
                   "wrote this page); paths under its scratch folder are shown as `…`. Each is refused in one "
                   "line on stderr, with no traceback, and exit status 2 (argparse's own checks too; 1 where the "
                   "machine ran out of memory for what was asked, or a camera cannot be opened: the machine's "
                   "state, which a service manager restarts).\n\n"
                   "| what the user did | exit | stderr lines | message |\n|---|---|---|---|\n"
                   + "\n".join(rows) + "\n")
    for holder in OTHER_RUNS:
        holder.kill()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
