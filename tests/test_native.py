"""The native (C++) runtime: built with CMake, its ctest suite run, and `sdqes-run` refusing bad bundles.

The shared vectors in tests/vectors/ are written by tests/native_vectors.py from the Python runtime; the
first test proves the Python runtime still produces them, the C++ tests prove the native one does.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
from native_vectors import (
    REQUIRED_PATHS,
    VECTORS,
    alert_event_lines,
    alert_frames,
    manifest_without,
    pace_problem,
    plant_confinement_case,
    preprocess_expected,
    query_policy,
    sampling_counts,
    source_kind_cases,
    source_name_cases,
)
from test_service_example import SERVICE, unit_settings

from sdqes_edge.cli import run
from sdqes_edge.train_options import random_weights_words, training_data_words

REPO = Path(__file__).resolve().parents[1]


def test_the_python_runtime_still_produces_the_shared_vectors():
    from sdqes_edge.runtime.bundle import load_bundle

    for case in json.loads((VECTORS / "preprocess.json").read_text()):
        expected = np.fromfile(VECTORS / case["expected"], dtype="<f4").reshape(case["shape"])
        got = preprocess_expected(cv2.imread(str(VECTORS / case["image"])), case["image_size"])
        np.testing.assert_array_equal(got, expected)
    for case in json.loads((VECTORS / "alerts.json").read_text()):
        assert alert_frames(case["policy"], case["probs"], case["fps"]) == case["expected"], case["name"]
    for case in json.loads((VECTORS / "sampling.json").read_text()):
        assert sampling_counts(case) == case["expected"], case["name"]
    assert source_name_cases() == json.loads((VECTORS / "source_names.json").read_text(encoding="utf-8"))
    for case in json.loads((VECTORS / "query_policies.json").read_text()):
        assert query_policy(case) == case["expected"], case["name"]
    assert alert_event_lines() == json.loads((VECTORS / "alert_events.json").read_text())
    assert source_kind_cases() == json.loads((VECTORS / "source_kinds.json").read_text())
    for case in json.loads((VECTORS / "pacing.json").read_text()):
        assert pace_problem(case) == case["expected"], case["name"]
    for case in json.loads((VECTORS / "training_data.json").read_text()):
        assert training_data_words(case["record"]) == case["expected"], case["name"]
    for case in json.loads((VECTORS / "random_weights.json").read_text()):
        assert random_weights_words(case["manifest"]) == case["expected"], case["name"]
    expected = json.loads((VECTORS / "bundle_expected.json").read_text())
    bundle = load_bundle(VECTORS / "bundle")
    assert bundle.state_spec.to_list() == expected["state"]
    items, embeddings = bundle.queries()
    assert [q["text"] for q in items] == expected["queries"]
    np.testing.assert_array_equal(embeddings, np.asarray(expected["query_embeddings"], dtype=np.float32))


CONFINEMENT_CASES = json.loads((VECTORS / "confinement.json").read_text())


@pytest.mark.parametrize("case", CONFINEMENT_CASES, ids=[c["name"] for c in CONFINEMENT_CASES])
def test_a_manifest_entry_outside_the_bundle_is_refused_before_it_is_read(case, tmp_path, monkeypatch):
    from sdqes_edge.runtime import bundle as bundle_module

    bundle = plant_confinement_case(case, tmp_path)
    hashed = []
    monkeypatch.setattr(bundle_module, "file_sha256", lambda path: hashed.append(Path(path)) or "0" * 64)
    with pytest.raises(bundle_module.BundleError, match="outside the bundle") as refused:
        bundle_module.load_bundle(bundle)
    assert "\n" not in str(refused.value)
    assert not [p for p in hashed if "outside" in p.resolve().parts], "a file outside the bundle was read"


def test_the_ctest_suite_passes(native_build):
    done = subprocess.run(["ctest", "--test-dir", str(native_build), "--output-on-failure", "-j", "2"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "tests passed" in done.stdout


def test_the_tensorrt_code_is_compiled_even_where_tensorrt_is_missing(native_build):
    """Where TensorRT is installed it is built for real; elsewhere the backend and sdqes-run's TensorRT loop are
    compiled against declarations of the API they use (native/tests/tensorrt_api/), so the build fails on them."""
    if "SDQES_WITH_TENSORRT" in (native_build / "CMakeFiles" / "sdqes_runtime.dir" / "flags.make").read_text():
        pytest.skip("TensorRT is installed: its backend is part of the real build")
    objects = native_build / "CMakeFiles" / "sdqes_tensorrt_compile_check.dir" / "native"
    assert (objects / "src" / "tensorrt_backend.cpp.o").is_file() and (objects / "tools" / "sdqes_run.cpp.o").is_file()


@pytest.mark.parametrize("case", CONFINEMENT_CASES, ids=[c["name"] for c in CONFINEMENT_CASES])
def test_sdqes_run_refuses_a_manifest_entry_outside_the_bundle(case, native_build, tmp_path):
    bundle = plant_confinement_case(case, tmp_path)
    done = subprocess.run([str(native_build / "sdqes-run"), str(bundle), "--source", "clip.mp4"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "outside the bundle" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> str:
    """A --source that is there: sdqes-run looks at what its source is before it looks for an engine."""
    path = tmp_path_factory.mktemp("source") / "clip.mp4"
    path.write_bytes(b"")
    return str(path)


@pytest.mark.parametrize("damage, message", [
    (lambda b: (b / "manifest.json").write_text("{"), "not valid JSON"),
    (lambda b: (b / "manifest.json").write_text(re.sub(r'"fps": [0-9.]+', '"fps": NaN',
                                                       (b / "manifest.json").read_text())), "not valid JSON"),
    # The fps is the user's to edit: 1e300 stepped the first frame without end, 0 streamed nothing and said done.
    *[(lambda b, fps=fps: (b / "manifest.json").write_text(re.sub(r'"fps": [0-9.]+', f'"fps": {fps}',
                                                                  (b / "manifest.json").read_text())),
       f"is malformed at fps: {fps} is not a rate in (0, 1000] frames per second; set it there, or re-export")
      for fps in ("0", "-1", "1e+300")],
    (lambda b: (b / "text.onnx").write_bytes(b"changed"), "text.onnx does not match the sha256"),
    (lambda b: None, "no fp16 TensorRT engine"),
])
def test_sdqes_run_refuses_a_bad_bundle_in_one_line(damage, message, native_build, tmp_path, clip):
    bundle = tmp_path / "bundle"
    shutil.copytree(VECTORS / "bundle", bundle)
    damage(bundle)
    done = subprocess.run([str(native_build / "sdqes-run"), str(bundle), "--source", clip, "--backend", "tensorrt"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_sdqes_run_shows_the_control_characters_a_line_quotes_rather_than_obeying_them(native_build, tmp_path):
    """Every line on stderr (a refusal quoting a path, a reader's news naming a source) as alerts on stdout are."""
    source = str(tmp_path / "\x1b[2K\rclip.mp4")
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), "--source", source],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "\\x1b[2K\\rclip.mp4 is neither" in done.stderr, done.stderr
    assert "\x1b" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("option, value, message", [
    ("--threshold", "0.5x", "--threshold needs a finite number, not '0.5x'"),  # std::stod read it as 0.5
    ("--threshold", "nan", "--threshold needs a finite number, not 'nan'"),
    ("--cooldown", "nan", "--cooldown needs a finite number, not 'nan'"),
    ("--max-frames", "0", "--max-frames needs a whole number of at least 1, not '0'"),  # streamed to the end
    ("--max-frames", "-3", "--max-frames needs a whole number of at least 1, not '-3'"),
    ("--max-alerts", "2.5", "--max-alerts needs a whole number of at least 1, not '2.5'"),  # taken as 2
    ("--source", "99999999999999999999", "--source needs a whole number of at least 0"),  # std::stoi's "stoi"
    ("--precision", "fp64", "--precision fp64 is not one of fp16, fp32, int8"),  # "build a fp64 engine"
    ("--state", "/no/such/folder/state.json", "--state /no/such/folder/state.json: the folder /no/such/folder does "
     "not exist; make it first (mkdir -p /no/such/folder)"),  # found only at the first alert, hours in
    ("--state", str(VECTORS), f"--state {VECTORS} is a folder; give a file in it ({VECTORS / 'state.json'})"),
    ("--events", "/no/such/folder/alerts.jsonl", "--events /no/such/folder/alerts.jsonl: the folder /no/such/folder "
     "does not exist; make it first (mkdir -p /no/such/folder)"),  # "cannot open ... for writing", engine loaded
    ("--events", str(VECTORS), f"--events {VECTORS} is a folder; give a file in it ({VECTORS / 'alerts.jsonl'})"),
    ("--events", f"/tmp/{'a' * 300}.jsonl", "has a name longer than its file system holds (File name too long: most "
     "hold 255 bytes a name); give a shorter name"),  # std::filesystem's "filesystem error: status: ..."
    ("--threads", "0", "--threads needs a whole number of at least 1, not '0'"),
    ("--backend", "cuda", "--backend cuda is not one of tensorrt, onnxruntime"),
    ("--stream-timeout", "0", "--stream-timeout needs at least 0.1 s, not '0'"),  # FFmpeg's timeouts in whole ms
    ("--stream-timeout", "nan", "--stream-timeout needs a finite number, not 'nan'"),
    ("--cooldown", "-1", "--cooldown needs at least 0 s, not '-1'"),  # "cooldown must be ..." named no option
    ("--threshold", "1.5", "--threshold 1.5 is outside (0, 1): it is a probability sigmoid(cos)"),  # "1.500000"
    ("--exit-threshold", "1", "--exit-threshold 1 is outside [0, 1): a query stays on until its p falls to it"),
])
def test_sdqes_run_refuses_a_bad_option_value_in_one_line_before_it_looks_for_an_engine(option, value, message,
                                                                                        native_build, clip):
    args = {"--source": clip, option: value}
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), *sum(args.items(), ())],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("options, says", [
    (["--threshold", "0.5", "--exit-threshold", "0.9"],
     "--exit-threshold 0.9 is above --threshold 0.5: a query stays on until its p falls to it"),
    # p = sigmoid(cos) is at most 0.7311: a query at 0.9 never alerted, without a word.
    (["--threshold", "0.9"], "--threshold 0.9 is never reached: p = sigmoid(cos) is at most 0.7311 (a cosine"),
])
def test_sdqes_run_refuses_an_alert_policy_no_query_can_use_in_the_words_of_sdqes_edge_run(options, says, native_build,
                                                                                          clip, capsys):
    options = ["--source", clip, *options]
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), *options],
                          capture_output=True, text=True)
    assert run(["run", str(VECTORS / "bundle"), *options]) == done.returncode == 2
    python_says = capsys.readouterr().err
    assert python_says.replace("sdqes-edge:", "sdqes-run:") == done.stderr, done.stderr
    assert says in done.stderr


@pytest.mark.parametrize("threshold, says", [
    # p = sigmoid(cos) is at least 0.2689: every query at 0.1 alerted at its first frame alone, without a word.
    ("0.1", "is below every score: p = sigmoid(cos) is at least 0.2689 (a cosine is at least -1), so the query alerts "
            "at its first frame and never again; give one between 0.2689 and 0.7311"),
    ("0.5", None),
])
def test_sdqes_run_says_a_threshold_below_every_score_once_in_the_words_of_sdqes_edge_run(threshold, says, bundle,
                                                                                         video, native_build, capsys):
    """Once for its two queries, as each is given it; before its engine is loaded (a run without one says it too)."""
    options = ["--source", video, "--threshold", threshold, "--max-frames", "1"]
    done = subprocess.run([str(native_build / "sdqes-run"), bundle, *options], capture_output=True, text=True)
    assert run(["run", bundle, *options]) == 0
    python_says = [line for line in capsys.readouterr().err.splitlines() if "warning: the threshold" in line]
    native_says = [line for line in done.stderr.splitlines() if "warning: the threshold" in line]
    assert native_says == [line.replace("sdqes-edge:", "sdqes-run:") for line in python_says]
    assert len(native_says) == (says is not None) and (says is None or says in native_says[0]), done.stderr


@pytest.mark.parametrize("source, message, status", [
    ("/no/such/kitchen.mp4", "--source /no/such/kitchen.mp4 is neither a video file, a camera index nor a stream URL",
     2),
    (str(VECTORS), f"--source {VECTORS} is a folder; sdqes-run reads a video, a camera or a stream", 2),
    # A camera not (yet) plugged in: the machine's state, which a service manager's restart may mend.
    ("/dev/v4l/by-id/usb-none-video-index0", "no camera at /dev/v4l/by-id/usb-none-video-index0; check it is "
     "connected", 1),
])
def test_sdqes_run_says_what_its_source_is_not_as_sdqes_edge_run_does(source, message, status, native_build):
    """As `sdqes-edge run`: a mistake in the command exits 2, a camera that is not there 1; one line, before any
    engine is looked for."""
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), "--source", source],
                          capture_output=True, text=True)
    assert (done.returncode, len(done.stderr.strip().splitlines())) == (status, 1), done.stderr
    assert message in done.stderr


def test_sdqes_run_names_a_file_given_as_the_bundle_a_file(native_build):
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle" / "manifest.json"), "--source",
                           "clip.mp4"], capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "manifest.json is a file, not a folder; give the folder `sdqes-edge export --out` wrote" in done.stderr


@pytest.mark.parametrize("path", REQUIRED_PATHS, ids=["/".join(map(str, p)) for p in REQUIRED_PATHS])
def test_sdqes_run_refuses_a_manifest_without_a_key_the_schema_requires(path, native_build, tmp_path):
    """The native runtime does not read the JSON Schema; it is held to it here, key by key."""
    done = subprocess.run([str(native_build / "sdqes-run"), str(manifest_without(path, tmp_path)), "--source",
                           "clip.mp4"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "malformed" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_sdqes_run_unit_runs_a_command_sdqes_run_takes_and_names_the_exit_statuses_it_gives(native_build,
                                                                                              tmp_path):
    """docs/service/sdqes-run.service: its options, on a bundle here (which has no engine), are read whole and pass
    every check up to the engine lookup; a stop, a mistake and a lost camera exit as the unit says."""
    settings = unit_settings(SERVICE / "sdqes-run.service")
    argv = shlex.split(settings["ExecStart"])
    assert Path(argv[0]).name == "sdqes-run" and argv[2:4] == ["--source", "0"]
    assert argv[argv.index("--backend") + 1] == "tensorrt"  # the GPU it is for, whichever backends the build has
    options = [str(tmp_path / Path(arg).name) if arg.startswith("/var/") else arg for arg in argv[2:]]
    assert "--state" in options and "--events" in options
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), *options], capture_output=True,
                          text=True)
    assert "no fp16 TensorRT engine" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert settings["RestartPreventExitStatus"] == str(done.returncode) == "2"  # a mistake: restarting cannot mend it
    assert settings["SuccessExitStatus"] == str(128 + signal.SIGTERM)  # StopOnSignal's exit code, a GoogleTest case
    assert settings["Restart"] == "on-failure" and settings["Type"] == "notify"  # exit 1: a camera gone, restarted


def test_threads_given_to_the_tensorrt_backend_are_left_out_with_a_warning(native_build, clip):
    """Ultralytics' way with an option that does not apply: said, then the run goes on without it."""
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), "--source", clip, "--backend",
                           "tensorrt", "--threads", "2"], capture_output=True, text=True)
    lines = done.stderr.strip().splitlines()
    assert lines[0] == ("sdqes-run: warning: --threads is for the ONNX Runtime backend; TensorRT steps on the GPU, so "
                        "it is left out")
    assert "no fp16 TensorRT engine" in lines[1] and done.returncode == 2


def test_sdqes_run_and_the_c_api_say_the_release_they_were_built_from(native_build):
    """A robot's log names what it runs: `sdqes-run --version` and sdqes_version() give the package's release (read
    from pyproject.toml, its one place, as `sdqes-edge --version` gives it), and sdqes-run the backends it has."""
    import ctypes

    from native_fixtures import ONNXRUNTIME_LEFT_OUT

    import sdqes_edge

    done = subprocess.run([str(native_build / "sdqes-run"), "--version"], capture_output=True, text=True)
    onnxruntime = "" if ONNXRUNTIME_LEFT_OUT["reason"] else "onnxruntime"
    backends = {", ".join(filter(None, ["tensorrt", onnxruntime])), onnxruntime or "none"}  # TensorRT where it is
    assert done.returncode == 0 and done.stdout.startswith(f"sdqes-run {sdqes_edge.__version__} (backends: ")
    assert done.stdout.removeprefix(f"sdqes-run {sdqes_edge.__version__} (backends: ")[:-2] in backends, done.stdout
    library = ctypes.CDLL(str(native_build / "libsdqes.so"))
    library.sdqes_version.restype = ctypes.c_char_p
    assert library.sdqes_version().decode() == sdqes_edge.__version__
