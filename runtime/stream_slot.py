"""One stream's place in a detector's batch: everything the detector keeps for it but its rows of the state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from sdqes_edge.errors import UserError

from .alerts import AlertState
from .frame_source import Frame, FrameSource
from .pacing import StreamPace
from .sinks import AlertEvent
from .snapshots import StreamRecord


class StateCarriedWarning(UserWarning):
    """A run began a source on a stream whose state another source left: its first scores and alerts depend on
    what that one showed. ``run(..., carry_state=...)`` says which is meant."""


# Streams a StateCarriedWarning names one by one (32 streams named made a paragraph); the others are counted.
CARRIED_STREAMS_NAMED = 2


def check_carry_state(carry_state) -> None:
    """``carry_state`` is True, False or None: a string ("no") is true, and would have carried the state."""
    if carry_state is not None and not isinstance(carry_state, bool):
        raise UserError(f"carry_state is True (go on from the state an earlier run left), False (start afresh) or "
                        f"None (go on, with a warning), not {carry_state!r}")


def carried_state_words(carried: Sequence[tuple[int, str, str | None]]) -> str:
    """Why a run warns: each (stream index, the source it begins, the source whose state it goes on from, None for
    frames a program stepped itself). Measured on the demo bundle: its video scored a second time on one detector
    was up to 0.35 off the fresh run's probability over its first 26 frames."""
    def begins(index: int, new: str, old: str | None) -> str:
        if old is None:
            return f"stream {index} begins {new} with the state of the frames stepped before it"
        return f"stream {index} begins {new} " + ("again, with the state its earlier run left" if new == old
                                                  else f"with the state {old} left")
    named = [begins(*each) for each in carried[:CARRIED_STREAMS_NAMED]]
    if len(carried) > CARRIED_STREAMS_NAMED:
        named.append(f"{len(carried) - CARRIED_STREAMS_NAMED} more streams likewise")
    return (f"{'; '.join(named)} (the model's memory of its last frames, and each query's alert state: an alert "
            f"still on, cooldowns, max alerts), so {'its' if len(carried) == 1 else 'their'} first scores and alerts "
            "depend on what came before; "
            "run(..., carry_state=False) or detector.reset() starts afresh, carry_state=True goes on from it "
            "without this warning (a recording split into files)")


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
    # The source ``attach`` gave this stream, until the run that reads it ends (given again, it is read from its start
    # again: a new attach); and the name of the one it read last (None: only frames a program stepped itself).
    attached: FrameSource | None = field(default=None, repr=False)
    last_source: str | None = None
    pace: StreamPace | None = None  # its frame times against the model's rate (None: a model without state)
    # The ids whose alert state may be on (inside a run above threshold): a superset, kept by every change that can
    # turn one on (``raised``, ``restore_alert``), so that ``raised`` need not look at the others.
    maybe_on: set[str] = field(default_factory=set)
    # Its state holds no frame stepped since the detector made, reset or restored it: a new source starting here
    # starts afresh (``attach``).
    fresh: bool = True

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
        self.fresh = False
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
        self.fresh = True
        if self.pace is not None:
            self.pace.restart()

    def attach(self, source: FrameSource, fps: float) -> bool:
        """Take ``source`` as this stream's (``StreamingDetector.attach`` says where it starts) -> whether it goes on
        from a state no one asked it to (stepped since a reset, no snapshot restored)."""
        if self.attached is source:
            return False
        carried = not self.fresh and self.resumed is None
        self.name, self.attached, self.last_source = source.name, source, source.name
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
        return carried
