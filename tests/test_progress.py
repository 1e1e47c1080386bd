"""Progress on long work reads well where it lands: on a terminal, tqdm's bar redrawn in place; in a log (a file,
journald under systemd, `docker logs`, CI), whole lines, the first after LOG_LINE_SECONDS and then at most one every
LOG_LINE_SECONDS, never a carriage return. A bar redrawn in place ten times a second had made a log of one line of
thousands of carriage returns."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import numpy as np
import pytest
from runtime_fixtures import write_video

import sdqes_edge
from sdqes_edge import progress
from sdqes_edge.progress import LOG_LINE_SECONDS, progress_bar, with_progress

pytest.importorskip("tqdm")
DEMO_BUNDLE = Path(sdqes_edge.__file__).parent / "data" / "demo_bundle"


class FakeClock:
    """tqdm's clock (``tqdm.std.time``), moved by hand."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    import tqdm.std

    fake = FakeClock()
    monkeypatch.setattr(tqdm.std, "time", fake)
    return fake


def test_off_a_terminal_a_line_comes_after_the_first_interval_then_at_most_one_an_interval(clock, capsys):
    bar = progress_bar(10, "frame", "drift frames")
    for seconds, postfix in ((10, None), (15, "loss"), (LOG_LINE_SECONDS + 1, None), (40, None), (62, "loss")):
        clock.now = 1000.0 + seconds
        bar.set_postfix(loss=0.5) if postfix else bar.update(1)  # set_postfix asks for a redraw outright
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n")
    lines = err.splitlines()
    assert len(lines) == 2  # at 31 s and 62 s; not at 10, 15 (before the first interval) nor 40 (too soon after 31)
    assert lines[0].startswith("drift frames:  20% 2/10 [00:31<") and lines[0].endswith("s/frame, loss=0.5]")
    assert lines[1].startswith("drift frames:  30% 3/10 [01:02<") and lines[1].endswith("s/frame, loss=0.5]")


def test_off_a_terminal_short_work_writes_nothing(capsys):
    for _ in with_progress(range(200), "verify fp32", "frame"):
        pass
    assert capsys.readouterr().err == ""


def test_a_disabled_bar_or_an_unknown_total_gives_the_items_themselves():
    items = iter([1, 2, 3])
    assert with_progress(items, "frames", "frame") is items  # no length, no total given: nothing to count to
    assert with_progress([1, 2], "frames", "frame", enabled=False) == [1, 2]
    assert progress_bar(None, "frame", "frames") is None


def test_on_a_terminal_the_bar_is_tqdms_redrawn_in_place(monkeypatch, capsys):
    monkeypatch.setattr(progress, "stderr_is_a_terminal", lambda: True)
    bar = progress_bar(4, "frame", "frames")
    assert type(bar).__name__ == "tqdm"
    bar.close()


def read_terminal(command: list[str]) -> bytes:
    """What ``command`` writes to a 120-column terminal (a pseudo-terminal as its stdout and stderr)."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    chunks: list[bytes] = []

    def read():
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # the child's side closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    subprocess.run(command, stdout=child, stderr=child, check=True)
    os.close(child)
    reader.join(timeout=10)
    os.close(main)
    return b"".join(chunks)


def test_sdqes_edge_run_draws_its_bar_on_a_terminal_and_leaves_a_log_clean(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (24, 48, 64, 3), dtype=np.uint8)
    video = write_video(tmp_path / "clip.avi", frames, fps=4.0)
    command = [sys.executable, "-m", "sdqes_edge.cli", "run", str(DEMO_BUNDLE), "--source", str(video),
               "--query", "Tell me when the blue ball starts rolling.", "--ort-device", "cpu"]
    logged = subprocess.run(command, capture_output=True)  # bytes: text mode would read each "\r" as a line's end
    assert logged.returncode == 0, logged.stderr.decode()
    assert b"\r" not in logged.stderr and b"frame/s" not in logged.stderr  # seconds of work: no progress line
    on_a_terminal = read_terminal(command)
    assert b"\r" in on_a_terminal and b"frame/s" in on_a_terminal


def test_a_live_streams_status_line_comes_every_few_seconds_on_a_terminal_and_as_progress_does_in_a_log(monkeypatch):
    """A service streaming a camera for weeks wrote its status line every 5 s into journald: 17,000 lines a day."""
    from sdqes_edge.cli import stream

    monkeypatch.setattr(stream, "stderr_is_a_terminal", lambda: True)
    assert stream.live_report_seconds() == stream.LIVE_REPORT_SECONDS == 5.0
    monkeypatch.setattr(stream, "stderr_is_a_terminal", lambda: False)
    assert stream.live_report_seconds() == LOG_LINE_SECONDS == 30.0


@pytest.mark.parametrize("command, unit", [
    (["inspect", str(DEMO_BUNDLE), "--frames", "300"], b"frame/s"),  # --frames 100000000 ran for hours unsaid
    (["synth", "--train", "3", "--val", "0", "--test", "0", "--seconds", "20"], b"stream/s"),  # 75 ms a stream
])
def test_long_work_of_inspect_and_synth_shows_its_bar_on_a_terminal(command, unit, tmp_path):
    command = command + (["--out", str(tmp_path / "data")] if command[0] == "synth" else [])
    on_a_terminal = read_terminal([sys.executable, "-m", "sdqes_edge.cli", *command])
    assert b"\r" in on_a_terminal and unit in on_a_terminal, on_a_terminal.decode()
