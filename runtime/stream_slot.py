"""One stream's place in a detector's batch: everything the detector keeps for it but its rows of the state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .alerts import AlertState
from .frame_source import Frame, FrameSource
from .pacing import StreamPace
from .sinks import AlertEvent
from .snapshots import StreamRecord


@dataclass
class StreamSlot:
    """One stream's place in the batch, and everything the detector keeps for it but its rows of the state."""
    index: int  # the row (axis 0) of the batched state this stream occupies
    name: str
    frames: int = 0  # frames stepped (counted on from a restored snapshot)
    time: float = 0.0  # stream time of its last frame, seconds
    alerts: dict[str, AlertState] = field(default_factory=dict)  # query id -> this stream's alert state
    source: str = ""  # the identity of the source it reads (FrameSource.identity)
    position: int = 0  # the sample index of that source after its last frame
    resumed: StreamRecord | None = None  # from a snapshot, until ``attach`` decides where its source goes on
    attached: FrameSource | None = field(default=None, repr=False)  # the source ``attach`` gave this stream
    pace: StreamPace | None = None  # its frame times against the model's rate (None: a model without state)
    # The ids whose alert state may be on (inside a run above threshold): a superset, kept by every change that can
    # turn one on (``raised``, ``restore_alert``), so that ``raised`` need not look at the others.
    maybe_on: set[str] = field(default_factory=set)

    def raised(self, ids: list[str], probs: list[float], over: list[int], positions: dict[str, int],
               stream_time: float) -> list[int]:
        """Feed one frame's probabilities (``probs``, in ``ids`` order) to the alert states that can change, and
        return the positions of the queries it alerts, in order. ``over``: the positions whose p is above their
        query's threshold (``QueryBank.over``), in order; ``positions``: each id's place in ``ids``.

        A state that is off, with p at or below its threshold, stays as it is: feeding it would change nothing, so
        only the states that may be on (they may fall) and those with p over are fed. At 32 streams and 160 queries,
        feeding all 5,120 states took 2.6-2.8 ms a step, 40% of a GPU's step (6.9 ms)."""
        if not self.maybe_on:
            fed = over
        elif len(over) + len(self.maybe_on) >= len(ids):  # about every state: all of them, in order
            fed = range(len(ids))
        else:
            fed = sorted(set(over).union(positions[qid] for qid in self.maybe_on if qid in positions))
        alerted = []
        for q in fed:
            qid = ids[q]
            state = self.alerts.get(qid)  # None: removed by a sink of an earlier stream in this step
            if state is None:
                continue
            if state.update(probs[q], stream_time):
                alerted.append(q)
            if state.active:
                self.maybe_on.add(qid)
            else:
                self.maybe_on.discard(qid)
        return alerted

    def alert_events(self, frame: Frame, queries: dict, ids: list[str], probs: list[float], cosines: np.ndarray,
                     raised: list[int], start: float) -> list[AlertEvent]:
        """One frame counted, and the alerts of the queries (``queries``: id -> Query) at positions ``raised``
        (what ``raised`` returned); their latency runs from ``start`` (``time.perf_counter``, as the step began)."""
        if self.pace is not None:
            self.pace.observe(self.name, frame.time)
        self.time, self.position = frame.time, frame.index + 1
        self.frames += 1
        latency = (time.perf_counter() - start) * 1e3
        events = []
        for q in raised:
            query = queries[ids[q]]
            events.append(AlertEvent(query.id, query.text, query.message, self.name, frame.time, frame.index,
                                     probs[q], float(cosines[q]), latency, query.policy.threshold, query.label))
        return events

    def restore_alert(self, query_id: str, text: str) -> None:
        """A query's alert state as the snapshot this stream was restored from left it (``saved_alert``)."""
        saved = self.resumed.saved_alert(text, self.alerts[query_id].policy) if self.resumed else None
        if saved is not None:
            saved.apply(self.alerts[query_id], self.time)
            if self.alerts[query_id].active:
                self.maybe_on.add(query_id)

    def forget(self, query_id: str) -> None:
        """A query removed: its alert state goes."""
        del self.alerts[query_id]
        self.maybe_on.discard(query_id)

    def reset(self) -> None:
        """What a new scene forgets: the alert states, and the frame times its pace is measured over."""
        for state in self.alerts.values():
            state.reset()
        self.maybe_on.clear()
        if self.pace is not None:
            self.pace.restart()

    def attach(self, source: FrameSource, fps: float) -> None:
        """Take ``source`` as this stream's (``StreamingDetector.attach`` says where it starts)."""
        if self.attached is source:
            return
        self.name, self.attached = source.name, source
        if self.pace is not None:
            self.pace.restart()
        record, self.resumed, identity = self.resumed, None, source.identity
        if record is not None and not source.live and record.source == identity and record.position:
            source.start_at(record.position)
            source.log(f"note: {source.name} goes on at {record.position / fps:g} s, where the state snapshot stopped")
        elif self.frames:
            for state in self.alerts.values():
                state.last_alert_time -= self.time
            self.time = 0.0
        self.source = identity
