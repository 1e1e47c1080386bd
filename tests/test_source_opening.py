"""Opening a run's sources (``open_sources``): side by side, each on a thread of its own, so that a stop while a
stream is still opening comes at once (OpenCV's open of a stream that answers but sends nothing blocks for FFmpeg's
30 s, and Python runs no signal handler inside it), and a failure is said without waiting for the others."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from runtime_fixtures import EndlessMJPEG, Quiet, seconds_to_stop, serving

from sdqes_edge.errors import UserError
from sdqes_edge.runtime import source_opening
from sdqes_edge.runtime.frame_source import FrameSource
from sdqes_edge.runtime.source_opening import open_sources
from sdqes_edge.runtime.sources import open_source


class _Named(FrameSource):
    """A source that is only its name (what the ordering is checked by)."""

    def _frames(self):
        return iter(())


class Silent(Quiet, BaseHTTPRequestHandler):
    """A stream that answers and sends nothing, its connection held: OpenCV's open blocks on it."""

    def do_GET(self):
        time.sleep(40)


def test_sources_open_side_by_side_each_on_its_own_thread_and_come_in_the_order_given(monkeypatch):
    """OpenCV's FFmpeg backend opens one stream at a time (a lock of its own); cameras (V4L2) and GStreamer
    pipelines open side by side. Here each open waits for the other's to have begun."""
    both_asked = threading.Barrier(2, timeout=20)  # one open after the other: the first never returns, and it breaks

    def opens_with_the_other(spec, fps, stream_timeout_s, images_fps=None):
        both_asked.wait()
        return _Named(spec, fps)

    monkeypatch.setattr(source_opening, "open_source", opens_with_the_other)
    assert len(open_sources(["kitchen", "garage"], fps=5.0)) == 2
    assert not both_asked.broken

    def slower_first(spec, fps, stream_timeout_s, images_fps=None):
        time.sleep(0.3 if spec == "kitchen" else 0.0)
        return _Named(spec, fps)

    monkeypatch.setattr(source_opening, "open_source", slower_first)
    assert [s.name for s in open_sources(["kitchen", "garage", "porch"], fps=5.0)] == ["kitchen", "garage", "porch"]


def test_a_source_that_fails_is_said_without_waiting_for_one_still_opening_which_is_closed_once_open(tmp_path):
    gone = threading.Event()
    opening = threading.Event()

    class Slow(EndlessMJPEG):
        """Answers once the run has given up on it; the run, having no use for it, closes the connection."""

        def do_GET(self):
            opening.set()
            assert failed.wait(timeout=20)
            super().do_GET()  # sends until the client is gone
            gone.set()

    failed = threading.Event()
    with serving(Slow) as address:
        with pytest.raises(UserError, match="missing.mp4"):
            open_sources([f"{address}/slow.mjpg", str(tmp_path / "missing.mp4")], fps=5.0)
        failed.set()  # the slow stream still had not answered when the failure was said
        assert gone.wait(timeout=20), "the stream opened after the failure kept its connection"


def test_sources_already_open_when_another_fails_are_closed_at_once(tmp_path, monkeypatch):
    """Their connections are let go of as the failure is raised, not when the collector gets to them (the
    exception's traceback, here held by pytest, keeps them)."""
    streaming, gone = threading.Event(), threading.Event()

    class Kitchen(EndlessMJPEG):
        def do_GET(self):
            streaming.set()
            super().do_GET()  # sends until the client is gone
            gone.set()

    def fails_once_the_camera_is_open(spec, fps, stream_timeout_s, images_fps=None):
        if spec.endswith(".mp4"):
            streaming.wait(timeout=5)
        return open_source(spec, fps, stream_timeout_s)

    garbage = tmp_path / "porch.mp4"
    garbage.write_bytes(b"not a video" * 100)
    monkeypatch.setattr(source_opening, "open_source", fails_once_the_camera_is_open)
    with serving(Kitchen) as address:
        with pytest.raises(UserError, match="porch.mp4") as failure:
            open_sources([f"{address}/kitchen.mjpg", str(garbage)], fps=5.0)
        # (``failure`` holds the exception, whose traceback holds the sources opened: only closing lets go of them)
        assert gone.wait(timeout=20), f"the camera opened before {failure.typename} kept its connection"


def test_a_source_slow_to_open_is_named_once_its_password_hidden(monkeypatch):
    monkeypatch.setattr(source_opening, "OPEN_NOTICE_S", 0.3)
    said = []

    class AnswersLate(EndlessMJPEG):
        frames = 40

        def do_GET(self):
            time.sleep(1.0)
            super().do_GET()

    with serving(AnswersLate) as address:
        url = address.replace("http://", "http://admin:hunter2@") + "/cam.mjpg"
        (source,) = open_sources([url], fps=5.0, log=said.append)
        source.close()
    assert len(said) == 1 and said[0].startswith("still opening http://admin:***@127.0.0.1") and "Ctrl-C" in said[0]
    assert "hunter2" not in said[0]


def test_sigterm_while_a_stream_is_still_opening_stops_the_run_at_once(tmp_path):
    """Before, SIGTERM there waited for OpenCV's open to give up (26.7 s measured): docker stop kills after 10 s."""
    with serving(Silent) as address:
        process = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", "run", str(_bundle(tmp_path)),
                                    "--source", f"{address}/cam.mjpg", "--query", "cut an onion"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        said = []
        for line in process.stderr:  # the notice: the run is waiting for the stream, and says so
            said.append(line)
            if "still opening" in line:
                break
        stopped_after = seconds_to_stop(process)
    said.append(process.stderr.read())
    stderr = "".join(said)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert stopped_after < 5, f"stopped {stopped_after:.1f} s after SIGTERM"
    assert "still opening" in stderr and "interrupted (SIGTERM)" in stderr and "Traceback" not in stderr, stderr


def test_a_process_left_with_a_thread_inside_opencv_exits_with_its_status_not_an_abort():
    """Python 3.11's teardown ends a thread whose OpenCV call returns during it by unwinding its C++ frames, and
    OpenCV's bindings catch that: the process aborted ("terminate called without an active exception", -6) after a
    stop while a stream was opening. ``exit_process`` ends it without that teardown while such a thread lives."""
    script = """
import sys, time, threading, cv2
from sdqes_edge.stopping import exit_process, may_outlive_a_stop

class SlowTeardown:  # makes Python's teardown long enough for the open to return inside it
    def __del__(self):
        time.sleep(2.0)

keep = SlowTeardown()
opener = may_outlive_a_stop(threading.Thread(target=cv2.VideoCapture, args=(sys.argv[1],), daemon=True))
opener.start()
time.sleep(0.3)
print("left while opening:", opener.is_alive())  # (to a pipe: buffered, as exit_process must flush)
exit_process(143)
"""

    class AnswersSoon(EndlessMJPEG):
        frames = 40

        def do_GET(self):
            time.sleep(1.0)  # after the process began to exit, before its teardown would end
            super().do_GET()

    with serving(AnswersSoon) as address:
        buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
        done = subprocess.run([sys.executable, "-c", script, f"{address}/cam.mjpg"], capture_output=True, text=True,
                              timeout=60, env=buffered)
    assert done.stdout == "left while opening: True\n", done.stderr
    assert done.returncode == 143, done.stderr
    assert "terminate called" not in done.stderr


def _bundle(tmp_path):
    from conftest import random_model

    from sdqes_edge.export import ExportOptions, export_bundle

    export_bundle(random_model("qrnn"), tmp_path / "b", ExportOptions(fps=5.0, show_progress=False), log=lambda m: None)
    return tmp_path / "b"


def test_one_spec_given_alone_is_one_source_not_one_a_letter(tmp_path):
    """open_sources("kitchen.avi", fps) read the text one letter a source: "source k is neither a file, ..."."""
    import numpy as np
    from runtime_fixtures import write_video

    video = write_video(tmp_path / "kitchen.avi", np.zeros((3, 24, 32, 3), np.uint8))
    (source,) = open_sources(str(video), 5.0)
    assert source.name == "kitchen"
