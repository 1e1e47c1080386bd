"""Synthetic event streams in the shape of EgoSDQES: videos where queried events start at known times.

No real egocentric video can be downloaded here, so the SDK makes its own: a
small scene (a door, a lamp, balls and squares of named colours) drawn with
OpenCV from a seed, in which events start at known times, and annotations in
the EgoSDQES CSV columns (query, response, label, start/end seconds, fps,
length) so that ``annotations.load_annotations`` and ``sdqes-edge eval`` read
them unchanged. Some events can be seen in one frame (a square appears); the
others need the stream's past, which is what temporal adapters are for:

- ``square_appears``  a square of a colour appears                       (single frame)
- ``starts_moving``   the ball, still until then, starts rolling          (temporal: needs motion)
- ``stops``           the rolling ball comes to rest                      (temporal)
- ``lamp_after_door`` the lamp turns on after the door was opened (and shut
                      again); it may also flicker on before the door opens,
                      which looks the same in a single frame              (temporal: needs memory)
- ``second_ball``     the second time the small ball comes into view      (temporal: needs counting)
"""

from __future__ import annotations

import csv
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import DoesNotFit
from .progress import with_progress
from .sample import check_fits_in_memory, image_bytes

COLOURS = {"red": (40, 40, 220), "blue": (220, 80, 30), "green": (60, 180, 60), "yellow": (40, 210, 230),
           "purple": (170, 60, 150)}  # BGR
# Where things are drawn, as fractions of the frame. Everything lies inside the centre square, because
# CLIP's preprocessing crops a 4:3 frame to its middle square (x from 12.5% to 87.5%).
DOOR_X = (0.15, 0.28)
LAMP_CENTRE = (0.78, 0.15)  # (x, y)
BALL_TRACK_X = (0.32, 0.85)  # the big ball rolls along the floor and wraps around in this band
SMALL_BALL_CENTRE = (0.6, 0.45)
SQUARE_CORNER = (0.45, 0.12)
SINGLE_FRAME_EVENTS = ("square_appears",)
TEMPORAL_EVENTS = ("starts_moving", "stops", "lamp_after_door", "second_ball")
EVENT_KINDS = SINGLE_FRAME_EVENTS + TEMPORAL_EVENTS

# Several phrasings per event: (query, alert message). {colour} is filled in.
PHRASINGS = {
    "square_appears": [("Tell me when a {colour} square appears.", "A {colour} square is here."),
                       ("Remind me when I see the {colour} square.", "There is the {colour} square.")],
    "starts_moving": [("Tell me when the {colour} ball starts rolling.", "The ball is moving."),
                      ("Let me know as soon as the {colour} ball begins to move.",
                       "The {colour} ball started moving.")],
    "stops": [("Tell me when the rolling {colour} ball stops.", "The ball has stopped."),
              ("Remind me when the {colour} ball comes to rest.", "The {colour} ball is still now.")],
    "lamp_after_door": [("When the lamp turns on after the door opened, remind me to close the door.",
                         "Close the door."),
                        ("Once the door is open and the light comes on, tell me.",
                         "The light is on and the door is open.")],
    "second_ball": [("Tell me the second time the small {colour} ball shows up.", "The small ball is back."),
                    ("Remind me when the {colour} ball appears again.", "The {colour} ball appeared again.")],
}

CSV_COLUMNS = ("split", "source", "video_uid", "clip_uid", "annotator_uid", "ann_idx", "query", "response", "label",
               "video_start_time", "video_end_time", "video_fps", "video_length")


@dataclass(frozen=True)
class Event:
    kind: str
    start_time: float  # seconds
    end_time: float
    query: str
    response: str
    colour: str

    @property
    def temporal(self) -> bool:
        return self.kind in TEMPORAL_EVENTS


@dataclass
class Stream:
    uid: str
    frames: np.ndarray  # [T, H, W, 3] uint8 BGR
    fps: float
    events: list[Event]

    @property
    def seconds(self) -> float:
        return len(self.frames) / self.fps


# Every event must start on a frame of its video, or its annotation names a start the video never reaches. By
# ``_timeline``, every event starts before 0.9 of the stream (the square; the lamp too, once a stream is 20 s
# long: the door opens by 0.6 of it and the lamp comes max(6 s, 0.1-0.3 of it) later; at 10 s the lamp came
# after the end in 114 streams of 200 at 2 fps), and is shown by the first frame at or after its start.
LATEST_EVENT_FRACTION = 0.9
MIN_STREAM_SECONDS = 20.0


def stream_length_problem(seconds: float, fps: float) -> str | None:
    """Why streams of ``seconds`` at ``fps`` cannot show every event of a scene (None: they can)."""
    frames = seconds * fps
    if seconds >= MIN_STREAM_SECONDS and math.isfinite(frames) and frames > 0:  # NaN fails the comparison
        # The frame of an event that starts just before LATEST_EVENT_FRACTION of the stream must be in the video.
        if math.ceil(LATEST_EVENT_FRACTION * frames) <= round(frames) - 1:
            return None
    return (f"streams of {seconds:g} s at {fps:g} fps cannot show every event of the synthetic scenes: events start "
            f"up to {LATEST_EVENT_FRACTION:g} of the way through a stream, which must be at least "
            f"{MIN_STREAM_SECONDS:g} s long and have a frame after that point")


def _timeline(rng: np.random.Generator, seconds: float) -> dict:
    """When everything happens, in seconds; every event leaves at least a few seconds before it."""
    t = {}
    t["square"] = rng.uniform(0.2, 0.9) * seconds
    t["move"] = rng.uniform(0.15, 0.45) * seconds
    t["stop"] = t["move"] + rng.uniform(0.2, 0.35) * seconds
    t["door"] = rng.uniform(0.2, 0.6) * seconds
    t["door_shut"] = t["door"] + rng.uniform(3.0, 5.0)  # shut again before the lamp comes on
    t["lamp"] = t["door"] + max(6.0, rng.uniform(0.1, 0.3) * seconds)
    # The lamp on for 2 s before the door opens (a distractor for "after the door opened"), ending 0.5 s before it.
    latest = t["door"] - 2.5
    flicker = rng.uniform(0.02 * seconds, latest) if latest > 0.02 * seconds else None
    t["flicker"] = flicker if rng.random() < 0.7 else None
    t["ball_in"] = rng.uniform(0.05, 0.3) * seconds
    t["ball_out"] = t["ball_in"] + rng.uniform(0.1, 0.2) * seconds
    t["ball_again"] = t["ball_out"] + rng.uniform(0.1, 0.3) * seconds
    return t


def _draw_objects(img: np.ndarray, now: float, t: dict, ball_x: int, colours: tuple[str, str, str]) -> None:
    """The scene's objects at time ``now`` drawn over ``img`` (BGR uint8 [H, W, 3]) in place."""
    import cv2

    height, width = img.shape[:2]
    square_colour, ball_colour, small_colour = colours
    floor_y, ball_r = int(height * 0.8), max(3, height // 12)
    # The door on the left: closed (brown panel), open (dark gap, panel swung aside) for a few seconds.
    dx0, dx1, dy0 = int(width * DOOR_X[0]), int(width * DOOR_X[1]), int(height * 0.3)
    if not t["door"] <= now < t["door_shut"]:
        cv2.rectangle(img, (dx0, dy0), (dx1, floor_y), (40, 70, 120), -1)
    else:
        cv2.rectangle(img, (dx0, dy0), (dx1, floor_y), (20, 20, 20), -1)
        cv2.rectangle(img, (dx0, dy0), (dx0 + (dx1 - dx0) // 4, floor_y), (40, 70, 120), -1)
    # The lamp, top right: yellow when on.
    lamp_on = now >= t["lamp"] or (t["flicker"] is not None and t["flicker"] <= now < t["flicker"] + 2.0)
    cv2.circle(img, (int(width * LAMP_CENTRE[0]), int(height * LAMP_CENTRE[1])), max(3, height // 14),
               (80, 230, 250) if lamp_on else (90, 90, 90), -1)
    cv2.circle(img, (ball_x, floor_y - ball_r), ball_r, COLOURS[ball_colour], -1)
    # The small ball: in view twice.
    if t["ball_in"] <= now < t["ball_out"] or now >= t["ball_again"]:
        centre = (int(width * SMALL_BALL_CENTRE[0]), int(height * SMALL_BALL_CENTRE[1]))
        cv2.circle(img, centre, max(2, ball_r // 2), COLOURS[small_colour], -1)
    # The square appears and stays.
    if now >= t["square"]:
        side = max(4, height // 6)
        sx, sy = int(width * SQUARE_CORNER[0]), int(height * SQUARE_CORNER[1])
        cv2.rectangle(img, (sx, sy), (sx + side, sy + side), COLOURS[square_colour], -1)


def generate_stream(seed: int, seconds: float = 60.0, fps: float = 2.0, height: int = 96, width: int = 128,
                    uid: str | None = None, noise: float = 3.0) -> Stream:
    """One scene, drawn at ``fps``; the events' start times are exact to the frame."""
    problem = stream_length_problem(seconds, fps)
    if problem:
        raise ValueError(problem)
    rng = np.random.default_rng(seed)
    t = _timeline(rng, seconds)
    square_colour, ball_colour, small_colour = rng.choice(list(COLOURS), size=3, replace=False)
    count = int(round(seconds * fps))
    check_fits_in_memory(image_bytes(count, height, width), f"{count} frames of {width}x{height}")
    frames = np.empty((count, height, width, 3), dtype=np.uint8)
    background = np.array(rng.uniform(90, 160, size=3), dtype=np.float32)
    floor_y = int(height * 0.8)
    track0, track1 = BALL_TRACK_X[0] * width, BALL_TRACK_X[1] * width
    x0 = rng.uniform(track0, track1)  # anywhere on the track: where a still ball sits says nothing
    speed = rng.uniform(0.04, 0.08) * width  # pixels per second
    for i in range(len(frames)):
        now = i / fps
        frame = np.empty((height, width, 3), dtype=np.float32)
        frame[:] = background
        frame[floor_y:] = background * 0.7
        if noise:
            frame += rng.normal(0, noise, size=frame.shape).astype(np.float32)  # sensor noise
        img = np.clip(frame, 0, 255).astype(np.uint8)
        # The big ball on the floor: still, then rolling right (wrapping), then still again.
        if now < t["move"]:
            x = x0
        elif now < t["stop"]:
            x = x0 + speed * (now - t["move"])
        else:
            x = x0 + speed * (t["stop"] - t["move"])
        x = track0 + (x - track0) % (track1 - track0)
        _draw_objects(img, now, t, int(x), (square_colour, ball_colour, small_colour))
        frames[i] = img

    def frame_time(seconds_: float) -> float:
        """The time of the first frame at or after ``seconds_`` (what a viewer of the video sees)."""
        return float(np.ceil(seconds_ * fps - 1e-9) / fps)

    starts = {"square_appears": (t["square"], square_colour), "starts_moving": (t["move"], ball_colour),
              "stops": (t["stop"], ball_colour), "lamp_after_door": (t["lamp"], ""),
              "second_ball": (t["ball_again"], small_colour)}
    events = []
    for kind, (start, colour) in starts.items():
        query, response = PHRASINGS[kind][int(rng.integers(len(PHRASINGS[kind])))]
        start = frame_time(start)
        events.append(Event(kind, start, min(start + 5.0, seconds), query.format(colour=colour),
                            response.format(colour=colour), colour))
    return Stream(uid or f"synthetic-{seed:06d}", frames, fps, events)


def write_video(path: Path, stream: Stream) -> Path:
    """``stream``'s frames as an MJPG AVI at ``path``, read back: OpenCV's writer says nothing of a disk that filled
    up, and the demo then streamed an empty video, synth wrote a dataset of them (an ``IncompleteOutput``)."""
    import cv2

    from .runtime.annotated_video import IncompleteOutput, frames_read_back, incomplete_video_words

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), stream.fps,
                             (stream.frames.shape[2], stream.frames.shape[1]))
    for frame in stream.frames:
        writer.write(frame)
    writer.release()
    readable = frames_read_back(path)
    if readable < len(stream.frames):
        raise IncompleteOutput(incomplete_video_words(path, len(stream.frames), readable, what="the video"))
    return path


def write_dataset(out: str | Path, seeds: dict[str, Sequence[int]], seconds: float = 60.0, fps: float = 2.0,
                  progress: bool = False) -> Path:
    """Videos (MJPG .avi) and ``annotations.csv`` for each split; a stream belongs to one split only.

    Each stream's rows are written as it is made, so memory stays flat however many streams are asked. Once the
    first video is written, streams that would not fit on the disk at its size are refused, before the disk fills
    (``DoesNotFit``). ``progress``: a bar on stderr (``sdqes_edge.progress``)."""
    out = Path(out)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    _refuse_shared_streams(seeds)
    total = sum(len(split_seeds) for split_seeds in seeds.values())
    made = ((split, seed) for split, split_seeds in seeds.items() for seed in split_seeds)
    with open(out / "annotations.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for count, (split, seed) in enumerate(with_progress(made, "writing", "stream", total, progress)):
            stream = generate_stream(seed, seconds, fps)
            video = write_video(out / "videos" / f"{stream.uid}.avi", stream)
            writer.writerows(annotation_rows(stream, split))
            if count == 0:  # the first video's size stands for every one's
                _refuse_beyond_disk(video.stat().st_size, total, out)
    return out / "annotations.csv"


def _refuse_beyond_disk(each: int, total: int, out: Path) -> None:
    """Refuse ``total`` streams of about ``each`` bytes, one already written to ``out``, that the disk cannot hold."""
    from .files import format_bytes

    free = shutil.disk_usage(out).free
    if free < each * (total - 1):
        raise DoesNotFit(f"{total} streams of about {format_bytes(each)} each need about {format_bytes(each * total)}, "
                         f"and the disk they are written to has {format_bytes(free)} free; write fewer or shorter "
                         "streams, or write them to a disk with room")


def annotation_rows(stream: Stream, split: str) -> list[dict]:
    """The EgoSDQES annotation rows (CSV_COLUMNS) of a stream's events."""
    return [{"split": split, "source": "temporal" if e.temporal else "single_frame", "video_uid": stream.uid,
             "clip_uid": stream.uid, "annotator_uid": "generator", "ann_idx": i, "query": e.query,
             "response": e.response, "label": e.kind, "video_start_time": e.start_time,
             "video_end_time": e.end_time, "video_fps": stream.fps, "video_length": len(stream.frames)}
            for i, e in enumerate(stream.events)]


def _refuse_shared_streams(seeds: dict[str, Sequence[int]]) -> None:
    """A stream (seed) in two splits would leak test streams into training. Ranges (what the command line gives)
    are compared by their ends: a set of a hundred million seeds took gigabytes before a stream was written."""
    if all(isinstance(s, range) and s.step == 1 for s in seeds.values()):
        spans = sorted((s.start, s.stop, split) for split, s in seeds.items() if len(s))
        for (_, stop, _), (start, own_stop, split) in zip(spans, spans[1:]):
            if start < stop:
                raise ValueError(f"split {split} shares streams with another split: seeds {start} to "
                                 f"{min(stop, own_stop) - 1}")
        return
    seen: set[int] = set()
    for split, split_seeds in seeds.items():
        if seen & set(split_seeds):
            raise ValueError(f"split {split} shares streams with another split: {sorted(seen & set(split_seeds))}")
        seen |= set(split_seeds)
