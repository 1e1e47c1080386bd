"""A live stream's outputs that the machine refuses while it streams (a disk that filled up, a folder gone): each is
said, once however many writes are refused in a row, and the stream goes on alerting, the output tried again; said
again once written. The run had ended at the first refusal, and the camera was unwatched while a service restarted
into the same full disk. Still refused when the stream ends, it is the run's error (exit 1).

The annotated video's segments (one cut off or not begun is lost; the next is tried as its time comes) and the score
trace's chunks (the refused rows are held and written with the next). The refusals are real: a file-size limit
(EFBIG, as a full disk's ENOSPC), names that lead nowhere."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from runtime_fixtures import QUERY, seconds_to_stop
from test_annotated_segments import frames_in
from test_full_disk import file_size_limit

from sdqes_edge.cli.run_outputs import videos_written
from sdqes_edge.runtime.annotated_video import AnnotatedVideoSink, IncompleteOutput, segment_path
from sdqes_edge.runtime.sinks import ScoreTraceRecorder
from sdqes_edge.traces import load_scores

SIZE = (240, 320, 3)


def noise(seed: int) -> np.ndarray:
    """A frame no encoder shrinks: two of them pass the file-size limit below, where flat frames stay far under."""
    return np.random.default_rng(seed).integers(0, 255, SIZE, dtype=np.uint8)


def flat(_seed: int) -> np.ndarray:
    return np.full(SIZE, 40, np.uint8)


def stream_into(sink: AnnotatedVideoSink, frames, first: int = 0) -> None:
    for t, frame in enumerate(frames, start=first):
        sink.on_frame(0, frame(t), float(t), {"q1": 0.1}, [])


def logging_sink(path, said: list[str], **options) -> AnnotatedVideoSink:
    sink = AnnotatedVideoSink(path, 1.0, lambda: {"q1": 0.5}, segment_seconds=2, **options)
    sink.log = said.append
    return sink


def test_segments_cut_off_by_a_full_disk_are_said_once_and_the_next_whole_one_is_said_too(tmp_path):
    said: list[str] = []
    sink = logging_sink(tmp_path / "cam.mp4", said)
    with file_size_limit(64 * 1024):
        stream_into(sink, [noise, noise, noise, noise, flat, flat, flat])  # two segments cut, then room again
        sink.close()
    first, second, third, last = sink.written
    assert sink.incomplete == [first, second]
    assert [frames_in(path) for path in (third, last)] == [2, 1]  # every frame after the refusals is written
    assert len(said) == 2, said  # the second refusal in a row is not said again
    assert said[0].startswith(f"warning: the annotated video {first} is incomplete: 2 frames were written and 0 can "
                              "be read back")
    assert said[0].endswith("(--annotate-keep HOURS removes old segments as new ones begin); the stream goes on, and "
                            "a new segment is tried every 2 s")
    assert said[1] == (f"note: the annotated video is written whole again from {third}, after 2 segments refused "
                       "(said above)")
    assert videos_written([sink]) == [f"{first} ... {last} (4 videos, 2 of them incomplete)"]


def plant_unwritable_names(video: Path, seconds: int = 120) -> list[Path]:
    """Links to a folder that does not exist where the next segments' names fall (each second's NAME.STAMP.EXT, and
    NAME.STAMP-2.EXT, ... beside it): each name looks free (nothing is there), and no video can be written through
    it, as none can in a folder gone read-only."""
    planted, now = [], time.time()
    for moment in range(int(now) - 1, int(now) + seconds):
        stamped = segment_path(video, moment)
        for name in [stamped] + [stamped.with_name(f"{stamped.stem}-{n}{stamped.suffix}") for n in (2, 3, 4)]:
            if not name.exists():
                name.symlink_to(video.parent / "gone" / name.name)
                planted.append(name)
    return planted


def test_a_segment_that_cannot_be_begun_is_said_its_frames_go_unwritten_and_the_next_is_tried_in_its_time(tmp_path):
    said: list[str] = []
    sink = logging_sink(tmp_path / "cam.avi", said)
    stream_into(sink, [flat, flat])
    planted = plant_unwritable_names(tmp_path / "cam.avi")
    stream_into(sink, [flat, flat, flat], first=2)  # the segments begun at 2 s and at 4 s are refused
    assert len(said) == 1 and said[0].startswith(f"warning: cannot begin the annotated video segment {tmp_path}")
    assert said[0].endswith("free some space or make its folder writable (--annotate-keep HOURS removes old segments "
                            "as new ones begin); the stream goes on, and a new segment is tried every 2 s")
    for name in planted:
        name.unlink()
    stream_into(sink, [flat] * 4, first=5)  # 5 s goes unwritten (its segment was refused at 4 s); 6 s begins one
    sink.close()
    assert said[1] == (f"note: the annotated video is written whole again from {sink.written[1]}, after 2 segments "
                       "refused (said above)")
    assert [frames_in(path) for path in sink.written] == [2, 2, 1] and sink.incomplete == []


def test_segments_still_refused_when_the_stream_ends_are_its_error(tmp_path):
    said: list[str] = []
    sink = logging_sink(tmp_path / "cam.avi", said)
    stream_into(sink, [flat, flat])
    plant_unwritable_names(tmp_path / "cam.avi")
    stream_into(sink, [flat] * 4, first=2)  # two segments refused
    with pytest.raises(IncompleteOutput, match=rf"the annotated video's last 2 segments of {tmp_path / 'cam.avi'} "
                                               r"could not be written \(said above\); free some space") as refused:
        sink.close()
    assert refused.value.exit_code == 1 and len(said) == 1
    sink.close()  # said once: closing again has nothing left to say
    assert sink.written == [sink.written[0]] and frames_in(sink.written[0]) == 2


def test_a_one_video_file_run_is_not_segmented_and_its_cut_off_video_is_still_the_error(tmp_path):
    said: list[str] = []
    sink = AnnotatedVideoSink(tmp_path / "whole.mp4", 1.0, lambda: {}, segment_seconds=None)
    sink.log = said.append
    with file_size_limit(64 * 1024):
        stream_into(sink, [noise] * 4)
        with pytest.raises(IncompleteOutput, match="is incomplete: 4 frames were written .* and run again$"):
            sink.close()
    assert said == [] and sink.incomplete == [tmp_path / "whole.mp4"]


def test_a_live_run_whose_disk_cuts_off_every_segment_goes_on_alerting_and_ends_with_the_error(
        exported, endless_stream, tmp_path):
    """As a service on a full disk: the stream is watched on, with the refusal said once, until it is stopped."""
    _, bundle = exported
    command = ["bash", "-c", f'ulimit -f 2 && exec "{sys.executable}" -m sdqes_edge.cli "$@"', "limited", "run",
               str(bundle), "--source", endless_stream, "--query", QUERY, "--threshold", "0.01", "--quiet",
               "--annotate", str(tmp_path / "cam.mp4"), "--annotate-segment", "1",
               "--events", str(tmp_path / "alerts.jsonl")]
    service = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("cam.*.mp4"))) < 4 and service.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seconds_to_stop(service) < 30
    err = service.stderr.read()
    assert service.returncode == 1 and "Traceback" not in err, err
    assert err.count("sdqes-edge: warning: the annotated video ") == 1, err
    assert "the stream goes on, and a new segment is tried every 1 s" in err
    assert len(list(tmp_path.glob("cam.*.mp4"))) >= 4  # the stream went on past the first refusal
    *_, ran, wrote, error = err.strip().splitlines()
    assert ran.startswith("interrupted after ") and error.startswith("sdqes-edge: error: the annotated video ")
    counted = re.search(r"\((\d+) videos, (\d+) of them incomplete\)$", wrote)
    assert counted and counted[1] == counted[2] and int(counted[1]) >= 4, wrote  # every one cut off
    assert [json.loads(line)["frame_index"] for line in (tmp_path / "alerts.jsonl").read_text().splitlines()] == [0]


def test_a_score_trace_chunk_the_disk_refuses_is_said_once_held_and_written_with_the_next(tmp_path):
    said: list[str] = []
    recorder = ScoreTraceRecorder(tmp_path / "scores.npz", "camera0", 1.0)
    recorder.log = said.append
    recorder.on_query_added("q1", QUERY, 0.0)
    recorder.CHUNK_ROWS, recorder.CHUNK_SECONDS = 4, 3600.0  # a chunk every 4 frames, never by the clock

    def step(t: int) -> None:
        recorder.on_frame(0, None, float(t), {"q1": t / 100}, [])

    with file_size_limit(256):  # no chunk fits
        for t in range(6):  # the chunk of frames 0-3 refused; frames 4-5 are not tried again at every frame
            step(t)
        assert said == [f"warning: cannot write the score trace {tmp_path / 'scores.npz'} (File too large); the "
                        f"stream goes on, its latest {recorder.HELD_ROWS} scores held in memory (older ones stand as "
                        "NaN) and tried again every 3600 s"]
        recorder.CHUNK_SECONDS = 0.0  # the clock's turn: tried again, refused again, not said again
        step(6)
        assert len(said) == 1
    step(7)  # room again: every row held goes out in this chunk
    assert said[1] == (f"note: the score trace {tmp_path / 'scores.npz'} is written again, the scores held meanwhile "
                       "with it")
    recorder.close()
    assert np.allclose(load_scores(tmp_path / "scores.npz").probs[:, 0], np.arange(8) / 100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.npz"]  # no chunk left


def test_a_score_trace_the_disk_still_refuses_when_the_stream_ends_is_raised(tmp_path):
    recorder = ScoreTraceRecorder(tmp_path / "scores.npz", "camera0", 1.0)
    recorder.log = lambda message: None
    recorder.on_query_added("q1", QUERY, 0.0)
    recorder.CHUNK_ROWS = 2
    with file_size_limit(256):
        for t in range(3):
            recorder.on_frame(0, None, float(t), {"q1": 0.5}, [])
        with pytest.raises(OSError):
            recorder.close()


def test_a_disk_that_refuses_for_long_lets_the_oldest_held_scores_go_as_nan_and_memory_stays_bounded(tmp_path):
    """A disk full for days held every row in memory until the kernel killed the service."""
    said: list[str] = []
    recorder = ScoreTraceRecorder(tmp_path / "scores.npz", "camera0", 1.0)
    recorder.log = said.append
    recorder.on_query_added("q1", QUERY, 0.0)
    recorder.CHUNK_ROWS, recorder.CHUNK_SECONDS, recorder.HELD_ROWS = 4, 3600.0, 8
    with file_size_limit(256):
        for t in range(20):
            recorder.on_frame(0, None, float(t), {"q1": t / 100}, [])
            assert len(recorder._rows) <= recorder.HELD_ROWS
    recorder.CHUNK_SECONDS = 0.0
    recorder.on_frame(0, None, 20.0, {"q1": 0.2}, [])  # room again: frames 16-20 held, 0-15 let go 4 at a time
    assert said[-1].endswith("is written again, the scores held meanwhile with it (16 older ones stand as NaN)")
    recorder.close()
    probs = load_scores(tmp_path / "scores.npz").probs[:, 0]
    assert len(probs) == 21 and np.isnan(probs[:16]).all()  # every frame keeps its row, at its own time
    assert np.allclose(probs[16:], np.arange(16, 21) / 100)
