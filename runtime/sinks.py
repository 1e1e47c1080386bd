"""Where alerts go: a Python callback, a JSONL file, the console (an annotated video: ``annotated_video``); plus
the score trace.

Every sink is closed in a ``finally`` by the detector, so an interrupted stream
still leaves a complete JSONL log (flushed per event) and a score trace.
"""

from __future__ import annotations

import errno
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from sdqes_edge.errors import UserError, is_whole_number, terminal_safe
from sdqes_edge.path_checks import SCORE_TRACE_EXAMPLE, check_output_file, check_trace_path
from sdqes_edge.traces import StreamScores, chunk_path, chunks_of, load_scores, merge_chunks, read_chunks, save_scores

from .output_locks import SCORE_TRACE, hold, release
from .sampling import checked_rate


def utc_timestamp() -> str:
    """Now as ISO 8601 in UTC, to the millisecond: "2026-11-27T22:10:03.123Z" (the native runtime writes the same)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class AlertEvent:
    query_id: str
    query: str
    message: str
    stream: str
    stream_time: float  # seconds
    frame_index: int
    score: float  # p = sigmoid(cos)
    cosine: float
    latency_ms: float  # from the frame leaving the source to the alert
    # The query's policy threshold that p rose above, and its label (None: none given): with per-label and per-query
    # thresholds a reader of the log could not otherwise tell why an alert fired, or route it by kind.
    threshold: float | None = None
    label: str | None = None
    # When the alert was raised, UTC: a live stream's alert log read beside the world's clocks (stream_time counts
    # from the stream's start, which a restarted run or a reconnected camera moves).
    wall_time: str = field(default_factory=utc_timestamp)

    def to_dict(self) -> dict:
        return asdict(self)


class Sink:
    finished = False  # closed by a detector (close_all): its output is complete, and it takes no more
    refusal: Exception | None = None  # what its close raised in close_all (a full disk): its output is incomplete

    def on_query_added(self, query_id: str, text: str, asked_time: float) -> None:
        """Called for every query, those active when the sink was attached included."""

    def on_frame(self, stream: int, frame_bgr: np.ndarray, time_s: float, probs: dict[str, float],
                 events: list[AlertEvent]) -> None:
        """Called for every processed frame (most sinks only care about events)."""

    def on_event(self, event: AlertEvent) -> None:
        pass

    def on_events(self, events: list[AlertEvent]) -> None:
        """A stream's alerts of one step, in order, after its ``on_frame``: each to ``on_event`` unless a sink takes
        them together (the alert log: one write and one sync for them all)."""
        for event in events:
            self.on_event(event)

    def on_sources_ended(self, ended: list[bool]) -> None:
        """Called as a run ends, before ``close``: per stream, whether the run stepped its source to the end (a
        file's last frame, a camera lost for good) rather than stopping first (max_frames, a stop, an error)."""

    def close(self) -> None:
        pass


def tell_sources_ended(sinks: list[Sink], ended: list[bool]) -> None:
    """``on_sources_ended`` of every sink, each failure keeping it from no other; the first is raised after."""
    failures = []
    for sink in sinks:
        try:
            sink.on_sources_ended(list(ended))
        except Exception as exc:  # noqa: BLE001  (raised below, once every sink has been told)
            failures.append(exc)
    if failures:
        raise failures[0]


def closed_sinks_words(sinks: list[Sink]) -> str:
    """Why a step after ``close`` (a run's end) is refused while the sinks it closed have no successors."""
    names = ", ".join(type(sink).__name__ + (f"({sink.path})" if getattr(sink, "path", None) else "")
                      for sink in sinks)
    return (f"this detector's sinks ({names}) were closed when its run ended (or by close()), each output finished, "
            "so this step's alerts would reach none of them; add new ones before stepping on (a JsonlSink of the "
            "same file appends to it), or make a new StreamingDetector")


class CallbackSink(Sink):
    def __init__(self, callback: Callable[[AlertEvent], None]):
        if not callable(callback):  # else the first alert, maybe hours in, fails with a TypeError
            raise UserError(f"CallbackSink takes a function of each alert (an AlertEvent), not a "
                            f"{type(callback).__name__}")
        self.callback = callback

    def on_event(self, event: AlertEvent) -> None:
        self.callback(event)


class ConsoleSink(Sink):
    def __init__(self, write: Callable[[str], None] = print):
        if not callable(write):  # else the first alert fails with a TypeError
            raise UserError(f"ConsoleSink takes a function that writes a line (print, logger.info), not a "
                            f"{type(write).__name__}")
        self.write = write

    def on_event(self, event: AlertEvent) -> None:
        minutes, seconds = divmod(event.stream_time, 60)
        try:
            self.write(terminal_safe(f"[{event.stream} {int(minutes):02d}:{seconds:04.1f}] {event.message}   "
                                     f"(query {event.query_id}: p={event.score:.3f}, frame {event.frame_index}, "
                                     f"{event.latency_ms:.0f} ms)"))
        except OSError as exc:  # print's refusal (stdout in a file on a full disk) names no file: it is stdout
            if self.write is not print or exc.filename is not None or exc.errno in (None, errno.EPIPE):
                raise
            raise OSError(exc.errno, exc.strerror, "stdout") from exc


def checked_stream(stream: object, sink: str) -> int:
    """The index of the detector's stream a sink records, refused unless it is one (a string never matched)."""
    if not is_whole_number(stream, least=0):
        raise UserError(f"{sink} records one of the detector's streams, by its index from 0, not {stream!r}")
    return int(stream)


# A score trace's news (a chunk the machine refused, then written again): to this logger unless a program sets the
# recorder's own ``log`` (the command line prints each as one line).
TRACE_LOG = logging.getLogger("sdqes_edge.runtime.sinks")


def tried_going_on(write: Callable[[], None], refused: bool, log: Callable[[str], None],
                   refused_words: Callable[[OSError], str], written_words: str) -> bool:
    """``write`` an output held back while the stream goes on -> whether the machine refuses it (a full disk).
    ``refused``: whether it refused the last try; a refusal is said once however many come in a row (the run had
    ended at the first), and the first write after them is said too."""
    try:
        write()
    except OSError as refusal:
        if not refused:
            log(refused_words(refusal))
        return True
    if refused:
        log(written_words)
    return False


class ScoreTraceRecorder(Sink):
    """Per-frame probabilities of every query (NaN before a query existed), saved in the eval format.

    Memory stays constant on an endless stream: rows are flushed to a chunk file every ``CHUNK_ROWS``
    frames or ``CHUNK_SECONDS`` of wall time (a killed run loses at most that much), and ``close`` merges
    the chunks into the trace at ``path`` a chunk at a time (sdqes_edge/traces.py). A chunk the machine refuses
    while the stream goes on (a full disk) is said once, its rows held and tried again every ``CHUNK_SECONDS``
    until written, and that said too; refused at ``close``, it is raised.
    """

    CHUNK_ROWS = 1024
    CHUNK_SECONDS = 30.0
    # Rows held at most while the disk refuses their chunk (3.6 h at 5 fps; 14 MiB with one query, 22 with five, by
    # tracemalloc): past it the oldest are let go, a chunk's rows at a time, and stand as NaN in the trace, so that a
    # disk full for days does not grow the service until the kernel kills it.
    HELD_ROWS = 64 * CHUNK_ROWS

    def __init__(self, path: str | Path, stream_name: str, fps: float, stream: int = 0, model: str = "",
                 first_frame: int = 0):
        """``model``: what scored the stream (``Bundle.model_identity``), recorded so that a threshold calibrated
        on these scores is never written into another model's bundle. ``first_frame``: the frame a resumed
        stream goes on at (``source.start_index``): the trace the stopped run left at ``path`` gives the rows
        before it, so this one is still the whole stream, each row at its own frame."""
        self.path = check_output_file(path, "ScoreTraceRecorder", SCORE_TRACE_EXAMPLE)
        check_trace_path(self.path, stream_name, "ScoreTraceRecorder")
        self.stream_name, self.stream, self.model = stream_name, checked_stream(stream, "ScoreTraceRecorder"), model
        self.fps = checked_rate(fps, "ScoreTraceRecorder records")
        self._rows: list[dict[str, float]] = []
        self._texts: dict[str, str] = {}
        self._asked: dict[str, float] = {}
        self._chunks: list[Path] = []
        self._flushed_rows = 0
        self._last_flush = time.monotonic()
        self.log: Callable[[str], None] = TRACE_LOG.warning
        self._refused = False  # the last chunk tried was refused: its rows are held
        self._let_go = 0  # rows before the held ones let go while refused: NaN in the next chunk
        self.source_ended: bool | None = None  # told as the run ends (on_sources_ended); None: not told
        self._lock = hold(self.path, "ScoreTraceRecorder", SCORE_TRACE)  # before its chunks, another process's maybe
        try:
            self._take_over_earlier(first_frame)
        except BaseException:
            release(self._lock)
            raise

    def _take_over_earlier(self, first_frame: int) -> None:
        stale = chunks_of(self.path)  # a killed earlier run's: this run replaces its trace
        self._lead_frames, self._earlier = first_frame, None
        if first_frame and (self.path.is_file() or stale):  # the stopped run's, merged or (killed) in chunks
            self._earlier = load_scores(self.path) if self.path.is_file() else read_chunks(stale)
        for chunk in stale:
            chunk.unlink()

    def on_query_added(self, query_id: str, text: str, asked_time: float) -> None:
        earlier = dict(zip(self._earlier.query_ids, self._earlier.query_texts)) if self._earlier else {}
        if earlier.get(query_id, text) != text:  # its rows would land under another query's text
            raise UserError(f"{self.path} holds the scores of the run this one resumes, with {query_id} asking "
                            f"{earlier[query_id]!r}, not {text!r}; ask the same queries, or give --scores a new path")
        self._texts.setdefault(query_id, text)
        self._asked.setdefault(query_id, asked_time)

    def _write_lead(self) -> None:
        """The rows before a resumed stream's first frame, from the stopped run's trace (NaN where it has none)."""
        frames, earlier = self._lead_frames, self._earlier
        self._lead_frames, self._earlier = 0, None
        ids = earlier.query_ids if earlier is not None else list(self._texts)
        rows = np.full((frames, len(ids)), np.nan, np.float32)
        if earlier is not None:
            kept = min(frames, len(earlier.probs))
            rows[:kept] = earlier.probs[:kept]
            for qid, text, asked in zip(earlier.query_ids, earlier.query_texts, earlier.asked_time):
                self._texts.setdefault(qid, text)
                self._asked.setdefault(qid, float(asked))
        lead = StreamScores(self.stream_name, self.fps, [self._texts[i] for i in ids], list(ids),
                            np.array([self._asked[i] for i in ids]), rows, 0, self.model)
        self._chunks.append(save_scores(chunk_path(self.path, 1), lead))  # its folders made as it is written
        self._flushed_rows = frames

    def on_sources_ended(self, ended: list[bool]) -> None:
        self.source_ended = self.stream < len(ended) and ended[self.stream]

    def on_frame(self, stream, frame_bgr, time_s, probs, events):
        if stream == self.stream:
            if self._lead_frames:
                self._write_lead()
            self._rows.append(dict(probs))
            if len(self._rows) > self.HELD_ROWS:  # only while the disk refuses: flushed every CHUNK_ROWS otherwise
                del self._rows[:self.CHUNK_ROWS]
                self._let_go += self.CHUNK_ROWS
            # Held rows (a refused chunk) are tried again by the clock alone, not at every frame past CHUNK_ROWS.
            if ((len(self._rows) >= self.CHUNK_ROWS and not self._refused)
                    or time.monotonic() - self._last_flush >= self.CHUNK_SECONDS):
                self._flush_going_on()

    def _flush_going_on(self) -> None:
        """``flush`` while the stream goes on: a chunk the machine refuses is said, not raised. The run had ended
        there, and a service restarted into the same full disk watched its camera 30 s at a time."""
        self._refused = tried_going_on(
            self.flush, self._refused, self.log,
            lambda refusal: (f"warning: cannot write the score trace {self.path} ({refusal.strerror or refusal}); "
                             f"the stream goes on, its latest {self.HELD_ROWS} scores held in memory (older ones stand "
                             f"as NaN) and tried again every {self.CHUNK_SECONDS:g} s"),
            f"note: the score trace {self.path} is written again, the scores held meanwhile with it"
            + (f" ({self._let_go} older ones stand as NaN)" if self._let_go else ""))

    def _trace(self, probs: np.ndarray, first_frame: int = 0) -> StreamScores:
        """The queries seen so far, in the order they were added, with these rows."""
        ids = list(self._texts)
        return StreamScores(self.stream_name, self.fps, [self._texts[i] for i in ids], ids,
                            np.array([self._asked[i] for i in ids]), probs, first_frame, self.model)

    def flush(self) -> None:
        """Write the rows held so far as the next chunk."""
        self._last_flush = time.monotonic()
        if not self._rows:
            return
        ids, first = list(self._texts), self._let_go  # the rows let go while the disk refused: NaN, in order
        probs = np.full((first + len(self._rows), len(ids)), np.nan, dtype=np.float32)
        for t, row in enumerate(self._rows, start=first):
            for q, qid in enumerate(ids):
                if qid in row:
                    probs[t, q] = row[qid]
        chunk = chunk_path(self.path, len(self._chunks) + 1)
        save_scores(chunk, self._trace(probs, self._flushed_rows))  # its folders made as it is written
        self._chunks.append(chunk)
        self._flushed_rows += len(probs)
        self._rows, self._let_go = [], 0

    def close(self) -> None:
        """Write the rows held and merge the chunks into the trace at ``path``; a refusal (a full disk) names the
        trace, not the chunk it was writing, so that the run's summary can say which output is incomplete."""
        try:
            if self._lead_frames:  # a resumed stream with nothing left to step still keeps the rows before it
                self._write_lead()
            self.flush()
            empty = self._trace(np.zeros((0, len(self._texts)), np.float32))
            empty.source_ended = self.source_ended  # the whole trace's, never a chunk's: a killed run's stopped first
            if self._chunks:
                merge_chunks(self._chunks, self.path, empty, self._flushed_rows)
            else:  # no frame at all: an empty trace still says which queries were asked
                save_scores(self.path, empty)
        except OSError as refusal:
            raise OSError(refusal.errno, refusal.strerror, str(self.path)) from refusal
        finally:
            release(self._lock)
            self._lock = None  # a second close lets go of nothing
        self._chunks = []


def check_sink_fits(sink: Sink, batch: int, fps: float) -> None:
    """Refuse, as it is added to a detector stepping ``batch`` streams at ``fps``, a sink that would record nothing
    (a stream the bundle does not step) or record wrong times (a score trace made at another rate: eval places its
    row k at k / fps), each without a word."""
    stream = getattr(sink, "stream", None)  # a sink of one stream (a custom sink may use the name otherwise)
    if isinstance(stream, int) and not 0 <= stream < batch:
        raise UserError(f"{type(sink).__name__} records stream {stream}, but this bundle steps {batch} stream(s), "
                        f"0 to {batch - 1}")
    if isinstance(sink, ScoreTraceRecorder) and not math.isclose(sink.fps, fps, rel_tol=1e-9):
        raise UserError(f"ScoreTraceRecorder records at {sink.fps:g} frames per second, but the detector steps at "
                        f"{fps:g}: eval would time every score wrong; make it at detector.fps")


def close_all(sinks: list[Sink]) -> None:
    """Finish every sink's output, each failure (a full disk) kept as its sink's ``refusal`` and the others
    finished all the same; the first failure is raised after."""
    failures = []
    for sink in sinks:
        try:
            sink.finished = True
            sink.close()
        except Exception as exc:  # noqa: BLE001  (raised below, once every other output is complete)
            sink.refusal = exc
            failures.append(exc)
    if failures:
        raise failures[0]
