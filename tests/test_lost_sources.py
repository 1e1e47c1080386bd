"""A camera or stream that cannot be opened, or goes away for good: exit status 1, which a service manager
restarts, apart from a mistake in the command (2) and the clean end of a file (0)."""

from __future__ import annotations

import json

from runtime_fixtures import QUERY

from sdqes_edge.cli import run
from sdqes_edge.cli.stream import LOST_SOURCE_EXIT


def test_a_live_stream_that_goes_away_for_good_ends_the_run_as_a_failure(exported, tmp_path, monkeypatch, capsys):
    """A camera unplugged, or an IP camera's server gone: after its reconnection attempts the run ended with exit
    status 0, as a file that ended does, so systemd's Restart=on-failure never started it again."""
    from runtime_fixtures import EndlessMJPEG, serving

    from sdqes_edge.runtime import live_source, sources

    class ServesOnce(EndlessMJPEG):
        frames = 20  # one stream, cut after a second; then nothing is found there
        served = 0

        def do_GET(self):
            ServesOnce.served += 1
            if ServesOnce.served > 1:
                self.send_error(404)
                return
            super().do_GET()

    class QuickToGiveUp(live_source.LiveSource):
        def __init__(self, target, fps, reconnect_delays=(0.05, 0.05), capture=None, **options):
            super().__init__(target, fps, reconnect_delays, capture, **options)

    monkeypatch.setattr(sources, "LiveSource", QuickToGiveUp)
    _, bundle = exported
    events = tmp_path / "alerts.jsonl"
    with serving(ServesOnce) as address:
        code = run(["run", str(bundle), "--source", f"{address}/cam.mjpg", "--query", QUERY, "--threshold", "0.01",
                    "--events", str(events)])
    err = capsys.readouterr().err
    assert code == LOST_SOURCE_EXIT == 1, err
    assert "stopped sending frames and did not come back after 2 reconnection attempts: the stream ended there, " \
           "every output complete (exit status 1)" in err
    assert json.loads(events.read_text().splitlines()[0])["message"]  # the alert log is there, whole


def test_a_camera_that_cannot_be_opened_exits_as_a_lost_one_and_a_missing_file_as_a_mistake(exported, tmp_path,
                                                                                              capsys):
    """At boot a USB camera may be found after the service starts: exit 1 is restarted by the service manager; a
    mistake in the command (2) is not (docs/service/sdqes-edge.service)."""
    _, bundle = exported
    assert run(["run", str(bundle), "--source", "7", "--query", QUERY]) == LOST_SOURCE_EXIT
    assert "error: OpenCV cannot open camera index 7" in capsys.readouterr().err
    assert run(["run", str(bundle), "--source", str(tmp_path / "none.mp4"), "--query", QUERY]) == 2
    assert "none.mp4 is neither a file" in capsys.readouterr().err


def test_a_program_hears_of_a_lost_source_through_logging_unless_it_takes_the_messages_itself(tmp_path, caplog):
    """The Python API's sources told a program nothing: their messages went nowhere unless it set ``source.log``,
    so a camera that dropped, came back or was lost for good was news to nobody."""
    import logging

    from runtime_fixtures import write_video

    from sdqes_edge.runtime.live_source import LiveSource
    from sdqes_edge.sample import sample_frames

    video = write_video(tmp_path / "stream.avi", sample_frames(5, 48, 64))
    source = LiveSource(str(video), fps=1000.0, reconnect_delays=(0.01, 0.01))  # a "stream" of 5 frames
    video.unlink()  # and then nothing there to reopen
    with caplog.at_level(logging.WARNING, logger="sdqes_edge.runtime.sources"):
        frames = list(source.sampled())
    assert frames and source.stats.gave_up_after == 2
    assert [r.getMessage() for r in caplog.records][-1] == f"{source.name}: gave up after 2 attempts"
    taken = []
    source = LiveSource(str(write_video(video, sample_frames(3, 48, 64))), fps=1000.0, reconnect_delays=(0.01,))
    source.log = taken.append
    video.unlink()
    caplog.clear()
    list(source.sampled())
    assert taken[-1].endswith("gave up after 1 attempt") and not caplog.records
