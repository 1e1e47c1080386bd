"""A score trace says whether its run stepped the source to the end, so that eval can tell a video's last seconds
(scored as the reference scores them) from frames a stopped run never stepped (their events put aside)."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_fixtures import write_video

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.runtime import CallbackSink, Frame, Sink, StreamingDetector, open_source
from sdqes_edge.runtime.sinks import ScoreTraceRecorder
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import StreamScores, load_score_dir, load_scores, save_scores


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """8 s of video at 2 fps: 8 samples at the demo bundle's 1 fps."""
    return write_video(tmp_path_factory.mktemp("clip") / "clip.avi", sample_frames(16, 64, 64), fps=2.0)


def scored(clip, path, max_frames=None) -> StreamScores:
    detector = StreamingDetector(DEMO_BUNDLE)
    detector.add_query("when the lamp turns on")
    detector.add_sink(ScoreTraceRecorder(path, "clip", detector.fps))
    list(detector.run(open_source(str(clip), detector.fps), max_frames=max_frames))
    return load_scores(path)


def test_a_trace_run_to_its_videos_end_says_so_and_one_stopped_by_max_frames_says_it_stopped_first(clip, tmp_path):
    whole = scored(clip, tmp_path / "whole.npz")
    assert len(whole.probs) == 8 and whole.source_ended is True
    cut = scored(clip, tmp_path / "cut.npz", max_frames=5)
    assert len(cut.probs) == 5 and cut.source_ended is False
    exactly = scored(clip, tmp_path / "exactly.npz", max_frames=8)  # its last step took the file's last sample
    assert len(exactly.probs) == 8 and exactly.source_ended is True


def test_a_file_cut_short_says_its_trace_stopped_first_for_its_end_is_not_the_videos(tmp_path):
    """A copy stopped part-way decodes to a frame well short of the frames its container lists: its last seconds are
    not the video's, and an event there had been scored as if the video had ended."""
    whole = write_video(tmp_path / "whole.avi", sample_frames(140, 48, 64), fps=10.0)
    cut = tmp_path / "cut.avi"
    cut.write_bytes(whole.read_bytes()[: int(whole.stat().st_size * 0.3)])
    detector = StreamingDetector(DEMO_BUNDLE)
    detector.add_query("when the lamp turns on")
    detector.add_sink(ScoreTraceRecorder(tmp_path / "cut.npz", "cut", detector.fps))
    source = open_source(str(cut), detector.fps)
    source.log = lambda message: None
    list(detector.run(source))
    trace = load_scores(tmp_path / "cut.npz")
    assert source.stats.truncated and 0 < len(trace.probs) < 14 and trace.source_ended is False


def test_a_killed_runs_chunks_read_as_stopped_first_and_a_trace_that_does_not_say_as_unknown(tmp_path):
    recorder = ScoreTraceRecorder(tmp_path / "killed" / "cam.npz", "cam", fps=1.0)
    recorder.CHUNK_ROWS = 4
    recorder.on_query_added("q1", "when it starts", 0.0)
    for t in range(10):
        recorder.on_frame(0, None, float(t), {"q1": 0.5}, [])
    killed, = load_score_dir(tmp_path / "killed")  # never closed: its two chunks, merged on reading
    assert len(killed.probs) == 8 and killed.source_ended is False

    save_scores(tmp_path / "older" / "cam.npz", StreamScores("cam", 1.0, ["when it starts"], ["q1"], np.zeros(1),
                                                             np.full((10, 1), 0.5)))
    older, = load_score_dir(tmp_path / "older")
    assert older.source_ended is None


def test_a_program_that_steps_its_own_frames_leaves_the_end_unsaid(tmp_path):
    detector = StreamingDetector(DEMO_BUNDLE)
    detector.add_query("when the lamp turns on")
    detector.add_sink(ScoreTraceRecorder(tmp_path / "own.npz", "own", detector.fps))
    image = np.zeros((64, 64, 3), np.uint8)
    for t in range(3):
        detector.step([Frame(image=image, time=float(t), index=t)])
    detector.close()
    assert load_scores(tmp_path / "own.npz").source_ended is None


def test_every_sink_is_told_how_each_stream_ended_and_closed_even_where_one_raises(clip):
    told, closed = [], []

    class Told(Sink):
        def on_sources_ended(self, ended):
            told.append(ended)

        def close(self):
            closed.append(self)

    class Raises(Told):
        def on_sources_ended(self, ended):
            raise RuntimeError("a program's bug")

    detector = StreamingDetector(DEMO_BUNDLE)
    detector.add_query("when the lamp turns on")
    detector.add_sink(CallbackSink(lambda event: None))
    detector.add_sink(Raises())
    detector.add_sink(Told())
    with pytest.raises(RuntimeError, match="a program's bug"):
        list(detector.run(open_source(str(clip), detector.fps)))
    assert told == [[True]] and len(closed) == 2
