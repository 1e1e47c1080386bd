"""A stream URL is opened through FFmpeg with open and read timeouts (live_source.STREAM_TIMEOUT_S) rather than
FFmpeg's own 30 s: a stream that stalled (a frozen camera, a network cut that resets nothing) was reconnected only
30 s on, and a server that answers but sends nothing held the open as long."""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler

import cv2
import pytest
from runtime_fixtures import QUERY, EndlessMJPEG, Quiet, serving

from sdqes_edge.errors import SourceUnavailable
from sdqes_edge.runtime.live_source import STREAM_TIMEOUT_S, LiveSource, open_capture

FPS = 5.0
SHORT_TIMEOUT_S = 1.0  # the tests' own, for speed
FFMPEG_OWN_TIMEOUT_S = 30.0

needs_ffmpeg = pytest.mark.skipif(not cv2.videoio_registry.hasBackend(cv2.CAP_FFMPEG),
                                  reason="this OpenCV has no FFmpeg backend, the one that takes the timeouts")


class SendsThenStalls(EndlessMJPEG):
    """An MJPEG stream that sends ten frames, then nothing, its connection left open."""

    frames = 10

    def do_GET(self):
        super().do_GET()
        time.sleep(FFMPEG_OWN_TIMEOUT_S + 10)


class Silent(Quiet, BaseHTTPRequestHandler):
    """A server that takes the request and never answers."""

    def do_GET(self):
        time.sleep(FFMPEG_OWN_TIMEOUT_S + 10)


def test_a_live_source_takes_the_timeout_by_default_well_under_ffmpegs_own():
    assert LiveSource("rtsp://127.0.0.1:9/x", FPS, opened=False).stream_timeout_s == STREAM_TIMEOUT_S
    assert STREAM_TIMEOUT_S < FFMPEG_OWN_TIMEOUT_S / 2


@needs_ffmpeg
def test_a_stream_that_stalls_is_reconnected_after_the_timeout_not_after_ffmpegs_30_s():
    said = []
    with serving(SendsThenStalls) as address:
        camera = LiveSource(f"{address}/cam.mjpg", FPS, reconnect_delays=(0.05,), stream_timeout_s=SHORT_TIMEOUT_S)
        camera.log = said.append
        reader = camera.threaded()
        try:
            assert reader.take(timeout=10) is not None
            last_frame = time.monotonic()
            while not any("no frame; reconnecting" in line for line in said):
                assert time.monotonic() - last_frame < FFMPEG_OWN_TIMEOUT_S / 3, said
                time.sleep(0.05)
            noticed_after = time.monotonic() - last_frame
        finally:
            reader.close()
    assert noticed_after < 3 * SHORT_TIMEOUT_S + 1, said  # the stalled read gave up at the timeout


@needs_ffmpeg
def test_a_server_that_answers_nothing_is_given_up_at_the_timeout():
    with serving(Silent) as address:
        asked = time.monotonic()
        capture = open_capture(f"{address}/cam.mjpg", SHORT_TIMEOUT_S)
        took = time.monotonic() - asked
        assert not capture.isOpened()
        with pytest.raises(SourceUnavailable, match="OpenCV cannot open stream"):
            LiveSource(f"{address}/cam.mjpg", FPS, stream_timeout_s=SHORT_TIMEOUT_S)
    assert took < 3 * SHORT_TIMEOUT_S + 1


def test_a_stream_that_sends_is_read_through_the_timeouts_as_before():
    with serving(EndlessMJPEG) as address:
        camera = LiveSource(f"{address}/cam.mjpg", FPS)
        frames = camera.sampled()
        first = next(frames)
        frames.close()
    assert first.image.shape == (64, 64, 3)


@needs_ffmpeg
def test_run_stream_timeout_gives_up_a_silent_stream_at_the_time_given(exported, capsys):
    """run --stream-timeout 1: a server that answers nothing is given up after about 1 s, not the default 10, and
    the run ends as with a stream that cannot be opened (exit status 1, which a service manager restarts)."""
    from sdqes_edge.cli import run

    _, bundle = exported
    with serving(Silent) as address:
        asked = time.monotonic()
        code = run(["run", str(bundle), "--source", f"{address}/cam.mjpg", "--stream-timeout", str(SHORT_TIMEOUT_S),
                    "--query", QUERY])
        took = time.monotonic() - asked
    assert code == 1 and "error: OpenCV cannot open stream" in capsys.readouterr().err
    assert took < STREAM_TIMEOUT_S


def test_every_source_run_opens_takes_the_stream_timeout_given():
    """The timeout reaches each stream a run opens: one read live and a camera of several that was not there at the
    start (reconnected later), and the words said while a stream is still opening."""
    from sdqes_edge.runtime.source_opening import _still_opening_words
    from sdqes_edge.runtime.sources import open_source, unopened_live_source

    with serving(EndlessMJPEG) as address:
        live = open_source(f"{address}/cam.mjpg", FPS, stream_timeout_s=2.5)
        live.close()
    assert live.stream_timeout_s == 2.5
    assert unopened_live_source("rtsp://127.0.0.1:9/x", FPS, 2.5).stream_timeout_s == 2.5
    assert "OpenCV waits up to 2.5 s for a stream" in _still_opening_words(["rtsp://127.0.0.1:9/x"], 2.5)


def test_a_stream_timeout_with_no_stream_to_apply_to_is_said_and_a_nonsense_one_refused(exported, tmp_path, capsys):
    from runtime_fixtures import write_video

    from sdqes_edge.cli import run
    from sdqes_edge.sample import sample_frames

    _, bundle = exported
    video = write_video(tmp_path / "kitchen.avi", sample_frames(4, 48, 64))
    assert run(["run", str(bundle), "--source", str(video), "--stream-timeout", "30", "--query", QUERY,
                "--quiet"]) == 0
    assert ("warning: --stream-timeout is for stream URLs (rtsp://, http://, udp://, tcp://), and no --source is one: "
            "ignored") in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        run(["run", str(bundle), "--source", str(video), "--stream-timeout", "0"])
    assert refused.value.code == 2
    assert "argument --stream-timeout: give at least 0.1 s, not 0" in capsys.readouterr().err
