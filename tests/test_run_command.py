"""``sdqes-edge run`` as a user runs it: a separate process, torch blocked, signals, damaged files, bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import warnings

import cv2
import numpy as np
import pytest
from conftest import random_model
from runtime_fixtures import FPS, QUERY, write_video

from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.metrics import rising_edges
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.runtime.sinks import ScoreTraceRecorder
from sdqes_edge.runtime.sources import open_source
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores


def run_cli(*args: str, block_torch: bool = False, **popen) -> subprocess.CompletedProcess:
    prefix = "import sys; sys.modules['torch'] = None\n" if block_torch else "import sys\n"
    code = prefix + "from sdqes_edge.cli import run\nsys.exit(run(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, **popen)


def test_the_run_command_streams_a_video_where_torch_cannot_be_imported(exported, tmp_path):
    """... and writes every output, making the folders that do not exist yet."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.mp4", sample_frames(40, 120, 160))
    done = run_cli("run", str(bundle), "--source", str(video), "--query", QUERY, "--message", "Sanitize!",
                   "--threshold", "0.01", "--events", str(tmp_path / "e.jsonl"), "--scores", str(tmp_path / "s"),
                   "--annotate", str(tmp_path / "videos" / "annotated.avi"), block_torch=True)
    assert done.returncode == 0, done.stderr
    assert "Sanitize!" in done.stdout and "next: sdqes-edge eval" in done.stderr
    assert "was trained on" not in done.stderr  # a bundle without a training record gets no note
    events = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [e["frame_index"] for e in events] == [0] and events[0]["message"] == "Sanitize!"
    assert load_scores(tmp_path / "s" / "clip.npz").probs.shape == (20, 1)
    annotated = cv2.VideoCapture(str(tmp_path / "videos" / "annotated.avi"))
    assert annotated.isOpened() and int(annotated.get(cv2.CAP_PROP_FRAME_COUNT)) == 20


def test_ctrl_c_mid_stream_leaves_a_complete_alert_log(exported, tmp_path):
    _, bundle = exported
    video = write_video(tmp_path / "long.avi", sample_frames(900, 60, 80), fps=30.0)  # 30 s: 150 steps at 5 fps
    # The full run, to know every alert the interrupted one should have logged up to its end.
    reference = StreamingDetector(bundle)
    query = reference.add_query(QUERY, threshold=0.5)
    trace = tmp_path / "full.npz"
    reference.add_sink(ScoreTraceRecorder(trace, "long", FPS))
    list(reference.run(open_source(str(video), FPS)))
    probs = load_scores(trace).probs[:, 0]
    threshold = float(np.median(probs))
    all_alerts = rising_edges(probs, threshold).tolist()
    assert len(all_alerts) > 10, query

    events = tmp_path / "events.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video),
                                "--query", QUERY, "--threshold", str(threshold), "--events", str(events), "--quiet",
                                "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not events.exists() or len(events.read_text().splitlines()) < 3):
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    lines = events.read_text().splitlines()
    logged = [json.loads(line)["frame_index"] for line in lines]  # every line parses
    print(f"stopped with exit code {process.returncode} after {len(logged)} of {len(all_alerts)} alerts")
    assert logged == all_alerts[: len(logged)] and len(logged) >= 3
    if process.returncode == 130:  # stopped mid-stream (a fast machine may finish first: then 0, all logged)
        assert "interrupted after" in stderr and "Traceback" not in stderr
    else:
        assert process.returncode == 0 and logged == all_alerts


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_mid_stream_finishes_the_frame_and_leaves_every_output_playable(signum, exported, tmp_path):
    """docker stop, systemd and `timeout` send SIGTERM: treated as Ctrl-C, exit 128 + the signal's number."""
    _, bundle = exported
    video = write_video(tmp_path / "long.avi", sample_frames(1800, 48, 64), fps=30.0)  # 60 s: 300 steps at 5 fps
    annotated, scores, events = tmp_path / "annotated.mp4", tmp_path / "scores.npz", tmp_path / "events.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video),
                                "--query", QUERY, "--threshold", "0.3", "--annotate", str(annotated), "--scores",
                                str(scores), "--events", str(events), "--quiet", "--threads", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = process.stderr.readline()
    assert started.startswith("streaming"), started + process.stderr.read()
    # Mid-stream: after the first frame's alert is logged (a fixed sleep was sometimes too short on a busy machine,
    # the signal then landing before any frame).
    deadline = time.monotonic() + 30
    while not (events.is_file() and events.read_text()) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr
    frames = load_scores(scores).probs.shape[0]
    print(f"stopped with exit code {process.returncode} after {frames} of 300 steps")
    if process.returncode == 0:  # a fast machine may finish before the signal arrives
        assert frames == 300
    else:
        assert process.returncode == 128 + signum and f"interrupted after {frames} frame" in stderr  # 1 frame, 2 frames
    reader = cv2.VideoCapture(str(annotated))
    decoded = 0
    while reader.read()[0]:
        decoded += 1
    assert decoded == frames > 0, "the annotated mp4 must be complete and playable"
    assert [json.loads(line)["frame_index"] for line in events.read_text().splitlines()] == [0]


@pytest.mark.parametrize("suffix", [".avi", ".mkv"])
def test_a_truncated_video_is_reported_in_a_warning_and_the_summary(suffix, exported, tmp_path):
    _, bundle = exported
    whole = write_video(tmp_path / f"whole{suffix}", sample_frames(140, 48, 64), fps=10.0)
    cut = tmp_path / f"cut{suffix}"
    data = whole.read_bytes()
    cut.write_bytes(data[: int(len(data) * 0.3)])  # what a copy stopped part-way leaves
    done = run_cli("run", str(bundle), "--source", str(cut), "--query", QUERY, "--quiet")
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if line.startswith("sdqes-edge: warning:")]
    assert len(warning) == 1 and "of the 140 frames its container lists" in warning[0], done.stderr
    assert "sdqes-edge: incomplete: cut ended after" in done.stderr
    complete = run_cli("run", str(bundle), "--source", str(whole), "--query", QUERY, "--quiet")
    assert complete.returncode == 0 and "container lists" not in complete.stderr, complete.stderr


@pytest.mark.parametrize("make_args, message", [
    (lambda b, t: ["run", str(t / "nope"), "--source", "x.mp4", "--query", "q"], "does not exist"),
    (lambda b, t: ["run", str(b), "--source", str(t / "missing.mp4"), "--query", "q"], "missing.mp4"),
    (lambda b, t: ["run", str(b), "--source", str(t / "garbage.mp4"), "--query", "q"], "cannot decode"),
    (lambda b, t: ["run", str(b), "--source", str(t / "empty.avi"), "--query", "q"], "cannot decode"),
    # OpenCV's own AVI reader, tried after FFmpeg, printed "Unexpected element. Expected: LIST. Got: ..." first
    (lambda b, t: ["run", str(b), "--source", str(t / "cut.avi"), "--query", "q"], "cannot decode a frame of"),
    (lambda b, t: ["run", str(b), "--source", str(t / "garbage.mp4"), "--query", " "], "query is empty"),
    (lambda b, t: ["run", str(b), "--source", str(t / "garbage.mp4"), "--query", "word " * 80], "77"),
    (lambda b, t: ["run", str(b), "--source", str(t / "garbage.mp4"), "--query", "q", "--threshold", "1.5"],
     "outside (0, 1)"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--max-frames", "0"], "positive number"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--max-frames", "-1"], "positive number"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--annotate", str(t / "out.gif")],
     "OpenCV writes videos as .avi, .mp4"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--annotate", str(t / "outvideo")],
     "outvideo.mp4"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--annotate", str(t / "dir.mp4")],
     "dir.mp4 is a folder; give a file path in it (e.g. "),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--annotate", str(t)],
     "/annotated.mp4)"),  # a folder without a suffix: was told to name it FOLDER.mp4
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--events", str(t / "dir.mp4")],
     "dir.mp4/alerts.jsonl)"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--events", "/proc/version"],
     "/proc/version cannot be written"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--save-state", str(t / "dir.mp4")],
     "dir.mp4/state.npz)"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--scores", str(t / "garbage.mp4" / "s")],
     "garbage.mp4 is a file, not a folder"),
    (lambda b, t: ["run", str(b), "--source", "x.mp4", "--query", "q", "--scores", "/proc/sdqes-scores"],
     "refuses new files"),
])
def test_bad_input_to_run_is_one_line_and_a_non_zero_exit(make_args, message, exported, tmp_path):
    _, bundle = exported
    (tmp_path / "garbage.mp4").write_bytes(b"\x00\x01" * 100)
    (tmp_path / "dir.mp4").mkdir()
    writer = cv2.VideoWriter(str(tmp_path / "empty.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    writer.release()
    whole = write_video(tmp_path / "whole.avi", sample_frames(12, 48, 64)).read_bytes()
    (tmp_path / "cut.avi").write_bytes(whole[:200])  # cut inside its header
    done = run_cli(*make_args(bundle, tmp_path))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_source_that_fails_before_its_first_frame_is_said_alone_without_a_summary(exported, tmp_path):
    """A failure in the middle of a stream is said after what ran and was written
    (tests/test_cameras_that_come_and_go.py); before any frame, "interrupted after 0 frames" would only say that
    nothing ran: the error is said alone."""
    _, bundle = exported
    for i in range(3):
        (tmp_path / f"frame_{i}.png").write_bytes(b"")  # no image OpenCV can read
    done = run_cli("run", str(bundle), "--source", str(tmp_path), "--query", QUERY)
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert said[-1].startswith(f"sdqes-edge: error: OpenCV cannot read any image of {tmp_path}"), said
    assert not any(line.startswith("interrupted after") for line in said), said


def test_more_sources_than_the_bundle_steps_at_once_are_refused_before_any_source_opens_or_output_starts(
        exported, tmp_path):
    _, bundle = exported  # exported for one stream at a time
    video = write_video(tmp_path / "clip.avi", sample_frames(10, 48, 64))
    events = tmp_path / "alerts.jsonl"
    done = run_cli("run", str(bundle), "--source", str(video), "--source", str(video), "--query", QUERY,
                   "--events", str(events))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "sdqes-edge: error: 2 sources but the bundle steps 1 stream(s) at once; re-export with --batch 2"]
    assert not events.exists()

def test_a_bundle_of_a_newer_format_is_refused(exported, tmp_path):
    import shutil

    _, bundle = exported
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    done = run_cli("run", str(copy), "--source", "x.mp4", "--query", "q")
    assert done.returncode == 2 and "newer than this runtime reads" in done.stderr


def test_a_reader_thread_left_running_by_an_unfinished_stream_is_stopped_before_python_exits(tmp_path):
    """A stream an exception left unfinished keeps its reader thread; one still inside OpenCV when Python
    finalizes aborts the process (exit -6). Readers are stopped and joined before that: this checks, from an
    exit handler that runs after ours, that none is left."""
    video = write_video(tmp_path / "long.mp4", sample_frames(120, 96, 128))
    code = (
        "import atexit, sys, threading\n"
        "atexit.register(lambda: print('readers left:', [t.name for t in threading.enumerate()"
        " if t.name.startswith('source-') and t.is_alive()]))\n"
        "from sdqes_edge.runtime.sources import open_source\n"
        f"frames = open_source({str(video)!r}, 30.0).threaded()\n"
        "next(frames)  # one frame taken, the rest abandoned: the generator is never closed\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "readers left: []" in done.stdout, done.stdout


def test_after_a_finished_command_python_tears_down_deaf_to_sigterm_so_a_late_signal_is_not_a_kill():
    """Once the command has returned (outputs closed), a SIGTERM landing while Python unloads ONNX Runtime and
    joins threads used to end a complete run as killed (-15). From then on SIGTERM and SIGHUP are ignored: an
    exit handler sees them so, and a SIGTERM sent there changes nothing."""
    code = (
        "import atexit, os, signal, sys\n"
        "def late():\n"
        "    print('SIGTERM ignored:', signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "atexit.register(late)\n"
        "from sdqes_edge.cli import main\n"
        "sys.argv = ['sdqes-edge', 'info', '--list-presets']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "SIGTERM ignored: True" in done.stdout and "Exception ignored" not in done.stderr


def test_an_int8_graph_on_the_cuda_provider_is_warned_about_and_nowhere_else():
    """ONNX Runtime's CUDA build runs a QDQ graph's products in float: slower than fp32, and a user would not know."""
    from sdqes_edge.runtime.onnxruntime_backend import slow_precision_words

    warning = slow_precision_words("int8", "cuda", "b")
    assert warning is not None and "\n" not in warning and "use the fp16 graph" in warning
    assert "--" not in warning  # words a Python program (precision="fp16") reads as well as the command line
    for device, precision in (("cpu", "int8"), ("tensorrt", "int8"), ("cuda", "fp16"), ("cuda", "fp32")):
        assert slow_precision_words(precision, device, "b") in (None, slow_precision_words("fp16", "cpu", "b"))
    assert slow_precision_words("int8", "tensorrt", "b") is None and slow_precision_words("fp16", "cuda", "b") is None


@pytest.fixture(scope="module")
def fp16_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16") / "bundle"
    export_bundle(random_model("qrnn"), out, ExportOptions(fps=FPS, precisions=("fp32", "fp16"), drift_frames=16,
                                                           show_progress=False), log=lambda m: None)
    return out


@pytest.mark.filterwarnings("default::sdqes_edge.runtime.onnxruntime_backend.SlowPrecisionWarning")  # shown, not raised
def test_an_fp16_graph_on_the_cpu_provider_is_warned_about_in_python_and_in_one_line_on_the_command_line(
        fp16_bundle, tmp_path, capsys):
    """ONNX Runtime's CPU provider casts around most fp16 operators: the fp16 graph ran slower than fp32 (0.67x
    in `bench --quick`). The command line said so; a Python program that asked for it got no word."""
    from sdqes_edge.cli import run
    from sdqes_edge.runtime import SlowPrecisionWarning
    from sdqes_edge.runtime.onnxruntime_backend import slow_precision_words

    with pytest.warns(SlowPrecisionWarning, match="on a CPU use fp32 or int8$") as caught:
        StreamingDetector(fp16_bundle, precision="fp16")
    assert caught[0].filename == __file__  # pointed at the program's own line
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPrecisionWarning)
        StreamingDetector(fp16_bundle, precision="fp32")
    video = write_video(tmp_path / "clip.avi", sample_frames(10, 48, 64))
    assert run(["run", str(fp16_bundle), "--source", str(video), "--query", QUERY, "--precision", "fp16",
                "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "fp16 graph" in line]
    assert warned == [f"sdqes-edge: warning: {slow_precision_words('fp16', 'cpu', fp16_bundle)}"]


def test_scores_named_like_another_kind_of_file_is_written_as_a_folder_with_a_warning(exported, tmp_path, capsys):
    """A trace is a .npz; --scores scores.json becomes a folder of SOURCE.npz, which the user is told, with the
    name that gives one file."""
    from sdqes_edge.cli import run

    _, bundle = exported
    video = write_video(tmp_path / "clip.mp4", sample_frames(10, 60, 80))
    assert run(["run", str(bundle), "--source", str(video), "--query", QUERY, "--quiet",
                "--scores", str(tmp_path / "scores.json")]) == 0
    err = capsys.readouterr().err
    assert f"warning: --scores {tmp_path / 'scores.json'} does not end in .npz, so it is a folder" in err
    assert f"for one file name it {tmp_path / 'scores.npz'}" in err
    assert load_scores(tmp_path / "scores.json" / "clip.npz").probs.shape == (5, 1)
    assert run(["run", str(bundle), "--source", str(video), "--query", QUERY, "--quiet",
                "--scores", str(tmp_path / "traces")]) == 0
    assert "warning" not in capsys.readouterr().err  # a plain folder name: as asked


def test_alerts_can_be_piped_as_jsonl_to_stdout(exported, tmp_path):
    """`--events /dev/stdout | jq ...`: a pipe cannot be fsynced (the old code died with EINVAL at the first
    alert) nor seeked; each line is written whole as it comes."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.mp4", sample_frames(10, 60, 80))
    done = run_cli("run", str(bundle), "--source", str(video), "--query", QUERY, "--threshold", "0.01",
                   "--events", "/dev/stdout", "--quiet")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert [json.loads(line)["frame_index"] for line in done.stdout.splitlines()] == [0]


def test_frames_that_change_size_mid_stream_are_all_in_the_annotated_video_fitted_to_its_size(exported, tmp_path):
    """OpenCV's writer drops every frame whose size is not its own, silently: an image folder of landscape and
    portrait images (or a camera that renegotiates) left half the frames out, and the run then blamed the disk."""
    _, bundle = exported
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i in range(6):
        height, width = (360, 480) if i % 2 == 0 else (480, 360)  # landscape, portrait, ...
        cv2.imwrite(str(folder / f"{i:03d}.png"), np.full((height, width, 3), 40 * i, np.uint8))
    done = run_cli("run", str(bundle), "--source", str(folder), "--query", QUERY,
                   "--annotate", str(tmp_path / "annotated.avi"))
    assert done.returncode == 0, done.stderr
    video = cv2.VideoCapture(str(tmp_path / "annotated.avi"))
    frames = []
    while (read := video.read())[0]:
        frames.append(read[1])
    assert len(frames) == 6 and all(f.shape == (360, 480, 3) for f in frames)  # the first frame's size
    portrait = frames[1][:300]  # above the score bars
    assert portrait[:, :100].max() < 20 and portrait[:, 110:370].mean() == pytest.approx(40, abs=3)  # between bars


def test_an_alert_of_a_live_stream_reaches_a_pipe_while_the_stream_runs(endless_stream):
    """`sdqes-edge run ... | notify`, or run under docker or systemd: stdout is a pipe, which Python writes in 8 KiB
    blocks, so a live stream's alerts reached the reader when the block filled or the command ended. Each line now
    goes out as it is written (PYTHONUNBUFFERED, which would hide the difference, is left out)."""
    import os
    import threading

    from sdqes_edge.demo import DEMO_BUNDLE

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    command = [sys.executable, "-m", "sdqes_edge.cli", "run", str(DEMO_BUNDLE), "--source", endless_stream,
               "--query", "Tell me when the blue ball starts rolling.", "--threshold", "0.01", "--ort-device", "cpu"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first_line: list[bytes] = []
    reader = threading.Thread(target=lambda: first_line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=30)  # any p > 0.01 rises at the first frame: one alert, then the stream goes on for ever
    read_while_streaming, still_streaming = list(first_line), proc.poll() is None
    proc.send_signal(signal.SIGTERM)  # (a line held back comes out now, as the command ends)
    _, err = proc.communicate(timeout=60)
    assert read_while_streaming, err.decode()[-2000:]
    assert b"Tell me when the blue ball starts rolling." in read_while_streaming[0]
    assert still_streaming and proc.returncode == 143  # read while it ran, then stopped as SIGTERM stops it



def test_a_source_named_with_a_terminals_control_characters_is_shown_not_obeyed(exported, tmp_path):
    """The run names its sources in every line it says (what streams, a source's news): a video whose file name held
    "\x1b[2J" cleared the terminal as the run began."""
    from sdqes_edge.sample import sample_frames

    _, bundle = exported
    video = write_video(tmp_path / "\x1b[2Jkitchen.avi", sample_frames(6, 48, 64))
    outputs = tmp_path / "\x1b]0;title\x07out"  # and every output named for it, or in a folder so named
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video),
                           "--query", QUERY, "--events", str(outputs / "alerts.jsonl"), "--scores", str(outputs),
                           "--annotate", str(outputs / "annotated.mp4"), "--state", str(outputs / "state.npz")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "streaming \\x1b[2Jkitchen at" in done.stderr and "\\x1b]0;title\\x07out/" in done.stderr
    assert not any(control in done.stderr + done.stdout for control in "\x1b\x07"), done.stderr
