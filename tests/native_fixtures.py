"""The native (C++) build the native tests share: built once a session, with sdqes-run's ONNX Runtime backend where
it can be (ONNX Runtime's C API headers, as `build-ort-ops` fetches them, and the library the onnxruntime wheel
carries), so that sdqes-run's whole streaming loop runs here, where TensorRT cannot; the bundles, video and
Python runtime's alerts that sdqes-run's tests and the C API's compare with; and the C API bound through ctypes."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from runtime_fixtures import write_video

from sdqes_edge.cli import run
from sdqes_edge.export import ExportOptions, Query, export_bundle
from sdqes_edge.runtime.ort_releases import onnxruntime_release
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores

REPO = Path(__file__).resolve().parents[1]
ORT_OPS_BUILD = REPO / "runtime" / "ort_ops" / "build.sh"
# -O1, not the Release build's -O3: the same code and warnings in 56 s instead of 79 on two cores (the suite's
# slowest set-up); what is tested is the code, not the optimizer.
TEST_BUILD_TYPE = ["-DCMAKE_BUILD_TYPE=None", "-DCMAKE_CXX_FLAGS=-O1"]
# Why the build has no ONNX Runtime backend ("" when it has one): the tests that need it skip with it.
ONNXRUNTIME_LEFT_OUT: dict[str, str] = {}


def headers_release() -> tuple[int, int]:
    """The ONNX Runtime release whose C API headers build-ort-ops fetches (its pinned Debian package)."""
    found = re.search(r'headers_deb="libonnxruntime-dev_(\d+)\.(\d+)\.', ORT_OPS_BUILD.read_text())
    return int(found.group(1)), int(found.group(2))


def onnxruntime_options(kernel_build, lib_dir: Path) -> list[str] | str:
    """CMake options that build the ONNX Runtime backend against the installed wheel's library, or why not."""
    import onnxruntime

    done, library = kernel_build
    include = library.parent / "headers" / "usr" / "include" / "onnxruntime"
    if not (include / "onnxruntime_cxx_api.h").is_file():
        return f"ONNX Runtime's C API headers could not be fetched ({done.stderr.strip()[-200:]})"
    if onnxruntime_release(onnxruntime.__version__) < headers_release():
        return (f"the installed ONNX Runtime {onnxruntime.__version__} is older than the headers "
                f"({'.'.join(map(str, headers_release()))}) the backend is built against")
    shipped = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so.*"))
    if not shipped:
        return f"the onnxruntime {onnxruntime.__version__} wheel carries no libonnxruntime.so"
    lib_dir.mkdir(parents=True, exist_ok=True)
    for name in ("libonnxruntime.so", "libonnxruntime.so.1"):  # the name linked to, and its soname
        (lib_dir / name).symlink_to(shipped[0])
    return [f"-DONNXRUNTIME_INCLUDE_DIR={include}", f"-DONNXRUNTIME_LIBRARY={lib_dir / 'libonnxruntime.so'}"]


@pytest.fixture(scope="session")
def native_build(tmp_path_factory, cpu_kernel_build):
    """cmake -B build && cmake --build build: skipped, with CMake's reason, where a dependency is missing. Built once
    for the whole run: the first of pytest-xdist's workers to need it builds it, the others wait and take it (each
    had built its own at once, both on the same two cores, the slowest set-up of the suite twice over)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed (scripts/setup.sh --dev installs it as root)")
    run_folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's folder lies in the run's own
        run_folder = run_folder.parent
    build, outcome = run_folder / "native-build", run_folder / "native-build.json"
    with open(run_folder / "native-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # let go as the file closes
        if not outcome.exists():
            outcome.write_text(json.dumps(_build_native(build, cpu_kernel_build)))
    built = json.loads(outcome.read_text())
    ONNXRUNTIME_LEFT_OUT["reason"] = built["onnxruntime_left_out"]
    if built["skipped"]:
        pytest.skip(built["skipped"])
    assert not built["failed"], built["failed"]
    return build


def _build_native(build: Path, kernel_build) -> dict[str, str]:
    """Configure and build into ``build`` -> why a dependency is missing ("skipped"), the build's errors
    ("failed"), and why it has no ONNX Runtime backend ("onnxruntime_left_out"), each "" where not so."""
    options = onnxruntime_options(kernel_build, build.parent / f"{build.name}-onnxruntime")
    outcome = {"onnxruntime_left_out": options if isinstance(options, str) else "", "skipped": "", "failed": ""}
    configure = subprocess.run(["cmake", "-B", str(build), "-S", str(REPO), *TEST_BUILD_TYPE,
                                *(options if isinstance(options, list) else [])], capture_output=True, text=True)
    if configure.returncode != 0:
        missing = [line.strip() for line in (configure.stdout + configure.stderr).splitlines()
                   if "Could NOT find" in line or "Could not find" in line]
        outcome["skipped"] = "native dependencies missing: " + ("; ".join(missing) or configure.stderr.strip()[-300:])
        return outcome
    print([line for line in configure.stdout.splitlines() if "sdqes:" in line])
    built = subprocess.run(["cmake", "--build", str(build), "-j", "2"], capture_output=True, text=True)
    if built.returncode != 0:
        outcome["failed"] = built.stdout[-3000:] + built.stderr[-3000:]
    return outcome


@pytest.fixture(scope="session")
def sdqes_run_on_the_cpu(native_build) -> Path:
    """The built sdqes-run, where it has its ONNX Runtime backend; skipped, saying why, where it has not."""
    if ONNXRUNTIME_LEFT_OUT.get("reason"):
        pytest.skip("sdqes-run was built without ONNX Runtime: " + ONNXRUNTIME_LEFT_OUT["reason"])
    return native_build / "sdqes-run"


# What sdqes-run's tests and the C API's stream, made once a session: `bundles` (`bundle`, its plain one) and
# `video`; a module with fixtures of these names of its own uses its own. The queries are encoded into the
# bundles: sdqes-run and the C API have no text encoder.
QUERIES = (Query("When I start to clean the table, remind me to wash my hands.", "Wash your hands."),
           Query("Tell me when the kettle boils.", "Tea!"))


@pytest.fixture(scope="session")
def bundles(tmp_path_factory) -> dict[str, str]:
    """One tiny QRNN model sampling at 5 fps, with two queries encoded into it (sdqes-run has no text encoder):
    "plain", and "fused" (exported with --fuse-queries: its step graph scores the queries itself)."""
    from conftest import random_model  # here: conftest names this module among its plugins

    root = tmp_path_factory.mktemp("native-ort")
    for name in ("plain", "fused"):
        export_bundle(random_model("qrnn"), root / name, ExportOptions(show_progress=False, fps=5.0, verify_frames=16,
                                                                       queries=QUERIES, fuse_queries=name == "fused"),
                      log=lambda m: None)
    return {name: str(root / name) for name in ("plain", "fused")}


@pytest.fixture(scope="session")
def bundle(bundles) -> str:
    return bundles["plain"]


@pytest.fixture(scope="session")
def video(tmp_path_factory) -> str:
    """15 s of the sample scene at 10 fps: 75 steps at the bundle's 5."""
    return str(write_video(tmp_path_factory.mktemp("native-video") / "kitchen.avi", sample_frames(150, 96, 128)))


def alerts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def python_alerts_at_a_busy_threshold(bundle: str, video: str, tmp_path: Path) -> tuple[str, list[dict]]:
    """A threshold the first query's score crosses again and again (its median over the video), and the alerts
    `sdqes-edge run` gives at it: a state carried wrong, or not at all, would move a crossing."""
    assert run(["run", bundle, "--source", video, "--scores", str(tmp_path / "scores"), "--quiet"]) == 0
    probs = np.asarray(load_scores(next((tmp_path / "scores").glob("*.npz"))).probs)
    threshold = f"{np.median(probs[:, 0]):.6f}"
    log = tmp_path / "python.jsonl"
    assert run(["run", bundle, "--source", video, "--threshold", threshold, "--events", str(log), "--quiet"]) == 0
    assert len(alerts(log)) >= 4, "the threshold is crossed too seldom to show anything"
    return threshold, alerts(log)


STREAMS = 3  # the streams three_camera_bundles step at once


@pytest.fixture(scope="session")
def three_camera_bundles(tmp_path_factory) -> dict[str, Path]:
    """The tiny QRNN model of `bundles` exported with --batch 3, three cameras in one graph: "plain" and "fused"."""
    from conftest import random_model

    root = tmp_path_factory.mktemp("three-cameras")
    for name in ("plain", "fused"):
        export_bundle(random_model("qrnn"), root / name,
                      ExportOptions(show_progress=False, fps=5.0, verify_frames=16, batch=STREAMS, queries=QUERIES,
                                    fuse_queries=name == "fused"), log=lambda m: None)
    return {name: root / name for name in ("plain", "fused")}


# --- the C API (libsdqes.so) as another language binds it ---------------------------------------------------------

class CApi:
    """libsdqes.so through ctypes, as another language binds it: each function given its C signature."""

    def __init__(self, library: Path):
        import ctypes
        from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_size_t, c_uint8, c_void_p

        self.ctypes, self.lib = ctypes, ctypes.CDLL(str(library))
        error = [c_char_p, c_size_t]
        for name, result, arguments in (
                ("sdqes_bundle_open", c_void_p, [c_char_p, *error]),
                ("sdqes_bundle_close", None, [c_void_p]),
                ("sdqes_bundle_image_size", c_int, [c_void_p]),
                ("sdqes_bundle_query_count", c_int, [c_void_p]),
                ("sdqes_bundle_query_text", c_char_p, [c_void_p, c_int]),
                ("sdqes_preprocess", c_int, [c_void_p, POINTER(c_uint8), c_int, c_int, POINTER(c_float), *error]),
                ("sdqes_preprocess_rgb", c_int, [c_void_p, POINTER(c_uint8), c_int, c_int, POINTER(c_float),
                                                 *error]),
                ("sdqes_step_open", c_void_p, [c_void_p, c_char_p, c_char_p, c_int, *error]),
                ("sdqes_step_run", c_int, [c_void_p, POINTER(c_float), POINTER(c_float), *error]),
                ("sdqes_step_reset", c_int, [c_void_p]),
                ("sdqes_step_streams", c_int, [c_void_p]),
                ("sdqes_step_run_streams", c_int, [c_void_p, POINTER(POINTER(c_float)), POINTER(c_float), *error]),
                ("sdqes_step_reset_stream", c_int, [c_void_p, c_int, *error]),
                ("sdqes_step_save_memory", c_int, [c_void_p, c_int, c_char_p, *error]),
                ("sdqes_step_load_memory", c_int, [c_void_p, c_int, c_char_p, *error]),
                ("sdqes_step_description", c_char_p, [c_void_p]),
                ("sdqes_step_close", None, [c_void_p]),
                ("sdqes_alert_new", c_void_p, [c_double, c_double, c_double, c_int, *error]),
                ("sdqes_alert_for_label", c_void_p, [c_void_p, c_char_p, *error]),
                ("sdqes_alert_update", c_int, [c_void_p, c_double, c_double]),
                ("sdqes_alert_pace_problem", c_char_p, [c_void_p]),
                ("sdqes_alert_free", None, [c_void_p])):
            function = getattr(self.lib, name)
            function.restype, function.argtypes = result, arguments
        self.error = ctypes.create_string_buffer(512)

    def __getattr__(self, name: str):
        return getattr(self.lib, f"sdqes_{name}")

    def floats(self, array: np.ndarray):
        return array.ctypes.data_as(self.ctypes.POINTER(self.ctypes.c_float))

    def said(self) -> str:
        return self.error.value.decode()

    def frame_pointers(self, frames: list[np.ndarray | None]):
        """A C array of float pointers, NULL for None."""
        pointer = self.ctypes.POINTER(self.ctypes.c_float)
        return (pointer * len(frames))(*(pointer() if f is None else self.floats(f) for f in frames))


def preprocessed(api: CApi, bundle, images: list[np.ndarray]) -> list[np.ndarray]:
    """Each image preprocessed by sdqes_preprocess, as a C caller does."""
    size, frames = api.bundle_image_size(bundle), []
    for image in images:
        frames.append(np.empty((3, size, size), np.float32))
        assert api.preprocess(bundle, image.ctypes.data_as(api.ctypes.POINTER(api.ctypes.c_uint8)), image.shape[0],
                              image.shape[1], api.floats(frames[-1]), api.error, len(api.error)) == 0, api.said()
    return frames
