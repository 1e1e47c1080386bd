"""Shared test vectors for the native (C++) runtime, written by the Python runtime.

    .venv/bin/python tests/native_vectors.py      # rewrites tests/vectors/

The C++ tests (native/tests/test_runtime.cpp) must reproduce these exactly (preprocessing within 1e-6),
and tests/test_native.py checks that the Python runtime still produces them, so the two runtimes cannot
drift apart without a test failing.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
from native_vectors_said import (
    PACING_CASES,
    RANDOM_WEIGHTS,
    TRAINING_RECORDS,
    pace_problem,
    random_weights_words,
    training_data_words,
)

from sdqes_edge import contract

VECTORS = Path(__file__).resolve().parent / "vectors"

# (file, height, width, seed, image_size): a mild shrink, a tall frame shrunk more than 2x, an enlargement.
# Small on purpose: the three resampling paths are the same at any size, and the vectors are committed.
PREPROCESS_CASES = [("frame_80x100.png", 80, 100, 7, 64), ("frame_300x200.png", 300, 200, 8, 64),
                    ("frame_40x60.png", 40, 60, 9, 64)]

ALERT_CASES = [
    {"name": "rising edges", "policy": {"threshold": 0.6}, "fps": 1.0},
    {"name": "hysteresis", "policy": {"threshold": 0.6, "exit_threshold": 0.5}, "fps": 1.0},
    {"name": "cooldown", "policy": {"threshold": 0.6, "cooldown_s": 4.0}, "fps": 1.0},
    {"name": "max alerts", "policy": {"threshold": 0.6, "max_alerts": 2}, "fps": 1.0},
    {"name": "cooldown at 2 fps", "policy": {"threshold": 0.55, "cooldown_s": 2.0}, "fps": 2.0},
    # Exactly float32(threshold) is not above it: compared in float32, as the reference does.
    {"name": "at float32(threshold)", "policy": {"threshold": 0.3}, "fps": 1.0,
     "probs": [0.1, 0.1, float(np.float32(0.3)), 0.1, 0.9, 0.1]},
]


# Decoded frames' timestamps -> how many sample times each serves (runtime/sampling.py); "end_time": the file's
# stated length plus slack, or None.
SAMPLING_CASES = [
    {"name": "30-fps video at 1 fps", "fps": 1.0, "end_time": None, "stamps": [k / 30 for k in range(91)]},
    {"name": "2-fps video at 4 fps: every frame twice", "fps": 4.0, "end_time": None,
     "stamps": [k * 0.5 for k in range(10)]},
    {"name": "2-fps video at 3 fps", "fps": 3.0, "end_time": None, "stamps": [k * 0.5 for k in range(10)]},
    {"name": "variable rate: a 5-s gap is held", "fps": 1.0, "end_time": None,
     "stamps": [0.0, 0.1, 0.2, 5.0, 5.1, 6.0]},
    {"name": "a broken stamp far past the stated end", "fps": 1.0, "end_time": 4.0, "stamps": [0.0, 1.0, 2.0, 1e9]},
    {"name": "milliseconds just below the sample time", "fps": 1.0, "end_time": None,
     "stamps": [0.0, 0.5, 0.9999995, 1.5, 1.9999]},
]


def sampling_counts(case: dict) -> list[int]:
    from sdqes_edge.runtime.sampling import samples_served

    counts, index = [], 0
    for stamp in case["stamps"]:
        counts.append(samples_served(stamp, index, 1.0 / case["fps"], case["end_time"]))
        index += counts[-1]
    return counts


# What each runtime calls a source (alerts' `stream`, output files) and how a URL is shown in messages.
LIVE_TARGETS = [
    "rtsp://admin:s3cret@10.0.0.5:554/cam/realmonitor?channel=2&subtype=0#x", "http://127.0.0.1:8080/video.mjpg",
    "udp://@:5000", "rtsp://cam/", "rtsp://cam/" + "x" * 200, "rtsp://Über-Kamera.local/live stream",
    "/dev/v4l/by-id/usb-046d_C920_8D2F-video-index0", "/dev/video0/", "rtsp://", "--..--",
    "nvarguscamerasrc sensor-id=0 ! video/x-raw(memory:NVMM), width=1280 ! nvvidconv ! appsink",
    "rtspsrc location=rtsp://cam/stream latency=0 ! rtph264depay ! avdec_h264 ! videoconvert ! appsink",
]
VIDEO_FILES = ["kitchen.mp4", "/data/videos/kitchen.2024.mp4", "clip.", ".hidden", "clip.tar.gz", "a/.", "a/b/",
               "https://host/videos/kitchen.mp4?token=abc", "https://Host.COM:8080/", "https://[::1]:8080/",
               "https://user:pw@host/", "http://", "noext"]
SHOWN_URLS = ["rtsp://admin:s3cret@10.0.0.5:554/x?y=1", "rtsp://admin@host/x", "rtsp://host/x",
              "http://u:p:q@host:80/", "rtsp://a:b@h/x?", "rtsp://a:b@c@h/x"]
# Alert lines as a terminal is given them: control characters (C0 but the tab, DEL, C1, the last two-byte in UTF-8)
# written as escapes, everything else, emoji joiners included, as it is.
TERMINAL_LINES = ["[s 00:01.0] Alert \x1b[2K\rFAKE LINE", "a \x1b]0;title\x07 b", "line\nnext\x00", "tab\tkept \x7f",
                  "C1 \x85 \x9b end", "caf\u00e9 \U0001F468\u200d\U0001F469 \u00a0"]


def source_name_cases() -> dict:
    from sdqes_edge.errors import terminal_safe
    from sdqes_edge.runtime.live_source import live_source_name, without_password
    from sdqes_edge.runtime.sources import video_file_name

    return {"cameras": {str(i): live_source_name(i) for i in (0, 7)},
            "live": {t: live_source_name(t) for t in LIVE_TARGETS},
            "video_files": {f: video_file_name(f) for f in VIDEO_FILES},
            "shown": {u: without_password(u) for u in SHOWN_URLS},
            "on_a_terminal": {line: terminal_safe(line) for line in TERMINAL_LINES}}


# What a --source names (runtime/sources.py's source_kind), machine-independent: "{vectors}" stands for this folder,
# made absolute by each side's test. And the back-off between attempts to reopen a live source that dropped, and the
# sources opened with timeouts.
SOURCE_KIND_SPECS = ["0", "12", "\u00b2", "rtsp://admin:pw@10.0.0.5:554/x", "udp://@:5000", "http://h/video.mjpg",
                     "https://h/clip.mp4", "nvarguscamerasrc sensor-id=0 ! appsink", "/no/such/clip!.mp4", "/dev/null",
                     "/dev/video987", "/dev/v4l/by-id/usb-none-video-index0", "/no/such/clip.mp4", "{vectors}",
                     "{vectors}/frame_40x60.png", "{vectors}/bundle/manifest.json"]


def source_kind_cases() -> dict:
    from sdqes_edge.runtime.frame_source import STREAM_TIMEOUT_MIN_S, STREAM_TIMEOUT_S
    from sdqes_edge.runtime.live_source import RECONNECT_DELAYS_S, is_stream_url
    from sdqes_edge.runtime.sources import source_kind

    return {"kinds": {spec: source_kind(spec.replace("{vectors}", str(VECTORS))) for spec in SOURCE_KIND_SPECS},
            "reconnect_delays_s": list(RECONNECT_DELAYS_S),
            # Which sources OpenCV's FFmpeg opens with open and read timeouts of stream_timeout_s (open_capture).
            "stream_urls": [spec for spec in SOURCE_KIND_SPECS if is_stream_url(spec)],
            "stream_timeout_s": STREAM_TIMEOUT_S, "stream_timeout_min_s": STREAM_TIMEOUT_MIN_S}


# A bundle's recorded thresholds x a query of its own (its label, its own threshold) x sdqes-run's options: the
# policy each query alerts under (runtime/bundle.py's Bundle.policy_for; a query's own threshold comes first).
CALIBRATED = {"default": 0.6, "per_label": {"open_door": 0.7, "boil_water": 0.45},
              "policy": {"exit_margin": 0.05, "cooldown_s": 20.0}}
QUERY_POLICY_CASES = [
    {"name": "the default", "thresholds": {"default": 0.6}, "query": {}, "options": {}},
    {"name": "its label's", "thresholds": CALIBRATED, "query": {"label": "open_door"}, "options": {}},
    {"name": "a label without a threshold", "thresholds": CALIBRATED, "query": {"label": "sit_down"}, "options": {}},
    {"name": "its own", "thresholds": CALIBRATED, "query": {"label": "open_door", "threshold": 0.8}, "options": {}},
    {"name": "--threshold over the label's", "thresholds": CALIBRATED, "query": {"label": "boil_water"},
     "options": {"threshold": 0.5}},
    {"name": "its own over --threshold", "thresholds": CALIBRATED, "query": {"threshold": 0.8},
     "options": {"threshold": 0.5}},
    {"name": "a margin past zero", "thresholds": {"default": 0.03, "policy": {"exit_margin": 0.05, "cooldown_s": 0}},
     "query": {}, "options": {}},
    {"name": "options over the recorded policy", "thresholds": CALIBRATED, "query": {"label": "open_door"},
     "options": {"exit_threshold": 0.2, "cooldown_s": 0.0, "max_alerts": 3}},
]


def query_policy(case: dict) -> dict:
    from sdqes_edge.runtime.bundle import Bundle

    options, query = dict(case["options"]), case["query"]
    if "threshold" in query:
        options["threshold"] = query["threshold"]
    policy = Bundle(Path("."), {"thresholds": case["thresholds"]}).policy_for(query.get("label"), **options)
    return {"threshold": policy.threshold, "exit_threshold": policy.exit_threshold, "cooldown_s": policy.cooldown_s,
            "max_alerts": policy.max_alerts}


# Alerts as the alert log writes them, every field: a query with a label and one without (its label null).
ALERT_EVENT_CASES = [
    {"query_id": "q1", "query": "When I start to clean the table, remind me to wash my hands.",
     "message": "Wash your hands.", "stream": "kitchen", "stream_time": 12.5, "frame_index": 25, "score": 0.71,
     "cosine": 0.8954, "latency_ms": 3.25, "threshold": 0.658, "label": "wash_hands",
     "wall_time": "2026-11-28T12:30:00.125Z"},
    {"query_id": "q7", "query": "Tell me when the lamp turns on.", "message": "Lamp on!", "stream": "camera0",
     "stream_time": 3.0, "frame_index": 3, "score": 0.6, "cosine": 0.405, "latency_ms": 1.0, "threshold": 0.55,
     "label": None, "wall_time": "2026-11-28T12:30:01.000Z"},
]


def alert_event_lines() -> list[dict]:
    from sdqes_edge.runtime.sinks import AlertEvent

    return [AlertEvent(**case).to_dict() for case in ALERT_EVENT_CASES]


def schema_required_paths() -> list[tuple[str, ...]]:
    """Every key the schema requires at the top level and inside the objects every manifest has."""
    schema = contract.manifest_schema()
    paths = [(key,) for key in schema["required"]]
    for key, sub in schema["properties"].items():
        if key in schema["required"] and sub.get("type") == "object":
            paths += [(key, inner) for inner in sub.get("required", [])]
    paths += [("state", 0, key) for key in schema["properties"]["state"]["items"]["required"]]
    return paths


REQUIRED_PATHS = schema_required_paths()


def manifest_without(path: tuple, work) -> object:
    """The shared vectors bundle, copied under ``work``, its manifest lacking the key at ``path``."""
    bundle = work / "bundle"
    shutil.copytree(VECTORS / "bundle", bundle)
    manifest = json.loads((bundle / contract.MANIFEST_NAME).read_text())
    changed = copy.deepcopy(manifest)
    parent = changed
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]
    (bundle / contract.MANIFEST_NAME).write_text(json.dumps(changed))
    return bundle


def alert_frames(policy: dict, probs: list[float], fps: float) -> list[int]:
    from sdqes_edge.runtime.alerts import AlertPolicy, AlertState

    state = AlertState(AlertPolicy(**policy))
    return [t for t, p in enumerate(probs) if state.update(p, t / fps)]


def plant_confinement_case(case: dict, work: Path) -> Path:
    """Lay out one case of confinement.json under ``work``; the loaders must refuse the bundle it returns.

    work/bundle is a copy of the shared bundle, work/outside/evil.onnx a real graph (the bundle's own
    step graph) beside it. ``{outside}`` in the entry stands for work/outside made absolute; ``symlink``
    names a link inside the bundle pointing at work/outside. The entry is listed in ``files`` with the
    planted file's true sha256 and, for ``use_as: step graph``, becomes the fp32 step graph: only the
    path gives it away. The C++ test (native/tests/test_runtime.cpp) lays the cases out the same way.
    """
    from sdqes_edge.files import file_sha256

    bundle, outside = work / "bundle", work / "outside"
    shutil.copytree(VECTORS / "bundle", bundle)
    outside.mkdir()
    evil = outside / "evil.onnx"
    shutil.copy(bundle / "step.fp32.onnx", evil)
    if "symlink" in case:
        (bundle / case["symlink"]).symlink_to(outside, target_is_directory=True)
    entry = case["entry"].replace("{outside}", str(outside.resolve()))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][entry] = {"sha256": file_sha256(evil), "bytes": evil.stat().st_size}
    if case["use_as"] == "step graph":
        manifest["graphs"]["step"]["fp32"]["file"] = entry
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return bundle


def preprocess_expected(image: np.ndarray, size: int) -> np.ndarray:
    from sdqes_edge.config import CLIP_MEAN, CLIP_STD
    from sdqes_edge.runtime.preprocess import Preprocessor

    return Preprocessor(size, CLIP_MEAN, CLIP_STD)(image)


def write_sampling(out: Path = VECTORS) -> None:
    cases = [dict(case, expected=sampling_counts(case)) for case in SAMPLING_CASES]
    (out / "sampling.json").write_text(json.dumps(cases, indent=2) + "\n")
    (out / "source_names.json").write_text(json.dumps(source_name_cases(), indent=2, ensure_ascii=False) + "\n")
    policies = [dict(case, expected=query_policy(case)) for case in QUERY_POLICY_CASES]
    (out / "query_policies.json").write_text(json.dumps(policies, indent=2) + "\n")
    (out / "alert_events.json").write_text(json.dumps(alert_event_lines(), indent=2) + "\n")
    (out / "source_kinds.json").write_text(json.dumps(source_kind_cases(), indent=2) + "\n")
    records = [dict(case, expected=training_data_words(case["record"])) for case in TRAINING_RECORDS]
    weights = [dict(case, expected=random_weights_words(case["manifest"])) for case in RANDOM_WEIGHTS]
    (out / "random_weights.json").write_text(json.dumps(weights, indent=2) + "\n")
    (out / "training_data.json").write_text(json.dumps(records, indent=2) + "\n")
    pacing = [dict(case, expected=pace_problem(case)) for case in PACING_CASES]
    (out / "pacing.json").write_text(json.dumps(pacing, indent=2) + "\n")


def write(out: Path = VECTORS) -> None:
    from sdqes_edge.config import CLIP_MEAN, CLIP_STD
    from sdqes_edge.files import file_sha256
    from sdqes_edge.sample import sample_frames

    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, h, w, seed, size in PREPROCESS_CASES:
        image = sample_frames(1, h, w, seed=seed)[0]
        cv2.imwrite(str(out / name), image)  # PNG: lossless, so both sides read the same pixels
        expected = preprocess_expected(cv2.imread(str(out / name)), size)
        expected.astype("<f4").tofile(out / (name[:-4] + f".{size}.f32"))
        cases.append({"image": name, "image_size": size, "expected": name[:-4] + f".{size}.f32",
                      "shape": list(expected.shape), "mean": list(CLIP_MEAN), "std": list(CLIP_STD)})
    (out / "preprocess.json").write_text(json.dumps(cases, indent=2) + "\n")

    rng = np.random.default_rng(3)
    alerts = []
    for case in ALERT_CASES:
        noise = np.clip(0.6 + 0.15 * np.sin(np.arange(60) / 3.0) + rng.normal(0, 0.05, 60), 0, 1)
        probs = case.get("probs", np.round(noise, 4).tolist())
        alerts.append(dict(case, probs=probs, expected=alert_frames(case["policy"], probs, case["fps"])))
    (out / "alerts.json").write_text(json.dumps(alerts, indent=2) + "\n")
    write_sampling(out)

    # A small bundle: a real tiny export's manifest and queries, with the large graphs replaced by stubs
    # (hashes recomputed), so the manifest logic is shared without committing megabytes.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import random_model

    from sdqes_edge.export import ExportOptions, Query, export_bundle

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "b"
        export_bundle(random_model("qrnn"), source,
                      ExportOptions(show_progress=False, verify_frames=16,
                                    queries=(Query("When I start to clean the table, remind me to wash my hands.",
                                                   "Wash your hands."),)), log=lambda m: None)
        bundle = out / "bundle"
        shutil.rmtree(bundle, ignore_errors=True)
        bundle.mkdir()
        manifest = json.loads((source / "manifest.json").read_text())
        for name in manifest["files"]:
            target = bundle / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if name.endswith(".onnx"):
                target.write_bytes(stub_graph(name))
            elif name.endswith(".gz"):
                target.write_bytes(f"stub of {name} for the native manifest tests\n".encode())
            else:
                shutil.copy(source / name, target)
            manifest["files"][name] = {"sha256": file_sha256(target), "bytes": target.stat().st_size}
        manifest["created"] = "2026-01-01T00:00:00Z"
        (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        expected = {"state": manifest["state"], "image_size": manifest["image_size"], "fps": manifest["fps"],
                    "default_threshold": manifest["thresholds"]["default"], "embed_dim": manifest["embed_dim"],
                    "queries": [q["text"] for q in json.loads((bundle / "queries.json").read_text())],
                    "query_embeddings": np.load(bundle / "query_embeddings.npy").tolist()}
        (out / "bundle_expected.json").write_text(json.dumps(expected, indent=2) + "\n")


def stub_graph(name: str) -> bytes:
    """An ONNX ModelProto holding only its doc_string (field 6): a graph file the loader reads (it looks for
    external data in every graph), which nothing runs."""
    doc = f"stub of {name} for the native manifest tests".encode()
    assert len(doc) < 128  # its length is then one byte of the wire format
    return bytes([6 << 3 | 2, len(doc)]) + doc


if __name__ == "__main__":
    write()
    print(f"wrote {VECTORS}")
