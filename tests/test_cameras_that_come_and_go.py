"""A run of several cameras goes on while any of them sends. One that is not there at the start does not stop the
others from starting (it used to end the whole run, exit 1, every camera unwatched until a restart found them all
there), and one lost for good is tried again every few seconds rather than given up (given up, a camera back a
minute later stayed lost for as long as the others kept the run going). One camera alone, or a run with files,
fails and gives up as before, for a service manager to restart it."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler

import pytest
from runtime_fixtures import EndlessMJPEG, Quiet, run_doing_on_a_line, serving, write_video

from sdqes_edge.errors import SourceUnavailable
from sdqes_edge.runtime.live_source import Cameras, LiveSource
from sdqes_edge.runtime.source_opening import open_sources
from sdqes_edge.sample import sample_frames

FPS = 5.0
QUICK_BACK_OFF = (0.05, 0.1)  # two attempts, then one every 0.1 s where it keeps trying


class Absent(Quiet, BaseHTTPRequestHandler):
    """A camera that is not there: its server answers 404."""

    def do_GET(self):
        self.send_error(404)


def comes_after(requests: int):
    """A camera whose server answers 404 to its first ``requests`` requests, then streams."""
    asked = []

    class ComesBack(EndlessMJPEG):
        def do_GET(self):
            asked.append(self.path)
            if len(asked) <= requests:
                self.send_error(404)
                return
            super().do_GET()

    return ComesBack


def test_a_camera_absent_at_the_start_lets_the_others_start_and_is_found_when_it_comes_even_after_the_back_off():
    said = []
    # The open, then two back-off attempts in vain (lost), then two more: it streams on the fifth request.
    with serving(EndlessMJPEG) as kitchen, serving(comes_after(4)) as porch:
        sources = open_sources([f"{kitchen}/kitchen.mjpg", f"{porch}/porch.mjpg"], FPS, log=said.append)
        assert [type(s) for s in sources] == [LiveSource, LiveSource] and all(s.keep_trying for s in sources)
        assert len(said) == 1 and said[0].startswith(f"warning: OpenCV cannot open stream {porch}/porch.mjpg; ")
        assert "The other cameras start without it" in said[0]
        porch_source = sources[1]
        porch_source.reconnect_delays, porch_source.log = QUICK_BACK_OFF, said.append
        reader = porch_source.threaded()
        try:
            frame = reader.take(timeout=20)
        finally:
            reader.close()
            sources[0].close()
    assert frame is not None, said
    assert any(line.endswith("lost after 2 attempts; tried again every 0.1 s while another camera sends")
               for line in said), said
    assert said[-1].endswith(": reconnected") and porch_source.stats.reconnects == 1
    assert porch_source.stats.gave_up_after == 0, "found again: no longer lost"


def test_one_camera_alone_is_given_up_after_the_back_off_as_before():
    with serving(Absent) as address:
        camera = LiveSource(f"{address}/porch.mjpg", FPS, reconnect_delays=QUICK_BACK_OFF, opened=False)
        camera.log = lambda message: None
        assert list(camera.threaded()) == []
    assert camera.stats.gave_up_after == 2 and not camera.keep_trying


def test_a_run_with_a_file_or_with_no_camera_there_fails_at_the_start_as_before(tmp_path):
    video = write_video(tmp_path / "clip.avi", sample_frames(4, 48, 64))
    with serving(Absent) as address:
        with pytest.raises(SourceUnavailable, match="porch.mjpg"):
            open_sources([f"{address}/porch.mjpg", f"{address}/garage.mjpg"], FPS)
        with pytest.raises(SourceUnavailable, match="porch.mjpg"):
            open_sources([str(video), f"{address}/porch.mjpg"], FPS)
        with pytest.raises(SourceUnavailable, match="porch.mjpg"):
            open_sources([f"{address}/porch.mjpg"], FPS)


def test_when_every_camera_is_lost_they_give_up_together_and_the_run_ends():
    """Trying on with no camera sending, the run would step nothing until systemd's watchdog killed it, its outputs
    unfinished; it ends instead (exit 1), for a clean restart."""
    said = []
    with serving(Absent) as address:
        cameras = [LiveSource(f"{address}/{name}.mjpg", FPS, reconnect_delays=QUICK_BACK_OFF, opened=False)
                   for name in ("porch", "garage")]
        Cameras(cameras)
        for camera in cameras:
            camera.log = said.append
        readers = [camera.threaded() for camera in cameras]
        try:
            for reader in readers:
                assert reader.take(timeout=20) is None and reader.ended, said
        finally:
            for reader in readers:
                reader.close()
    assert [camera.stats.gave_up_after for camera in cameras] == [2, 2]
    assert any(line.endswith("gave up: every camera of the run is lost") for line in said), said
    assert all(camera.lost_words().endswith("(lost after 2 reconnection attempts in vain, then tried again every few "
                                            "seconds)") for camera in cameras)


def test_a_reader_stopped_during_the_back_off_ends_without_waiting_it_out():
    with serving(Absent) as address:
        camera, other = (LiveSource(f"{address}/{name}.mjpg", FPS, reconnect_delays=(60.0,), opened=False)
                         for name in ("porch", "garage"))
        Cameras([camera, other])
        camera.log = lambda message: None
        reader = camera.threaded()
        assert reader.take(timeout=0.3) is None
        reader.close()
    assert not [t for t in threading.enumerate() if t.name == f"source-{camera.name}"], "still waiting 60 s"


@pytest.fixture(scope="module")
def two_streams(tmp_path_factory):
    """A bundle that steps two streams at FPS."""
    from conftest import random_model

    from sdqes_edge.export import ExportOptions, export_bundle

    bundle = tmp_path_factory.mktemp("two-streams") / "b2"
    export_bundle(random_model("qrnn"), bundle, ExportOptions(fps=FPS, batch=2, show_progress=False),
                  log=lambda m: None)
    return bundle


def test_run_with_one_of_two_cameras_absent_streams_the_other_and_ends_saying_it_was_lost(two_streams):
    bundle = two_streams
    with serving(EndlessMJPEG) as kitchen, serving(Absent) as porch:
        done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(bundle), "--source",
                               f"{kitchen}/kitchen.mjpg", "--source", f"{porch}/porch.mjpg", "--query",
                               "cut an onion", "--max-frames", "30"], capture_output=True, text=True, timeout=120)
    said = done.stderr
    assert "warning: OpenCV cannot open stream" in said and "The other cameras start without it" in said, said
    assert "done: 30 " in said and "Traceback" not in said, said
    assert re.search(r"error: 127\.0\.0\.1-\d+-porch\.mjpg was not sending frames when the run ended \(it was being "
                     r"reconnected\) \(exit status 1\)", said), said
    assert done.returncode == 1, said


def test_a_served_video_file_taken_for_a_camera_when_it_was_down_is_refused_once_it_opens_not_played_live(tmp_path):
    """An HTTP(S) URL is told a file or a live stream only once it opens; one down when a run of cameras started
    was waited for as a camera. When it came, its file was read as a camera: stamped by the clock as fast as it
    decoded, most frames dropped, and replayed from its start at its end, forever."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    class Files(Quiet, SimpleHTTPRequestHandler):
        pass

    said = []
    with serving(EndlessMJPEG) as kitchen, serving(partial(Files, directory=str(tmp_path))) as site:
        sources = open_sources([f"{kitchen}/kitchen.mjpg", f"{site}/porch.avi?token=abc"], FPS, log=said.append)
        assert [type(s) for s in sources] == [LiveSource, LiveSource], "not there: waited for as a camera"
        write_video(tmp_path / "porch.avi", sample_frames(12, 48, 64), fps=FPS)  # the server is up now
        porch = sources[1]
        porch.reconnect_delays, porch.log = QUICK_BACK_OFF, said.append
        reader = porch.threaded()
        try:
            with pytest.raises(SourceUnavailable, match=rf"^{re.escape(site)}/porch\.avi\?token=abc serves a video "
                                                        r"file, not a live stream, .* replay it forever: it could "
                                                        r"not be opened when the run started, .* start the run again"):
                reader.take(timeout=20)
        finally:
            reader.close()
            sources[0].close()
    assert porch.stats.reconnects == 0 and not any(line.endswith(": reconnected") for line in said), said


def test_run_ends_with_what_it_streamed_then_why_when_a_camera_turns_out_a_served_file(two_streams, tmp_path):
    """The failure comes in the middle of the stream: the run says what it streamed and wrote first, as it does
    when stopped, then the error, exit 1 (a restart reads the URL as the file it is)."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    class Files(Quiet, SimpleHTTPRequestHandler):
        pass

    site_folder, events = tmp_path / "site", tmp_path / "alerts.jsonl"
    site_folder.mkdir()
    with serving(EndlessMJPEG) as kitchen, serving(partial(Files, directory=str(site_folder))) as site:
        # The file is put there once the run has started without it.
        status, stderr = run_doing_on_a_line(
            [sys.executable, "-m", "sdqes_edge.cli", "run", str(two_streams), "--source", f"{kitchen}/kitchen.mjpg",
             "--source", f"{site}/porch.avi", "--query", "cut an onion", "--events", str(events)],
            "The other cameras start without it", lambda: write_video(site_folder / "porch.avi",
                                                                      sample_frames(12, 48, 64)))
    said = stderr.strip().splitlines()
    assert status == 1 and "Traceback" not in stderr, stderr
    assert re.fullmatch(r"interrupted after \d+ steps of 2 sources, .*", said[-3]), stderr
    assert said[-2] == f"wrote {events}" and events.exists(), stderr
    assert said[-1].startswith(f"sdqes-edge: error: {site}/porch.avi serves a video file, not a live stream"), said


def test_a_served_video_file_given_to_a_live_source_itself_is_refused_as_the_callers_mistake(tmp_path):
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    from sdqes_edge.errors import UserError

    class Files(Quiet, SimpleHTTPRequestHandler):
        pass

    write_video(tmp_path / "porch.avi", sample_frames(4, 48, 64), fps=FPS)
    with serving(partial(Files, directory=str(tmp_path))) as site:
        with pytest.raises(UserError, match=r"serves a video file, .*: open it with open_source, which reads a served "
                                            r"file as a file$") as refused:
            LiveSource(f"{site}/porch.avi", FPS)
    assert not isinstance(refused.value, SourceUnavailable), "a mistake (exit 2), which no restart mends"


def test_without_a_log_given_the_absent_camera_is_named_on_the_sources_logger(caplog):
    """A program embedding the runtime that sets no ``log`` hears of it as of a source's other news."""
    with serving(EndlessMJPEG) as kitchen, serving(Absent) as porch:
        with caplog.at_level("WARNING", logger="sdqes_edge.runtime.sources"):
            sources = open_sources([f"{kitchen}/kitchen.mjpg", f"{porch}/porch.mjpg"], FPS)
        for source in sources:
            source.close()
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [f"warning: OpenCV cannot open stream "
                                                                      f"{porch}/porch.mjpg"]
