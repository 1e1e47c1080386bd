"""EgoSDQES annotations (../shared/data/egosdqes_all.csv) as streaming-evaluation queries. numpy only."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .errors import UserError
from .files import encoding_name, user_text_encoding
from .metrics import ScoreTrace, frame_at_or_after
from .path_checks import path_problem

MAX_VIDEO_FRAMES = 2**31  # a video_length beyond (over 2 years at 30 fps) is no count of a video's frames
REQUIRED_COLUMNS = ("split", "source", "video_uid", "query", "response", "label", "video_start_time",
                    "video_fps", "video_length")


@dataclass(frozen=True)
class Annotation:
    split: str
    source: str  # "moments" | "nlq"
    video_uid: str
    query: str
    response: str  # the alert message to show the user
    label: str
    start_time: float  # seconds from the start of the video
    video_seconds: float
    row: int
    asked_time: float = 0.0  # when the query was issued (optional `asked_time` column); 0 = before the stream
    clip_uid: str = ""  # the clip the annotation came from (optional `clip_uid` column)

    def start_frame(self, fps: float) -> int:
        return frame_at_or_after(self.start_time, fps)

    def stream_frames(self, fps: float) -> int:
        """Sampled frames in the whole video at ``fps`` (never fewer than reach the start frame)."""
        return max(int(self.video_seconds * fps), self.start_frame(fps) + 1)


def with_typed_columns(reader: csv.DictReader) -> csv.DictReader:
    """``reader`` (of a user's CSV: annotations, queries) with its header read and its column names taken as a
    spreadsheet's author types them: "Query" or "query, response" (a space after the comma) matched no column."""
    if reader.fieldnames:
        reader.fieldnames = [name.strip().lower() for name in reader.fieldnames]
    return reader


def load_annotations(path: str, split: str | None = None, source: str | None = None) -> list[Annotation]:
    """The annotations of ``path`` (of one split and source, where given), every row checked: a row a user's own
    corpus got wrong is refused naming its line, the column and the value."""
    problem = path_problem(path, "file")
    if problem:
        raise UserError(f"annotation file {path} {problem}; pass the EgoSDQES CSV (egosdqes_all.csv)")
    encoding = user_text_encoding(path)  # a file, not a pipe that reading its first bytes would wait on
    try:
        with open(path, newline="", encoding=encoding) as fh:
            reader = with_typed_columns(csv.DictReader(fh))
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise UserError(f"{path} is not an EgoSDQES annotation file: missing column(s) {', '.join(missing)}"
                                + other_separator_words(reader.fieldnames))
            rows = [(reader.line_num, r) for r in reader]  # the line a row ends on, for the messages
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path} is not a {encoding_name(encoding)} CSV file ({exc}); pass the EgoSDQES CSV "
                        "(egosdqes_all.csv)") from None
    out = []
    for i, (line, r) in enumerate(rows):
        if (split and r["split"] != split) or (source and r["source"] != source):
            continue
        number = _RowNumbers(path, line, r)
        # Starts may lie a little before the video (15 rows of EgoSDQES do): the metrics clamp them to frame 0.
        start, fps = number("video_start_time"), number("video_fps", 0.0, inclusive=False)
        if not r["query"].strip():  # scoring it would fail its whole video, every re-run
            raise UserError(f"{path} line {line}: query is empty; fix or remove that row")
        out.append(Annotation(r["split"], r["source"], r["video_uid"], r["query"], r["response"], r["label"],
                              start, _video_seconds(number, start, fps), i,
                              number("asked_time", default=0.0), r.get("clip_uid") or ""))
    return out


def _video_seconds(number: "_RowNumbers", start: float, fps: float) -> float:
    """A row's video length in seconds, refused where it holds no video a stream could show (a length of 1e300
    frames ended in numpy's "maximum allowed dimension exceeded"), or where the event starts after the video ends:
    a start given as a frame number or in milliseconds, not in seconds, was scored as an event never shown."""
    frames = number("video_length", 0.0)
    where = f"{number.path} line {number.line}"
    if frames > MAX_VIDEO_FRAMES:
        raise UserError(f"{where}: video_length is {frames:g} frames, more than a video holds ({MAX_VIDEO_FRAMES}: "
                        f"{MAX_VIDEO_FRAMES / fps / 86400:.0f} days at {fps:g} fps); it counts the video's frames; "
                        "fix or remove that row")
    seconds = frames / fps
    if start > seconds + 1.0 / fps:  # a frame's rounding of slack: EgoSDQES' latest start is 0.5 s before its end
        raise UserError(f"{where}: video_start_time {start:g} s is past the end of its video ({frames:g} frames at "
                        f"{fps:g} fps: {seconds:g} s); it is seconds from the video's start, not a frame number or "
                        "milliseconds; fix or remove that row")
    return seconds


def other_separator_words(header: list[str] | None) -> str:
    """Words for a header read as one column because another character separates it (a spreadsheet set to a
    European locale saves ';'), else ''."""
    if header and len(header) == 1:
        for separator in (";", "\t", "|"):
            if separator in header[0]:
                return f" (its header is separated by {separator!r}, not by commas: save it as comma-separated CSV)"
    return ""


def require_annotations(path: str, split: str | None = None, source: str | None = None) -> list[Annotation]:
    """``load_annotations``, refusing a selection that matches nothing with what the file does hold (a corpus of
    test streams only was refused as having no 'val' annotations, eval's default, and no more)."""
    found = load_annotations(path, split=split, source=source)
    if found:
        return found
    with open(path, newline="", encoding=user_text_encoding(path)) as fh:  # read and checked whole a moment ago
        rows = list(with_typed_columns(csv.DictReader(fh)))
    if not rows:
        raise UserError(f"{path} holds no annotations at all (a header only)")
    asked = " and ".join(f"{column} {value!r}" for column, value in (("split", split), ("source", source)) if value)
    held = "; ".join(f"{column}s {', '.join(sorted({r[column] for r in rows}))}" for column in ("split", "source"))
    raise UserError(f"{path} has no annotations for {asked}; it has {held} (choose with --split and --source)")


@dataclass(frozen=True)
class _RowNumbers:
    """The numbers of one CSV row, each refused unless finite and not below its minimum (above it, where not
    ``inclusive``)."""

    path: str
    line: int
    row: dict

    def __call__(self, column: str, minimum: float = -math.inf, inclusive: bool = True,
                 default: float | None = None) -> float:
        text = self.row.get(column)
        if default is not None and not text:
            return default
        if text is None:  # csv gives None for the fields a short row lacks
            raise UserError(f"{self.path} line {self.line} has fewer fields than the header (no {column}); fix or "
                            "remove that row")
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            kind = "a number" if minimum == -math.inf else f"a number {'>=' if inclusive else '>'} {minimum:g}"
            raise UserError(f"{self.path} line {self.line}: {column} is {text!r}, not {kind}; fix or remove that row")
        return value


def by_video(annotations: list[Annotation]) -> dict[str, list[Annotation]]:
    groups: dict[str, list[Annotation]] = defaultdict(list)
    for a in annotations:
        groups[a.video_uid].append(a)
    return dict(groups)


def oracle_traces(annotations: list[Annotation], fps: float = 1.0) -> list[ScoreTrace]:
    """Scores that rise exactly at each ground-truth start: must give SR@k = 100 and SMD@k = 0."""
    traces = []
    for a in annotations:
        probs = np.zeros(a.stream_frames(fps))
        probs[a.start_frame(fps)] = 1.0
        traces.append(ScoreTrace(probs, a.start_time, fps, a.asked_time, query_id=str(a.row)))
    return traces


def random_traces(annotations: list[Annotation], fps: float = 1.0, seed: int = 0) -> list[ScoreTrace]:
    """Uniform random scores (seeded): the chance baseline."""
    rng = np.random.default_rng(seed)
    return [ScoreTrace(rng.random(a.stream_frames(fps)), a.start_time, fps, a.asked_time, query_id=str(a.row))
            for a in annotations]
