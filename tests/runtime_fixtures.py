"""What the runtime tests share: a tiny exported QRNN bundle (sampled at 5 fps), its step graphs for one and for
four streams, a query, a video writer, a live stream that never ends."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np
import pytest
from conftest import random_model

from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.runtime.bundle import load_bundle
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.sample import sample_frames

QUERY = "When I start to clean or wipe the table, remind me to sanitize my hands."
FPS = 5.0
STEP_GRAPH_FRAMES = 40  # preprocessed frames that come with `step_graphs`


@pytest.fixture(scope="session")
def _exported_once(tmp_path_factory) -> Path:
    """The bundle `exported` copies: exported once a session (about 3 s each), not once a module."""
    out = tmp_path_factory.mktemp("rt_once") / "bundle"
    export_bundle(random_model("qrnn"), out, ExportOptions(fps=FPS, show_progress=False), log=lambda m: None)
    return out


@pytest.fixture(scope="module")
def exported(_exported_once, tmp_path_factory):
    """A tiny QRNN model and its bundle, sampled at 5 fps: the module's own copy, free to change, and the model
    (seeded, so the same weights the bundle was exported from)."""
    out = tmp_path_factory.mktemp("rt") / "bundle"
    shutil.copytree(_exported_once, out)
    return random_model("qrnn"), out


@pytest.fixture(scope="session")
def _step_graph_bundles(tmp_path_factory) -> dict[int, Path]:
    """The bundles `step_graphs` loads: one model (lookback 2) for 1 and for 4 streams, exported once a session."""
    model = random_model("qrnn", lookback=2)
    out = {}
    for batch in (1, 4):
        out[batch] = tmp_path_factory.mktemp(f"b{batch}") / "bundle"
        export_bundle(model, out[batch], ExportOptions(batch=batch, show_progress=False), log=lambda m: None)
    return out


@pytest.fixture(scope="module")
def step_graphs(_step_graph_bundles):
    """Step graphs of one tiny QRNN model (lookback 2, so the history shifts), for 1 and for 4 streams, and
    STEP_GRAPH_FRAMES preprocessed frames."""
    graphs = {batch: load_bundle(path).step_graph() for batch, path in _step_graph_bundles.items()}
    frames = Preprocessor.from_config(random_model("qrnn", lookback=2).cfg).batch(
        sample_frames(STEP_GRAPH_FRAMES, 120, 160))
    return graphs, frames


def write_video(path: Path, frames: np.ndarray, fps: float = 10.0) -> Path:
    fourcc = cv2.VideoWriter_fourcc(*("MJPG" if path.suffix == ".avi" else "mp4v"))
    writer = cv2.VideoWriter(str(path), fourcc, fps, (frames.shape[2], frames.shape[1]))
    assert writer.isOpened(), f"OpenCV cannot write {path.suffix}"
    for frame in frames:
        writer.write(frame)
    writer.release()
    return path


class Quiet:
    """A request handler that keeps its access log to itself (mixed in before the handler class)."""

    def log_message(self, *args):
        pass


class EndlessMJPEG(Quiet, BaseHTTPRequestHandler):
    """A live stream that never ends: the same JPEG frame, 20 a second, as multipart/x-mixed-replace."""

    frames: int | None = None  # frames sent before the stream is cut (None: never)

    def do_GET(self):
        frame = cv2.imencode(".jpg", np.full((64, 64, 3), 128, np.uint8))[1].tobytes()
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        part = b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n%s\r\n" % (len(frame), frame)
        sent = 0
        try:
            while self.frames is None or sent < self.frames:
                self.wfile.write(part)
                sent += 1
                time.sleep(0.05)
        except OSError:  # the client is gone
            pass


def seconds_to_stop(process: subprocess.Popen, timeout: float = 30) -> float:
    """SIGTERM (docker stop, systemd) to ``process``, and how long it took to exit (killed past ``timeout``)."""
    process.send_signal(signal.SIGTERM)
    asked = time.monotonic()
    try:
        process.wait(timeout=timeout)
    finally:
        process.kill()
    return time.monotonic() - asked


def run_doing_on_a_line(command: list[str], line_part: str, then, timeout: float = 120) -> tuple[int, str]:
    """``command`` run, ``then()`` called once a line of its stderr holds ``line_part`` (not at a guessed moment,
    which a loaded machine reaches before the command does) -> (exit status, its whole stderr)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    said, done = [], False
    try:
        for line in process.stderr:
            said.append(line)
            if not done and line_part in line:
                then()
                done = True
        return process.wait(), "".join(said)
    finally:
        timer.cancel()
        process.kill()


@contextlib.contextmanager
def serving(handler) -> Iterator[str]:
    """A local HTTP server of ``handler`` on a free port, while the block runs: its address."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def endless_stream():
    with serving(EndlessMJPEG) as address:
        yield f"{address}/stream.mjpg"


@contextlib.contextmanager
def another_run_writing(folder: Path, output: str) -> Iterator[subprocess.Popen]:
    """Another process holding the lock of ``folder / output`` for --out ``folder`` (runtime/output_locks.py), as a
    command writing that folder does, for the block -> that process (killed after)."""
    code = ("import sys, time; from pathlib import Path; from sdqes_edge.runtime.output_locks import hold; "
            "out = Path(sys.argv[1]); hold(out / sys.argv[2], '--out', 'an output', folder=out); "
            "print('held', flush=True); time.sleep(120)")
    other = subprocess.Popen([sys.executable, "-c", code, str(folder), output], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        yield other
    finally:
        other.kill()
        other.wait(timeout=30)
