"""Outputs that cannot be finished because the machine refuses the bytes (a full disk, a quota): the run names
the output that is incomplete and exits 1, every other output is finished, and nothing half-written is left
behind. The refusal is real: the process runs under a file-size limit (RLIMIT_FSIZE), so every write past it
fails with EFBIG, as writes fail on a disk that filled up."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager

import cv2
import numpy as np
import pytest
from runtime_fixtures import QUERY, write_video

from sdqes_edge.files import replaced_atomically, staged_directory
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import StreamScores, load_scores, save_scores

FILE_LIMIT = 64 * 1024  # bytes a file may grow to: the annotated video passes it, the other outputs do not
# The runs' --threshold 0.3: below every score of an untrained model (about 0.5), inside those p = sigmoid(cos) can
# take ([0.2689, 0.7311]): one alert, at frame 0.


def _limit_file_size(limit: int = FILE_LIMIT) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer instead of failing the write
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@contextmanager
def file_size_limit(limit: int = FILE_LIMIT):
    """The limit on this process for the block (the test runner's own files stay small meanwhile)."""
    old_limit, old_handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.getsignal(signal.SIGXFSZ)
    _limit_file_size(limit)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_an_annotated_video_cut_off_by_the_disk_is_named_and_every_other_output_is_finished(exported, tmp_path):
    """OpenCV's writer reports no error: the mp4 lost its index (unplayable) and the run said it was written,
    exit 0. Now the video is read back at the end."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(60, 240, 320, seed=3))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video),
                           "--query", QUERY, "--threshold", "0.3", "--quiet", "--annotate", str(out / "a.mp4"),
                           "--events", str(out / "e.jsonl"), "--scores", str(out / "s.npz"),
                           "--save-state", str(out / "state.npz")],
                          capture_output=True, text=True, preexec_fn=_limit_file_size)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"error: the annotated video {out / 'a.mp4'} is incomplete: 30 frames were written and " in done.stderr
    # What ran and was written first, the video marked, then the error, as sdqes-run ends: the error had come
    # alone, and the summary, with the other outputs written, was left out.
    streaming, ran, wrote, error = done.stderr.strip().splitlines()
    assert ran.startswith("done: 30 frames, 1 alert") and error.startswith("sdqes-edge: error: the annotated video")
    assert wrote == (f"wrote {out / 'e.jsonl'}, {out / 'a.mp4'} (incomplete), {out / 'state.npz'}, "
                     f"{out / 's.npz'}")
    # Everything else is complete: the alert log, the score trace (merged), the state snapshot.
    assert [json.loads(line)["frame_index"] for line in (out / "e.jsonl").read_text().splitlines()] == [0]
    assert load_scores(out / "s.npz").probs.shape == (30, 1)
    StreamingDetector(bundle).load_state(out / "state.npz")
    assert sorted(p.name for p in out.iterdir()) == ["a.mp4", "e.jsonl", "s.npz", "state.npz"]


def test_the_annotated_video_of_a_run_with_room_is_read_back_whole(exported, tmp_path):
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(60, 240, 320, seed=3))
    from sdqes_edge.cli import run

    assert run(["run", str(bundle), "--source", str(video), "--query", QUERY, "--quiet",
                "--annotate", str(tmp_path / "a.mp4")]) == 0
    assert int(cv2.VideoCapture(str(tmp_path / "a.mp4")).get(cv2.CAP_PROP_FRAME_COUNT)) == 30


def test_a_score_trace_the_disk_cuts_off_leaves_neither_a_trace_nor_a_temporary_file(tmp_path):
    """It left its temporary file (TRACE.npz.writing) behind."""
    probs = np.zeros((50_000, 2), np.float32)  # 400 KB: past the limit
    scores = StreamScores("clip", 1.0, ["a", "b"], ["0", "1"], np.zeros(2), probs)
    with file_size_limit(), pytest.raises(OSError):
        save_scores(tmp_path / "clip.npz", scores)
    assert list(tmp_path.iterdir()) == []


def test_an_alert_log_the_disk_cuts_off_keeps_only_whole_lines_and_names_its_file(tmp_path):
    """JSONL readers stop at a half line: the line being written when the disk filled is taken back."""
    from sdqes_edge.runtime import AlertEvent, JsonlSink

    log = tmp_path / "alerts.jsonl"
    log.write_text('{"from": "an earlier run"}\n')  # appended to, never rewritten
    sink = JsonlSink(log)
    sink.log = lambda message: None  # said while the stream goes on (tests/test_alert_log_refused.py)
    event = AlertEvent("q1", QUERY, "Sanitize your hands!" * 20, "clip", 1.5, 3, 0.9, 0.2, 12.0)
    with file_size_limit(), pytest.raises(OSError) as refused:
        for _ in range(FILE_LIMIT // 400):  # past the limit: the later lines are refused, held
            sink.on_event(event)
        sink.close()  # still refused as the stream ends
    assert refused.value.filename == str(log)  # the command line's one-line error names it
    lines = log.read_text().splitlines(keepends=True)
    assert 1 < len(lines) < FILE_LIMIT // 400 and all(line.endswith("\n") for line in lines)
    assert [json.loads(line) for line in lines[1:]] == [event.to_dict()] * (len(lines) - 1)


def test_run_state_the_disk_refuses_is_said_once_and_the_stream_goes_on_to_its_end(exported, tmp_path):
    """run --state's snapshot after an alert, refused, ended the run at the next snapshot (the camera unwatched)
    with "the disk is full" and no file named. Now it is said as it happens, the stream goes on, and the snapshot at
    the end, refused too, is the run's one-line error naming the file."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(60, 240, 320, seed=3))
    out = tmp_path / "out"
    limit = 8192  # the alert log (0.4 KB) and the score trace (3 KB) fit; the state snapshot (28 KB) does not
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video),
                           "--query", QUERY, "--threshold", "0.3", "--quiet", "--events", str(out / "e.jsonl"),
                           "--scores", str(out / "s.npz"), "--state", str(out / "state.npz")],
                          capture_output=True, text=True, preexec_fn=lambda: _limit_file_size(limit))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    warning = f"warning: cannot write --state {out / 'state.npz'}: File too large (the file there, if any, is "
    assert done.stderr.count(warning + "unchanged); the stream goes on") == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"sdqes-edge: error: a file grew past the largest its file system or this process allows writing "
        f"{out / 'state.npz'} (File too large: FAT32 holds 4 GiB a file")
    assert [json.loads(line)["frame_index"] for line in (out / "e.jsonl").read_text().splitlines()] == [0]
    assert load_scores(out / "s.npz").probs.shape == (30, 1)  # every frame stepped after the refusal
    assert sorted(p.name for p in out.iterdir()) == ["e.jsonl", "s.npz"]  # no partial snapshot left


def test_run_state_refused_is_tried_again_at_each_step_past_the_interval_and_said_again_once_written(
        exported, tmp_path, monkeypatch, capsys):
    from sdqes_edge.cli import run_outputs

    _, bundle = exported
    monkeypatch.setattr(run_outputs, "ALERT_SNAPSHOT_SECONDS", 0.0)
    detector = StreamingDetector(bundle)
    state = tmp_path / "state.npz"
    in_the_way = tmp_path / f".state.npz.partial-{os.getpid()}"  # where each write's partial copy goes
    in_the_way.mkdir()
    (in_the_way / "kept").write_text("")
    saves = run_outputs.StateAfterAlerts(detector, str(state))
    saves.after_step(alerted=False)
    detector.close()  # waits for a write in flight: there is none, nothing being unsaved
    assert not state.exists() and capsys.readouterr().err == ""
    for alerted in (True, False, False):  # the alert's write refused, then each step's retry refused
        saves.after_step(alerted)
        detector.close()
    err = capsys.readouterr().err
    assert err.count(f"warning: cannot write --state {state}: Is a directory") == 1 and not state.exists(), err
    shutil.rmtree(in_the_way)  # room again
    saves.after_step(alerted=False)
    detector.close()
    assert capsys.readouterr().err == f"sdqes-edge: note: --state {state} is written again\n"
    detector.load_state(state)  # a whole snapshot
    written = state.stat().st_mtime_ns
    saves.after_step(alerted=False)  # written, and nothing new to write
    detector.close()
    assert state.stat().st_mtime_ns == written


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system (Linux has one)")
def test_an_alert_log_on_a_device_that_is_always_full_says_the_disk_is_full_not_that_a_cut_failed():
    """/dev/full is seekable but no regular file: taking the refused line back (ftruncate) raised EINVAL, and the
    run ended with a traceback instead of the full disk."""
    from sdqes_edge.runtime import AlertEvent, JsonlSink

    sink = JsonlSink("/dev/full")
    with pytest.raises(OSError) as refused:
        sink.on_event(AlertEvent("q1", QUERY, "Sanitize your hands!", "clip", 1.5, 3, 0.9, 0.2, 12.0))
    sink.close()
    assert (refused.value.errno, refused.value.filename) == (errno.ENOSPC, "/dev/full")


@pytest.mark.parametrize("stage", [replaced_atomically, staged_directory], ids=["file", "bundle folder"])
def test_a_write_the_disk_refuses_names_what_was_asked_for_and_leaves_nothing(tmp_path, stage):
    """numpy, zipfile and torch's ONNX exporter write into handles and name no file: the command line said "the disk
    is full", not where (an export to a full disk among them)."""
    target = tmp_path / "asked-for"
    with pytest.raises(OSError) as refused, stage(target) as partial:
        (partial / "step.onnx" if stage is staged_directory else partial).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert (refused.value.errno, refused.value.filename) == (errno.ENOSPC, str(target))
    assert list(tmp_path.iterdir()) == []
    elsewhere = str(tmp_path / "input.mp4")  # a refusal that names another file keeps its name
    with pytest.raises(OSError) as refused, stage(target):
        raise OSError(errno.EIO, "Input/output error", elsewhere)
    assert refused.value.filename == elsewhere


def test_a_cut_off_video_read_back_counts_no_frames_and_prints_nothing(tmp_path, capfd):
    """OpenCV's own AVI reader, tried where FFmpeg could not open the file, printed "Unexpected element. Expected:
    LIST. Got: ..." (bytes of the file among the words) above the run's one-line error: past every log level,
    which the command line silences (alone, this test saw OpenCV's own warnings, which depend on the level)."""
    from sdqes_edge.runtime.annotated_video import frames_read_back
    from sdqes_edge.runtime.sources import quiet_opencv_logs

    quiet_opencv_logs()

    whole = write_video(tmp_path / "whole.avi", sample_frames(12, 64, 64, seed=1))
    cut = tmp_path / "cut.avi"
    cut.write_bytes(whole.read_bytes()[:4096])
    assert frames_read_back(whole) == 12 and frames_read_back(cut) == 0
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("refusal, words", [
    (errno.ENOSPC, "error: the disk is full writing {out} (No space left on device); free some space"),
    (errno.EFBIG, "error: a file grew past the largest its file system or this process allows writing {out} (File "
                  "too large: FAT32 holds 4 GiB a file"),
    (errno.EROFS, "error: the disk is read-only writing {out} (Read-only file system: the kernel remounts a failing "
                  "SD card or eMMC read-only, see `dmesg`); write to another disk"),
    (errno.EIO, "error: the disk failed writing {out} (Input/output error: see `dmesg`; an SD card wears out)"),
    (errno.EACCES, "error: {out}: Permission denied, where the command's checks found it usable (were its "
                   "permissions changed while it ran?); give a path this user may use"),
], ids=["full", "file too large", "read-only", "failing", "permission taken away"])
def test_a_write_the_machine_refuses_is_one_line_naming_the_output_and_what_to_do(tmp_path, monkeypatch, capsys,
                                                                                  refusal, words):
    """The machine's state, not a bug of ours: no traceback, exit status 1. An SD card the kernel remounted read-only
    after errors, or one failing, ended a run with a traceback."""
    import sdqes_edge.synthetic as synthetic
    from sdqes_edge.cli import run

    def refused(path, stream):
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(synthetic, "write_video", refused)
    out = tmp_path / "data"
    assert run(["synth", "--out", str(out), "--train", "1", "--val", "0", "--test", "0", "--seconds", "20"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words.format(out=out) in err, err


def test_a_training_checkpoint_the_disk_refuses_is_one_line_naming_it_and_leaves_no_partial_file(tmp_path):
    """torch's own writer, refused, raised a RuntimeError ("enforce fail at inline_container.cc: unexpected pos"),
    a traceback; the checkpoint (7.6 MB) is now serialized in memory and written by Python, whose refusal is an
    OSError the command line names."""
    out = tmp_path / "trained"
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "train", "--train-streams", "2", "--val-streams",
                           "1", "--test-streams", "1", "--stream-seconds", "20", "--window", "8", "--steps", "2",
                           "--out", str(out)],
                          capture_output=True, text=True, preexec_fn=lambda: _limit_file_size(1 << 20))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"sdqes-edge: error: a file grew past the largest its file system or this process allows writing "
        f"{out / 'synthetic+qrnn.pt'} (File too large"), done.stderr
    assert not out.exists()  # made as the run took its lock, and empty as it let go: removed with it


def test_a_plot_the_disk_refuses_names_its_file_and_leaves_no_cut_image(tmp_path):
    """matplotlib writes into a handle: eval's, the demo's and the bench's plots, refused, named no file (the command
    line said "the disk is full", not where), and the cut-off PNG was left as the plot."""
    from sdqes_edge.eval_plots import _pyplot, save_figure

    plt = _pyplot()
    fig, ax = plt.subplots()
    ax.plot(np.sin(np.linspace(0, 10, 500)))
    with file_size_limit(1024), pytest.raises(OSError) as refused:  # the PNG is some 20 KB
        save_figure(fig, tmp_path / "scores.png")
    assert (refused.value.errno, refused.value.filename) == (errno.EFBIG, str(tmp_path / "scores.png"))
    assert list(tmp_path.iterdir()) == [] and not plt.fignum_exists(fig.number)
    fig, _ = plt.subplots()
    assert save_figure(fig, tmp_path / "scores.png", dpi=50) == tmp_path / "scores.png"
    assert (tmp_path / "scores.png").read_bytes()[:4] == b"\x89PNG"


def test_an_annotated_video_cut_off_at_fat32s_largest_file_says_so_and_how_to_write_it(tmp_path):
    """A long video annotated onto an SD card formatted FAT32 stops at 4 GiB, with room on the disk: "free some
    space" was the wrong advice."""
    from sdqes_edge.runtime.annotated_video import FAT32_LARGEST_FILE, incomplete_video_words

    at_the_limit = tmp_path / "long.avi"
    with open(at_the_limit, "wb") as fh:  # sparse: no 4 GiB written
        fh.truncate(FAT32_LARGEST_FILE)
    assert incomplete_video_words(at_the_limit, 90_000, 61_000) == (
        f"the annotated video {at_the_limit} is incomplete: 90000 frames were written and 61000 can be read back "
        "(4.0 GiB, the most a file holds on FAT32); write it in parts (--annotate-segment SECONDS) or to a disk "
        "formatted exFAT or ext4, and run again")
    short = tmp_path / "short.avi"
    short.write_bytes(b"RIFF")
    assert "free on its disk); free some space or write it to another disk" in incomplete_video_words(short, 30, 0)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system (Linux has one)")
def test_alerts_printed_on_a_stdout_the_disk_refuses_name_stdout_and_the_alert_log_still_has_them(exported, tmp_path):
    """print names no file: "the disk is full" was all the run said (a unit's StandardOutput=file: on a full disk)."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(20, 240, 320, seed=3))
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video),
                               "--query", QUERY, "--threshold", "0.3", "--events", str(tmp_path / "e.jsonl")],
                              stdout=full, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("sdqes-edge: error: the disk is full writing stdout (No space "
                                                    "left on device); free some space or write to another disk, "
                                                    "and run again")
    assert [json.loads(line)["frame_index"] for line in (tmp_path / "e.jsonl").read_text().splitlines()] == [0]


def test_outputs_refused_as_the_stream_closes_are_each_said_after_the_summary_which_marks_them(exported, tmp_path):
    """The state snapshot's refusal had hidden the score trace's (which named a chunk, not the trace), and the
    summary of what ran and was written was not said, where sdqes-run says it first."""
    out = tmp_path / "out"
    ran, wrote, errors = _run_with_600_bytes_a_file(exported, tmp_path, "--save-state", str(out / "state.npz"))
    assert ran.startswith("done: 10 frames, 1 alert")  # the stream itself ended as it should
    assert wrote == (f"wrote {out / 'e.jsonl'}, {out / 'state.npz'} (not written), {out / 's.npz'} (not written)")
    assert [error.split(" writing ")[1].split(" (")[0] for error in errors] == [str(out / "state.npz"),
                                                                                str(out / "s.npz")]
    assert sorted(p.name for p in out.iterdir()) == ["e.jsonl"]  # nothing half-written


def test_every_output_refused_as_the_stream_closes_is_marked_not_the_first_alone(exported, tmp_path):
    """The annotated video and the score trace both cut off by a full disk: only the video's refusal was raised
    as the sinks closed, and the summary said the trace was written (there was none)."""
    out = tmp_path / "out"
    ran, wrote, errors = _run_with_600_bytes_a_file(exported, tmp_path, "--annotate", str(out / "a.mp4"))
    assert ran.startswith("done: 10 frames, 1 alert")
    assert wrote == f"wrote {out / 'e.jsonl'}, {out / 'a.mp4'} (incomplete), {out / 's.npz'} (not written)"
    trace_refused, video_refused = errors  # each said, the first raised last
    assert trace_refused.startswith("sdqes-edge: error: a file grew past the largest ")  # RLIMIT_FSIZE's EFBIG
    assert f" writing {out / 's.npz'} (" in trace_refused
    assert video_refused.startswith(f"sdqes-edge: error: the annotated video {out / 'a.mp4'} is incomplete: ")
    assert not (out / "s.npz").exists()


def _run_with_600_bytes_a_file(exported, tmp_path, *options: str) -> tuple[str, str, list[str]]:
    """run over 10 frames with an alert log, a score trace and ``options``, every file it writes cut off at 600
    bytes (exit 1, no traceback) -> its "done:" line, its "wrote" line and its error lines."""
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(20, 48, 64))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source", str(video),
                           "--query", QUERY, "--threshold", "0.3", "--quiet", "--events", str(out / "e.jsonl"),
                           "--scores", str(out / "s.npz"), *options],
                          capture_output=True, text=True, preexec_fn=lambda: _limit_file_size(600))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    _, ran, wrote, *errors = done.stderr.strip().splitlines()
    return ran, wrote, errors


def test_a_demo_the_disk_cuts_off_names_its_video_and_the_next_demo_in_that_folder_is_not_refused(tmp_path):
    """OpenCV's writer said nothing of the full disk: the demo streamed the 36 frames the disk held of its
    120-frame video, and its next run refused the folder as the user's own (no summary.json was written)."""
    demo = [sys.executable, "-m", "sdqes_edge.cli", "demo", "--out", str(tmp_path / "demo")]
    cut = subprocess.run(demo, capture_output=True, text=True, preexec_fn=_limit_file_size)
    assert cut.returncode == 1 and "Traceback" not in cut.stderr, cut.stderr
    assert cut.stderr.startswith(f"sdqes-edge: error: the video {tmp_path / 'demo' / 'stream.avi'} is incomplete: "
                                 "120 frames were written and ")
    assert "ALERT" not in cut.stdout  # nothing streamed from the cut video
    again = subprocess.run(demo, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "demo" / "summary.json").read_text())["queries"] == 5


def test_an_avi_the_disk_cut_off_reads_back_the_frames_it_holds_not_the_count_in_its_header(tmp_path):
    """OpenCV's AVI writer puts the count of frames it was given in the header, which the disk already holds: a
    video cut off at a third read back as whole."""
    from sdqes_edge.runtime.annotated_video import frames_read_back

    whole = write_video(tmp_path / "whole.avi", sample_frames(30, 96, 128, seed=2))
    cut = tmp_path / "cut.avi"
    cut.write_bytes(whole.read_bytes()[:whole.stat().st_size // 3])
    assert frames_read_back(whole) == 30
    assert 0 < frames_read_back(cut) < 15


def test_an_output_is_locked_on_a_disk_too_full_to_take_the_lock_holders_pid(tmp_path):
    """The pid written in the lock file, for a second run's refusal, is all the lock writes: a full disk that
    refused it ended the run with "the disk is full", naming no file."""
    from sdqes_edge.runtime.output_locks import hold, lock_path, release

    with file_size_limit(0):
        lock = hold(tmp_path / "alerts.jsonl", "--events")
    try:
        assert lock == lock_path(tmp_path / "alerts.jsonl") and lock.read_text() == ""
    finally:
        release(lock)
