"""A step feeds a frame's probabilities only to the alert states that can change (``StreamSlot.raised``): those
with p over their threshold and those that may be on. Every other state is off with p at or below its threshold,
which changes nothing. The alerts, and every state after every frame, are those of feeding every state, whatever
the policies (hysteresis, cooldown, max alerts) and whatever happens between frames (queries added, removed, under
a new threshold, a stream reset, a state restored on)."""

from __future__ import annotations

import copy

import numpy as np

from sdqes_edge.runtime.alerts import AlertPolicy, AlertState
from sdqes_edge.runtime.queries import QueryBank
from sdqes_edge.runtime.snapshots import SavedAlert, StreamRecord, policy_key
from sdqes_edge.runtime.stream_slot import StreamSlot


class UnitVectors:
    """The bank's text encoder, reduced to what these tests need of it: an embedding per text."""

    def encode(self, text: str) -> np.ndarray:
        vector = np.zeros(4, np.float32)
        vector[len(text) % 4] = 1.0
        return vector


POLICIES = [AlertPolicy(0.6), AlertPolicy(0.6, exit_threshold=0.5), AlertPolicy(0.55, cooldown_s=3.0),
            AlertPolicy(0.65, max_alerts=2), AlertPolicy(0.6, exit_threshold=0.45, cooldown_s=2.0, max_alerts=3)]


def state_of(state: AlertState) -> tuple:
    return state.active, state.alerts, state.last_alert_time


def fed_every_state(states: dict[str, AlertState], ids: list[str], probs: list[float], t: float) -> list[int]:
    """The reference: every state fed, in query order."""
    return [q for q, qid in enumerate(ids) if qid in states and states[qid].update(probs[q], t)]


class TwoStreams:
    """One stream fed as a step feeds it, and the same stream with every state fed."""

    def __init__(self, queries: int):
        self.bank, self.slot, self.reference = QueryBank(UnitVectors()), StreamSlot(0, "stream0"), {}
        for k in range(queries):
            self.add(f"query {k:03d}" + "x" * k, POLICIES[k % len(POLICIES)])

    def add(self, text: str, policy: AlertPolicy) -> str:
        query = self.bank.add(text, policy)
        self.slot.alerts[query.id], self.reference[query.id] = AlertState(policy), AlertState(policy)
        return query.id

    def step(self, probs: np.ndarray, t: float) -> None:
        ids, row = self.bank.ids, probs.astype(np.float32)
        raised = self.slot.raised(ids, row.tolist(), self.bank.over(row[None])[0], self.bank.positions, t)
        assert raised == fed_every_state(self.reference, ids, row.tolist(), t)
        assert {qid: state_of(s) for qid, s in self.slot.alerts.items()} == {
            qid: state_of(s) for qid, s in self.reference.items()}


def test_the_states_fed_raise_the_alerts_of_feeding_every_state_and_end_in_the_same_states():
    rng = np.random.default_rng(0)
    streams = TwoStreams(queries=12)
    # Scores that wander around the thresholds, with events: a run of frames high for a few queries.
    level = np.full(12, 0.5)
    for frame in range(600):
        level = np.clip(level + rng.normal(0, 0.03, 12), 0.3, 0.8)
        streams.step(level + rng.normal(0, 0.02, 12), float(frame))
    alerts = sum(s.alerts for s in streams.reference.values())
    assert alerts > 20  # the stream alerted, and hysteresis, cooldowns and max alerts had their say
    assert any(p.max_alerts and s.alerts == p.max_alerts for s, p in zip(streams.reference.values(), POLICIES * 3))


def test_changes_between_frames_keep_the_two_alike(tmp_path):
    rng = np.random.default_rng(1)
    streams = TwoStreams(queries=6)
    high = np.full(6, 0.9)
    streams.step(high, 0.0)  # every query on
    removed = streams.bank.ids[2]
    streams.bank.remove(removed)  # removed while on
    streams.slot.forget(removed)
    del streams.reference[removed]
    streams.step(np.full(5, 0.2), 1.0)  # every query falls
    added = streams.add("a new query", AlertPolicy(0.6))
    streams.step(np.full(6, 0.7), 2.0)
    qid = streams.bank.ids[0]  # a new threshold over its p: it stays on, as a state under a new policy does
    policy = AlertPolicy(0.8, exit_threshold=0.75)
    streams.bank.set_policy(qid, policy, None)
    streams.slot.alerts[qid].set_policy(policy)
    streams.reference[qid].set_policy(policy)
    streams.step(np.full(6, 0.7), 3.0)
    streams.slot.reset()  # a new scene
    for state in streams.reference.values():
        state.reset()
    streams.step(np.full(6, 0.5), 4.0)
    # A state restored on from a snapshot, at a p under its threshold: it must still be fed, to fall.
    on = copy.copy(streams.reference[added])
    on.active = True
    streams.slot.time = 4.0  # the stream's time, from which the saved last alert is timed back
    streams.slot.resumed = StreamRecord(alerts={("a new query", policy_key(on.policy)): SavedAlert.of(on, 4.0)})
    streams.slot.restore_alert(added, "a new query")
    streams.reference[added].active = True
    assert streams.slot.alerts[added].active
    for frame in range(5, 200):
        streams.step(rng.uniform(0.3, 0.8, 6), float(frame))


def test_a_stream_whose_queries_are_all_on_feeds_them_all_in_order():
    streams = TwoStreams(queries=8)
    for frame in range(50):
        streams.step(np.full(8, 0.95 if frame % 10 < 7 else 0.1), float(frame))


def test_over_compares_as_an_alert_state_does_in_float32():
    bank = QueryBank(UnitVectors())
    threshold = 0.6  # not a float32: both sides are rounded to one, as AlertState rounds them
    bank.add("a query", AlertPolicy(threshold))
    at = np.float32(threshold)
    above = np.nextafter(at, np.float32(1))
    probs = np.array([[at], [above], [np.nan], [np.float64(threshold) + 1e-12]])
    expected = []
    for p in probs[:, 0]:
        state = AlertState(AlertPolicy(threshold))
        expected.append([0] if state.update(float(p), 0.0) or state.active else [])
    assert bank.over(probs) == expected == [[], [0], [0], []]
