"""Choosing an alert policy (hysteresis, cooldown) on validation traces. numpy only.

The benchmark scores the first alert of each query; a user also sees every alert after it. A score that
hovers around the threshold, or stays high for a while after its event, raises repeats. Of a query's
alerts, one is useful: the first inside its event's tolerance window; every other alert is a false alarm
to the user (a repeat inside the window included). Hysteresis and a cooldown remove repeats without moving
the first alert (the first rising edge is the same under any policy), but a cooldown started by an early
false alert also silences the true one after it. The choice weighs both as an F1 score: precision = useful
alerts / all alerts, recall = events alerted in their window; ties go to the shortest cooldown and the
smallest margin.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .metrics import TOLERANCE_WINDOWS, ScoreTrace, frame_at_or_after, is_scorable
from .runtime.alerts import AlertPolicy, AlertState

# Candidates: hysteresis as a margin below the threshold, and cooldowns in seconds.
EXIT_MARGINS = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1)
COOLDOWNS_S = (0.0, 5.0, 10.0, 20.0, 30.0, 60.0)


def in_window(time_s: float, start_time: float, window: tuple[float, float] = TOLERANCE_WINDOWS[0]) -> bool:
    """Whether an alert at ``time_s`` lies in [start - before, start + after] of its event."""
    before, after = window
    return -before <= time_s - start_time <= after


def false_alerts(times: list[float], start_time: float, window: tuple[float, float] = TOLERANCE_WINDOWS[0]) -> int:
    """Every alert but the first one inside the event's window (an in-window repeat is false too)."""
    return len(times) - any(in_window(t, start_time, window) for t in times)


def alert_frames(trace: ScoreTrace, policy: AlertPolicy) -> list[int]:
    """The frames where ``policy`` alerts on a trace, from the moment its query was asked."""
    state = AlertState(policy)
    asked = frame_at_or_after(trace.asked_time, trace.fps)
    return [t for t in range(asked, trace.length) if state.update(float(trace.probs[t]), t / trace.fps)]


@dataclass
class PolicyScore:
    exit_threshold: float | None
    exit_margin: float  # threshold - exit_threshold (0: no hysteresis); what a bundle records
    cooldown_s: float
    first_alert_accuracy: float  # % of queries whose first alert lies in [start - 5 s, start + 10 s]
    events_alerted: float  # % of queries with an alert in that window (recall)
    false_alerts: int  # every alert but the first inside the window
    query_minutes: float  # minutes of stream watched, summed over queries
    alerts: int

    @property
    def precision(self) -> float:
        return (self.alerts - self.false_alerts) / self.alerts if self.alerts else 1.0

    @property
    def f1(self) -> float:
        recall = self.events_alerted / 100.0
        return 2 * self.precision * recall / (self.precision + recall) if self.precision + recall else 0.0

    @property
    def false_alerts_per_minute(self) -> float:
        """Per query and minute watched."""
        return self.false_alerts / max(self.query_minutes, 1e-9)

    def to_dict(self) -> dict:
        return dict(asdict(self), false_alerts_per_minute=self.false_alerts_per_minute, precision=self.precision,
                    f1=self.f1)


def watched_seconds(trace: ScoreTrace) -> float:
    """Stream time the query was scored over, from when it was asked: frames never scored (a stretch of rows let
    go while the disk refused them) are no time in which a false alert could have been raised."""
    asked = frame_at_or_after(trace.asked_time, trace.fps)
    frames = trace.length - asked if trace.scored is None else int(trace.scored[asked:].sum())
    return frames / trace.fps


def score_policy(traces: list[ScoreTrace], policy: AlertPolicy,
                 window: tuple[float, float] = TOLERANCE_WINDOWS[0]) -> PolicyScore:
    hits = alerted = false = total = 0
    minutes = 0.0
    traces = [t for t in traces if is_scorable(t)]  # the queries eval's table scores: none asked after its event
    for trace in traces:
        times = [t / trace.fps for t in alert_frames(trace, policy)]
        inside = [in_window(t, trace.start_time, window) for t in times]
        hits += bool(inside) and inside[0]
        alerted += any(inside)
        false += false_alerts(times, trace.start_time, window)
        total += len(times)
        minutes += watched_seconds(trace) / 60.0
    n = max(len(traces), 1)
    return PolicyScore(policy.exit_threshold, policy.threshold - policy.exit_level, policy.cooldown_s,
                       100.0 * hits / n, 100.0 * alerted / n, false, minutes, total)


def choose_policy(traces: list[ScoreTrace], threshold: float) -> tuple[PolicyScore, list[PolicyScore]]:
    """The candidate with the best F1 of useful alerts (ties: shortest cooldown, smallest margin)."""
    sweep = []
    for cooldown in COOLDOWNS_S:
        for margin in EXIT_MARGINS:
            exit_threshold = None if margin == 0 else max(0.0, threshold - margin)
            sweep.append(score_policy(traces, AlertPolicy(threshold, exit_threshold, cooldown)))
    best = min(sweep, key=lambda s: (-round(s.f1, 9), s.cooldown_s, s.exit_margin))
    return best, sweep
