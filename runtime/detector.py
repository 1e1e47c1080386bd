"""The streaming detector: source -> preprocess -> step (state carried) -> scores -> alerts -> sinks.

Everything is built from the bundle's manifest: preprocessing, fps, state spec,
default threshold, pre-encoded queries. State outputs go back to state inputs
by name (never by position), and can be reset, saved and restored per stream.
With a bundle exported for batch B, one step serves B streams: the detector
holds the model, the queries and the batched state; each stream's own data
(name, frames, time, an alert state per query) is one ``StreamSlot``.
"""

from __future__ import annotations

import inspect
import numbers
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from sdqes_edge.contract import REFERENCE_PRECISION
from sdqes_edge.errors import UserError
from sdqes_edge.path_checks import SNAPSHOT_EXAMPLE, as_path, check_output_file

from .backend import StepBackend, check_parts_from, warm_up
from .bundle import Bundle, as_bundle
from .detector_queries import QueryMethods, exclusive
from .frame_batch import FrameBatch
from .frame_gathering import LIVE_PATIENCE_PERIODS, StepFrames
from .frame_source import check_frames, check_run_arguments
from .pacing import StreamPace
from .preprocess import Preprocessor
from .queries import QueryBank, TextEncoder, text_encoder_for
from .run_stats import RunStats
from .sampling import check_source_rates
from .sinks import AlertEvent, Sink, check_sink_fits, close_all, closed_sinks_words, tell_sources_ended
from .snapshots import (
    OnDone,
    SavedAlert,
    Snapshot,
    SnapshotWriter,
    StreamRecord,
    policy_key,
    read_snapshot,
    snapshot_path,
)
from .sources import Frame, FrameSource
from .step_backends import make_backend
from .stream_slot import StateCarriedWarning, StreamSlot, carried_state_words, check_carry_state


class NonFiniteScoreError(UserError):
    """The model produced NaN or Inf for a stream; the stream is stopped (its state would stay poisoned)."""


class StreamingDetector(QueryMethods):
    def __init__(self, bundle: str | Path | Bundle, backend: str = "ort", precision: str = REFERENCE_PRECISION,
                 threads: int | None = None, ort_device: str = "cpu", truncate_queries: bool = False,
                 backend_instance: StepBackend | None = None, text_encoder: TextEncoder | None = None,
                 ort_ops: str | Path | None = None):
        """``backend_instance`` and ``text_encoder``: ones already loaded from this bundle (``make_backend(bundle)``,
        ``text_encoder_for(bundle)``, both in ``sdqes_edge.runtime``), so a program that scores many streams one
        after another loads the graphs once. ``ort_ops``: as for ``make_backend``."""
        self.bundle = as_bundle(bundle)
        chosen = {name: (value, _DEFAULTS[name]) for name, value in (  # name -> (value, default): what makes them
            ("backend", backend), ("precision", precision), ("threads", threads), ("ort_device", ort_device),
            ("truncate_queries", truncate_queries), ("ort_ops", ort_ops))}
        check_parts_from(self.bundle, backend_instance, text_encoder.text_graph if text_encoder else None, chosen)
        m = self.bundle.manifest
        self.batch = int(m["batch"])
        self.fps = self.bundle.fps
        self.preprocess = Preprocessor.from_description(self.bundle.image_size, m["preprocess"])
        self.backend: StepBackend = (backend_instance
                                     or make_backend(self.bundle, backend, precision, threads, ort_device, ort_ops))
        # --fuse-queries: the graph scores up to Q queries itself, their embeddings [Q, E] in with every frame.
        self.query_capacity: int | None = m["query_count"] if getattr(self.backend, "fused_queries", False) else None
        self._query_width = int(m["embed_dim"])  # the query input's rows are embeddings
        self.queries = QueryBank(text_encoder or text_encoder_for(self.bundle, truncate_queries))
        self.sinks: list[Sink] = []
        self._closed_sinks: list[Sink] = []  # finished by close() (a run's end): stepping on without sinks is refused
        self.state = self.backend.initial_state()  # every stream's, batched (the backend's representation)
        temporal = len(self.backend.spec) > 0  # a model with no state sees each frame alone, at any rate
        self.streams = [StreamSlot(i, f"stream{i}", pace=StreamPace(1.0 / self.fps) if temporal else None)
                        for i in range(self.batch)]
        size = self.bundle.image_size
        self._frames = FrameBatch(self.backend, (self.batch, 3, size, size))  # one step's frames, reused
        self.last_embeddings: np.ndarray | None = None
        self._lock = threading.RLock()  # see exclusive (detector_queries)
        self._snapshots = SnapshotWriter()  # save_state(wait=False)
        self._running, self._run_thread = False, 0  # a run is stepping the streams, from this thread (see run)

    @exclusive
    def add_sink(self, sink: Sink) -> Sink:
        if not isinstance(sink, Sink):  # a bare function failed on the first query or frame
            raise UserError(f"add_sink takes a Sink, not a {type(sink).__name__}; for a function of each alert, "
                            "pass CallbackSink(function)")
        if sink.finished:  # its file closed: it failed at its first alert or frame ("I/O operation on closed file")
            raise UserError(f"this {type(sink).__name__} was finished as a run ended (or by close()); add a new one")
        check_sink_fits(sink, self.batch, self.fps)
        self.sinks.append(sink)
        self._closed_sinks = []
        for query in self.queries.queries.values():
            sink.on_query_added(query.id, query.text, query.added_at)
        return sink

    # --- state -----------------------------------------------------------------------
    @exclusive
    def warm_up(self) -> float:
        """Step blank frames and throw the results away, the state left as it was -> the ms it took.

        A backend's first steps carry one-off work: ONNX Runtime's memory arenas, cuDNN's algorithm search, and
        on a GPU the capture of each binding's CUDA graph (hundreds of ms). Done here, before the source opens,
        it never lands on the first real frame, the one an alert may hang on.
        """
        size = self.bundle.image_size
        blank = np.zeros((self.batch, 3, size, size), np.float32)
        kept = self.backend.state_to_numpy(self.state)
        start = time.perf_counter()
        warm_up(self.backend, blank, self.state, self._fused_query_input())
        elapsed_ms = (time.perf_counter() - start) * 1e3
        self.state = self.backend.state_from_numpy(kept)
        return elapsed_ms

    @exclusive
    def reset(self, stream: int | None = None) -> None:
        """Forget the past (a new scene): the state of one stream (or all) back to its initial value."""
        if stream is not None and (not isinstance(stream, numbers.Integral) or isinstance(stream, bool)):
            raise UserError(f"reset takes a stream's index (an int) or None for every stream, not {stream!r}")
        if stream is not None and not 0 <= stream < self.batch:
            raise UserError(f"stream {stream} is not one of this bundle's streams, 0 to {self.batch - 1}")
        self.state = self.backend.reset_streams(self.state, None if stream is None else [stream])
        for slot in self.streams if stream is None else [self.streams[stream]]:
            slot.reset()

    @exclusive
    def save_state(self, path: str | Path, wait: bool = True, on_done: OnDone | None = None) -> Path:
        """Snapshot the streaming state to an .npz, to resume after a restart: the model's state and, per stream,
        its frame count, time, source position and alert states (``snapshots``). ``wait=False``: copied now, written
        by a thread of its own after any earlier one, ``close`` and the next ``save_state`` raising what it raised.
        ``on_done``, where given, is told as a write ends: None, or the refusal (OSError: a full disk), not raised."""
        path = as_path(path, "save_state takes")
        if path.is_dir():  # numpy would write FOLDER.npz beside it
            raise UserError(f"{path} is a folder; give save_state a file path (e.g. {path / SNAPSHOT_EXAMPLE})")
        path = check_output_file(snapshot_path(path), "save_state", SNAPSHOT_EXAMPLE)  # one line, not an OSError
        keys = {qid: (q.text, policy_key(q.policy)) for qid, q in self.queries.queries.items()}
        records = [StreamRecord(slot.frames, slot.time, slot.source, slot.position,
                                {keys[qid]: SavedAlert.of(state, slot.time) for qid, state in slot.alerts.items()})
                   for slot in self.streams]
        snapshot = Snapshot(self.bundle.model_identity, self.backend.state_to_numpy(self.state), records)
        return self._snapshots.write(path, snapshot, wait, on_done)

    @exclusive
    def load_state(self, path: str | Path) -> None:
        """Go on from a ``save_state`` snapshot; one of another model or batch size, or damaged, is refused
        (``snapshots.UnusableSnapshot``) and the detector is left as it was."""
        self._snapshots.wait()  # a snapshot still being written (save_state(wait=False)) is read whole
        snapshot = read_snapshot(path)
        snapshot.check_fits(path, self.bundle.model_identity, self.backend.spec, self.bundle.root)
        self.state = self.backend.state_from_numpy(snapshot.state)
        for slot, record in zip(self.streams, snapshot.streams):
            slot.frames, slot.time, slot.resumed = record.frames, record.time, record
            for qid in slot.alerts:
                slot.restore_alert(qid, self.queries.queries[qid].text)

    # --- one step --------------------------------------------------------------------
    def step(self, frames: list[Frame | None]) -> list[list[AlertEvent]]:
        """One frame per stream (None for an idle slot) -> the alerts each stream raised.

        An alert's latency runs from this call to the alert: preprocessing (unless the reader thread did
        it), the model step and the scoring.
        """
        with self._lock:  # see exclusive (detector_queries); not a decorator: FrameRateWarning points at its caller
            if self._running and threading.get_ident() != self._run_thread:  # its frames among the run's
                raise UserError("a run is streaming on this detector (in another thread): its streams take that "
                                "run's frames; step a detector of your own, or give the source to the run")
            if self._closed_sinks and not self.sinks:  # a second run's alerts reached no output, unsaid
                raise UserError(closed_sinks_words(self._closed_sinks))
            start = time.perf_counter()
            check_frames(frames, self.batch)
            result = self.backend.step(self._frames.of(frames, self.preprocess), self.state,
                                       self._fused_query_input())
            self.last_embeddings = result.embedding  # [B, E], for callers that keep their own scores
            idle = [i for i, f in enumerate(frames) if f is None]
            self.state = self.backend.keep_streams(result.state, self.state, idle) if idle else result.state
            ids, changes, positions = self.queries.ids, self.queries.changes, self.queries.positions
            cosines, probs = self.queries.scores(result.embedding, result.logits)
            over = self.queries.over(probs)
            finite = np.isfinite(result.embedding).all(axis=1).tolist()  # each stream's, told at once
            events_per_stream: list[list[AlertEvent]] = []
            failures: list[Exception] = []
            for slot, frame in zip(self.streams, frames):
                if frame is None:
                    events_per_stream.append([])
                    continue
                if not finite[slot.index]:
                    raise NonFiniteScoreError(f"{slot.name}: the model produced a non-finite score at frame "
                                              f"{frame.index} ({frame.time:.1f} s); stopping this stream. Check the "
                                              "bundle with `sdqes-edge inspect` (fp16 overflow?)")
                stream_probs = probs[slot.index].tolist()  # Python floats, converted once per stream
                raised = slot.raised(ids, stream_probs, over[slot.index], positions, frame.time)
                events = slot.alert_events(frame, self.queries.queries, ids, stream_probs, cosines[slot.index],
                                           raised, start)
                by_id = dict(zip(ids, stream_probs))
                if self.queries.changes != changes:  # a sink changed the queries in this step: those still asked
                    by_id = {qid: p for qid, p in by_id.items() if qid in slot.alerts}
                failures += self._deliver(slot.index, frame, by_id, events)
                events_per_stream.append(events)
            if failures:
                raise failures[0]  # after every sink of every stream had the step: an alert log misses nothing
            return events_per_stream

    def _deliver(self, stream: int, frame: Frame, probs: dict, events: list[AlertEvent]) -> list[Exception]:
        """A stream's frame and alerts to every sink; what a sink raised (a program's callback, a full disk), kept
        to raise once the others have them too: the alert log came after the console, so an alert printed to a
        closed pipe, or a callback's bug, kept it from the log."""
        failures = []
        for sink in self.sinks:
            try:
                sink.on_frame(stream, frame.bgr, frame.time, probs, events)
                sink.on_events(events)
            except Exception as exc:  # raised again by step, once every sink had the step
                failures.append(exc)
        return failures

    def _fused_query_input(self) -> np.ndarray | None:
        """A fused graph's query input (``QueryBank.graph_input``); None for a graph that leaves scoring to us."""
        if self.query_capacity is None:
            return None
        return self.queries.graph_input(self.query_capacity, self._query_width)

    # --- whole streams ------------------------------------------------------------------
    def attach(self, sources: list[FrameSource], carry_state: bool | None = None) -> None:
        """Give each source its stream (``run`` does; call it first to know where each source starts). A stream
        restored from a snapshot goes on where it stopped when its source is the file it was reading: from the
        sample after its last frame, stream times continuing (a file stepped again from its start saw its
        first part twice, and alerted twice). Any other starts at its beginning, stream times from 0; if its stream
        stepped another since its last reset or ``load_state`` (an earlier run), ``carry_state`` True goes on from
        that state (cooldowns count the gap as none), False resets it first, None goes on with a warning."""
        self._attach(sources, carry_state, stacklevel=3)

    def _attach(self, sources: list[FrameSource], carry_state: bool | None, stacklevel: int) -> None:
        check_carry_state(carry_state)
        self.check_source_count(len(sources))
        check_source_rates(sources, self.fps)
        earlier = [slot.last_source for slot in self.streams]
        carried = [(slot.index, source.name, earlier[slot.index])
                   for slot, source in zip(self.streams, sources) if slot.attach(source, self.fps)]
        if carried and carry_state is None:  # it goes on from the state, as True does, but says so
            warnings.warn(carried_state_words(carried), StateCarriedWarning, stacklevel=stacklevel)
        for index, _, _ in carried if carry_state is False else []:
            self.reset(index)

    def check_source_count(self, count: int) -> None:
        """Refuse more sources than the bundle steps at once (fewer is fine: the other slots idle)."""
        if count > self.batch:
            raise UserError(f"{count} sources but the bundle steps {self.batch} stream(s) at once; "
                            f"re-export with --batch {count}")

    def run(self, sources: FrameSource | list[FrameSource], stats: RunStats | None = None,
            max_frames: int | None = None, stop_requested: Callable[[], bool] | None = None,
            carry_state: bool | None = None) -> Iterator[list[AlertEvent]]:
        """Step every source until all end (or ``max_frames``); yields each step's alerts. Sinks closed at the end.
        ``stop_requested``, asked while waiting for frames, ends the run with none in hand (a stalled camera).
        ``carry_state``: whether a stream an earlier run stepped goes on from that run's state (see ``attach``). One
        run at a time: a second, from another thread, stepped the same streams with its own frames between the
        first's (states and alerts a mix of two videos), and the first to end closed the sinks of both."""
        sources = check_run_arguments(sources, max_frames)
        with self._lock:
            if self._running:
                raise UserError("this detector is already running (a run not ended: iterate it to the end or close "
                                "it); to stream sources side by side give them to one run, or make a detector each")
            self._running = True
        try:
            yield from self._run(sources, stats or RunStats(), max_frames, stop_requested, carry_state)
        finally:
            self._running = False

    def _run(self, sources: list[FrameSource], stats: RunStats, max_frames: int | None,
             stop_requested: Callable[[], bool] | None, carry_state: bool | None) -> Iterator[list[AlertEvent]]:
        self._attach(sources, carry_state, stacklevel=4)  # the warning points at the loop over the run
        gathering = StepFrames(sources, self.batch, self.preprocess, LIVE_PATIENCE_PERIODS / self.fps, stop_requested)
        try:
            while (frames := gathering.next()) is not None:
                started = time.perf_counter()
                self._run_thread = threading.get_ident()  # the thread iterating the run now: its steps are the run's
                events = self.step(frames)
                stats.frames += 1
                stats.latencies.add((time.perf_counter() - started) * 1e3)
                flat = [e for per_stream in events for e in per_stream]
                stats.events += len(flat)
                yield flat
                if max_frames is not None and stats.frames >= max_frames:
                    gathering.look_for_ends()
                    break
            stats.streamed = True
        finally:
            gathering.close()
            for slot in self.streams:  # its source read: given again, it is read from its start, a new attach
                slot.attached = None
            try:
                tell_sources_ended(self.sinks, gathering.sources_ended)
            finally:
                self.close()

    def close(self) -> None:
        """Finish every sink's output; one that fails (a full disk) does not stop the others finishing theirs,
        and the first failure is raised after."""
        sinks, self.sinks = self.sinks, []
        self._closed_sinks = sinks or self._closed_sinks
        try:
            close_all(sinks)
        finally:
            self._snapshots.wait()

    def __enter__(self) -> "StreamingDetector":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


_DEFAULTS = {name: p.default for name, p in inspect.signature(StreamingDetector.__init__).parameters.items()}
