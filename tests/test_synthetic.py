"""Synthetic event streams: each event starts on the annotated frame, and the annotations are EgoSDQES-shaped."""

from __future__ import annotations

import numpy as np
import pytest

from sdqes_edge.annotations import load_annotations, oracle_traces
from sdqes_edge.metrics import evaluate
from sdqes_edge.synthetic import (
    COLOURS,
    DOOR_X,
    EVENT_KINDS,
    LAMP_CENTRE,
    TEMPORAL_EVENTS,
    generate_stream,
    stream_length_problem,
    write_dataset,
)

FPS = 2.0


def colour_mask(frames: np.ndarray, colour: str) -> np.ndarray:
    """[T, H, W]: where each frame shows exactly this colour (frames drawn without sensor noise)."""
    return np.all(frames == np.array(COLOURS[colour], dtype=np.uint8), axis=-1)


def centre_x(mask: np.ndarray) -> np.ndarray:
    """Mean column of the masked pixels per frame (NaN where none)."""
    cols = np.arange(mask.shape[2])
    counts = mask.sum(axis=(1, 2))
    return np.where(counts > 0, (mask.sum(axis=1) * cols).sum(axis=1) / np.maximum(counts, 1), np.nan)


def lamp_on(frames: np.ndarray) -> np.ndarray:
    h, w = frames.shape[1:3]
    return np.all(frames[:, int(h * LAMP_CENTRE[1]), int(w * LAMP_CENTRE[0])] == (80, 230, 250), axis=-1)


def door_is_open(frames: np.ndarray) -> np.ndarray:
    h, w = frames.shape[1:3]
    gap_x = int(w * (DOOR_X[0] + 3 * DOOR_X[1]) / 4)  # inside the dark gap the open door leaves
    return np.all(frames[:, int(h * 0.5), gap_x] == (20, 20, 20), axis=-1)


@pytest.mark.parametrize("seed", range(12))
def test_every_event_starts_exactly_on_its_annotated_frame(seed):
    stream = generate_stream(seed, fps=FPS, noise=0.0)  # no sensor noise, so colours can be matched exactly
    frames = stream.frames
    start = {e.kind: int(round(e.start_time * FPS)) for e in stream.events}
    colour = {e.kind: e.colour for e in stream.events}
    assert set(start) == set(EVENT_KINDS)
    assert all(2 <= t < len(frames) - 2 for t in start.values())

    square = colour_mask(frames, colour["square_appears"]).any(axis=(1, 2))
    t = start["square_appears"]
    assert square[t] and not square[:t].any()

    floor = frames[:, int(frames.shape[1] * 0.6):]  # the big ball rolls on the floor band
    x = centre_x(colour_mask(floor, colour["starts_moving"]))
    t = start["starts_moving"]
    assert np.all(x[:t] == x[0]) and x[t + 1] != x[t - 1]  # still until the start, rolling after it
    t = start["stops"]
    assert x[t - 1] != x[t - 2] and np.all(x[t:] == x[-1])  # rolling until the stop, still from it on

    lamp, door_open = lamp_on(frames), door_is_open(frames)
    t = start["lamp_after_door"]
    assert lamp[t] and not lamp[t - 1] and not door_open[0]
    # The door opened before and is shut again: the frame at the start alone looks like an early flicker.
    assert door_open[:t].any() and not door_open[t - 1] and not door_open[t]

    small = colour_mask(frames, colour["second_ball"]).any(axis=(1, 2))
    t = start["second_ball"]
    assert small[t] and not small[t - 1] and small[: t - 1].any()  # seen before, gone, back


def test_streams_are_reproducible_from_their_seed():
    a, b, c = generate_stream(5), generate_stream(5), generate_stream(6)
    np.testing.assert_array_equal(a.frames, b.frames)
    assert [e.start_time for e in a.events] == [e.start_time for e in b.events]
    assert not np.array_equal(a.frames, c.frames)


def test_a_dataset_loads_as_egosdqes_annotations_and_the_oracle_scores_100(tmp_path):
    csv = write_dataset(tmp_path, {"train": [1, 2], "val": [3], "test": [4]}, seconds=30.0, fps=FPS)
    test = load_annotations(str(csv), split="test")
    assert len(test) == len(EVENT_KINDS)
    assert {a.source for a in test} == {"temporal", "single_frame"}
    assert sum(a.source == "temporal" for a in test) == len(TEMPORAL_EVENTS)
    assert all(a.video_seconds == 30.0 for a in test)
    assert (tmp_path / "videos" / f"{test[0].video_uid}.avi").stat().st_size > 0
    result = evaluate(oracle_traces(load_annotations(str(csv)), fps=FPS), 0.5)
    assert result.recall["[-5,+10]"][1] == 100.0 and result.min_distance[1] == 0.0
    with pytest.raises(ValueError, match="shares streams"):
        write_dataset(tmp_path / "x", {"train": [1], "test": [1]})


def test_the_lamp_also_lights_before_the_door_opens_so_one_frame_cannot_tell_the_event():
    flickers = 0
    for seed in range(12):
        frames = generate_stream(seed, fps=FPS, noise=0.0).frames
        lamp, door_open = lamp_on(frames), door_is_open(frames)
        never_opened_yet = np.cumsum(door_open) == 0
        flickers += bool(np.any(lamp & never_opened_yet))
    assert flickers >= 4


def test_the_synth_command_writes_a_dataset_that_eval_reads(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "data"
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "synth", "--out", str(out), "--train", "1",
                           "--val", "1", "--test", "2", "--seconds", "20"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "next: sdqes-edge eval" in done.stdout
    assert len(list((out / "videos").glob("*.avi"))) == 4
    evaluated = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "eval", "--annotations",
                                str(out / "annotations.csv"), "--split", "test", "--fps", "2", "--baseline", "oracle",
                                "--plots", "0", "--out", str(tmp_path / "eval")], capture_output=True, text=True)
    assert evaluated.returncode == 0, evaluated.stderr
    oracle = json.loads((tmp_path / "eval" / "eval.json").read_text())["results"]["oracle"]
    assert oracle["queries"] == 2 * len(EVENT_KINDS) and oracle["recall"]["[-5,+10]"]["1"] == 100.0
    again = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "synth", "--out", str(out)], capture_output=True,
                           text=True)
    assert again.returncode == 2 and "not empty" in again.stderr


@pytest.mark.parametrize("seconds, fps", [(20.0, 0.5), (20.0, 1.0), (25.0, 0.3), (30.0, 0.5), (21.0, 7.3)])
def test_every_event_starts_on_a_frame_of_its_video_at_every_length_the_generator_takes(seconds, fps):
    # Lengths at the edge of what stream_length_problem allows; at 10 s the lamp came after the end of the video
    # in 114 streams of 200 (at 2 fps), and its annotation named a start the video never reached.
    assert stream_length_problem(seconds, fps) is None
    for seed in range(40):
        stream = generate_stream(seed, seconds, fps, height=24, width=32, noise=0.0)
        last_frame_time = (len(stream.frames) - 1) / fps
        assert all(0.0 < e.start_time <= last_frame_time + 1e-9 for e in stream.events), (seed, stream.events)
        assert all(e.start_time <= e.end_time <= seconds for e in stream.events)


@pytest.mark.parametrize("seconds, fps", [(10.0, 2.0), (19.9, 2.0), (21.0, 0.5), (60.0, 0.1), (20.0, float("nan"))])
def test_a_stream_too_short_for_every_event_is_refused_before_a_frame_is_drawn(seconds, fps):
    with pytest.raises(ValueError, match="cannot show every event of the synthetic scenes"):
        generate_stream(0, seconds, fps)


def test_synth_refuses_too_short_streams_in_one_line_and_writes_nothing(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "data"
    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "synth", "--out", str(out), "--seconds", "10"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "streams of 10 s at 2 fps cannot show every event" in done.stderr
    assert "raise --seconds or --fps" in done.stderr
    assert not out.exists()


def test_a_synth_that_fails_half_way_leaves_no_folder_behind_and_a_full_disk_is_one_line(tmp_path, monkeypatch,
                                                                                       capsys):
    # A failure after some videos were written (here a full disk at the third) used to leave a half dataset that
    # the next synth into the same --out refused as "not empty", after a traceback. The error names the folder.
    import sdqes_edge.synthetic as synthetic
    from sdqes_edge.cli import run

    written = []
    real_write_video = synthetic.write_video

    def write_video_until_the_disk_fills(path, stream):
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(path)
        return real_write_video(path, stream)

    monkeypatch.setattr(synthetic, "write_video", write_video_until_the_disk_fills)
    out = tmp_path / "data"
    assert run(["synth", "--out", str(out), "--train", "3", "--val", "0", "--test", "1", "--seconds", "20"]) == 1
    assert len(written) == 2 and not out.exists() and list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: the disk is full writing {out} (No space left on device); free some" in err


def test_synth_points_eval_at_a_split_it_wrote(tmp_path, capsys):
    from sdqes_edge.cli import run

    assert run(["synth", "--out", str(tmp_path / "d"), "--train", "1", "--val", "0", "--test", "0",
                "--seconds", "20"]) == 0
    out = capsys.readouterr().out
    assert "--split train --fps 2" in out  # it said --split test, which had no stream
    assert out.startswith("wrote 1 stream of 20 s")  # not "1 streams"


def test_streams_that_would_not_fit_on_the_disk_are_refused_once_the_first_is_written_and_nothing_is_left(
        tmp_path, capsys):
    """`synth --train 100000000` (a typo for 1000) built lists and sets of a hundred million seeds, 12 GB within a
    minute, before it wrote a stream, then would have filled the disk over weeks without a word of progress."""
    from sdqes_edge.cli import run

    out = tmp_path / "data"
    assert run(["synth", "--out", str(out), "--train", "100000000", "--seconds", "20"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: 100000010 streams of about " in err
    assert "and the disk they are written to has " in err and "write fewer or shorter streams" in err
    assert list(tmp_path.iterdir()) == []


def test_a_dataset_is_the_same_whether_its_splits_are_given_as_lists_or_as_ranges(tmp_path):
    as_lists = write_dataset(tmp_path / "lists", {"train": [0, 1], "test": [2]}, seconds=20.0, fps=FPS)
    as_ranges = write_dataset(tmp_path / "ranges", {"train": range(2), "test": range(2, 3)}, seconds=20.0, fps=FPS)
    assert as_lists.read_bytes() == as_ranges.read_bytes()
    with pytest.raises(ValueError, match="split test shares streams with another split: seeds 1 to 1"):
        write_dataset(tmp_path / "x", {"train": range(2), "test": range(1, 3)})
    with pytest.raises(ValueError, match="split test shares streams with another split: seeds 3 to 4$"):
        write_dataset(tmp_path / "y", {"train": range(10), "test": range(3, 5)})
