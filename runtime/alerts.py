"""Per-query alert policy (DESIGN.md section 1): an alert on each rising edge of ``p > threshold``.

Options a deployment usually wants on top of the benchmark's rule:
- hysteresis: once above, a query stays "on" until p falls to ``exit_threshold``
  or below, so a score hovering around the threshold raises one alert, not many;
- cooldown: no new alert within ``cooldown_s`` seconds of stream time after one;
- ``max_alerts`` (k): after k alerts the query goes quiet (only the first k count in SR@k).
With none of them set, the alerts are exactly the predictions that SR@k and SMD@k score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sdqes_edge.contract import SCORE_RANGE
from sdqes_edge.errors import UserError, is_number, is_whole_number


def is_probability(value: object) -> bool:
    """What an alert threshold is: a number (not a bool) strictly between 0 and 1 (NaN is not)."""
    return is_number(value) and 0.0 < value < 1.0


# What the refusal or warning of a threshold outside the scores asks for instead.
GIVE_ONE_INSIDE = (f"give one between {SCORE_RANGE[0]:.4f} and {SCORE_RANGE[1]:.4f} (a calibrated one: sdqes-edge "
                   "eval --calibrate)")


def never_reached_words(threshold: float, who: str = "the query") -> str | None:
    """Why a threshold at or above every score p can take (``SCORE_RANGE``) leaves ``who`` silent, and what to give;
    None for one below the top. Refused wherever a threshold is given for the model's scores."""
    if threshold < SCORE_RANGE[1]:
        return None
    return (f"is never reached: p = sigmoid(cos) is at most {SCORE_RANGE[1]:.4f} (a cosine is at most 1), so {who} "
            f"never alerts; {GIVE_ONE_INSIDE}")


def below_every_score_words(threshold: float, who: str = "the query") -> str | None:
    """Why a threshold below every score p can take makes ``who`` alert at its first frame alone; None otherwise.
    Said, not refused: a program may mean it."""
    if threshold >= SCORE_RANGE[0]:
        return None
    return (f"is below every score: p = sigmoid(cos) is at least {SCORE_RANGE[0]:.4f} (a cosine is at least -1), so "
            f"{who} alerts at its first frame and never again; {GIVE_ONE_INSIDE}")


def check_number(name: str, value: object) -> None:
    """An alert policy's setting is a number or None: a string from a config file or a form failed in arithmetic or a
    comparison (a TypeError), and a bool passed as 0 or 1."""
    if value is not None and not is_number(value):
        raise UserError(f"{name} is a number, not {value!r}")


def check_texts(**values: object) -> None:
    """A query's message, id or label is text or None: sinks write them as text, and a label picks a threshold by
    name (a list failed as an unhashable key)."""
    for name, value in values.items():
        if value is not None and not isinstance(value, str):
            raise UserError(f"a query's {name} is text (or None), not {type(value).__name__}")


@dataclass(frozen=True)
class AlertPolicy:
    threshold: float
    exit_threshold: float | None = None  # hysteresis: "on" until p <= this (default: the threshold itself)
    cooldown_s: float = 0.0
    max_alerts: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("threshold", self.threshold), ("exit threshold", self.exit_threshold),
                            ("cooldown", self.cooldown_s), ("max alerts", self.max_alerts)):
            check_number(name, value)
        if self.max_alerts is not None and not is_whole_number(self.max_alerts):
            raise UserError(f"max alerts is a whole number of alerts, not {self.max_alerts!r}")
        # Plain Python numbers from here on: numpy's (a threshold read from an array) broke the JSON of a state
        # snapshot and of the alert log.
        for name in ("threshold", "exit_threshold", "cooldown_s"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        if self.max_alerts is not None:
            object.__setattr__(self, "max_alerts", int(self.max_alerts))
        if not is_probability(self.threshold):
            raise UserError(f"threshold {self.threshold} is outside (0, 1): it is a probability sigmoid(cos)")
        if self.exit_threshold is not None and not 0.0 <= self.exit_threshold <= self.threshold:  # NaN too
            # :g, so a calibrated threshold reads 0.658041, not 0.6580407431251125
            raise UserError(f"exit threshold {self.exit_threshold:g} must lie in [0, threshold {self.threshold:g}]: "
                            "give one at or below the threshold")
        if not self.cooldown_s >= 0:  # NaN too
            raise UserError(f"cooldown {self.cooldown_s} s must be a number of seconds, 0 or more")
        if self.max_alerts is not None and self.max_alerts < 1:
            raise UserError(f"max alerts {self.max_alerts} must be at least 1 (or unset for no limit)")

    @property
    def exit_level(self) -> float:
        return self.threshold if self.exit_threshold is None else self.exit_threshold

    def describe(self) -> str:
        """'threshold 0.658, on until p <= 0.640, 20 s cooldown, at most 3 alerts' (what is set)."""
        return (f"threshold {self.threshold:.4f}"
                + (f", on until p <= {self.exit_threshold:.4f}" if self.exit_threshold is not None else "")
                + (f", {self.cooldown_s:g} s cooldown" if self.cooldown_s else "")
                + (f", at most {self.max_alerts} alerts" if self.max_alerts is not None else ""))


class AlertState:
    """One query's policy applied frame by frame."""

    def __init__(self, policy: AlertPolicy):
        self.set_policy(policy)
        self.reset()

    def set_policy(self, policy: AlertPolicy) -> None:
        """Apply ``policy`` from the next frame on, what happened so far kept: a run above threshold going on stays
        one (it does not alert again), and the alerts raised still count for ``max_alerts`` and the cooldown."""
        self.policy = policy
        # Both levels rounded to float32 once: comparing float32(p) with them as Python floats is exactly the
        # reference's float32 comparison (metrics.above_threshold), without numpy per frame and query.
        self._enter = float(np.float32(policy.threshold))
        self._exit = float(np.float32(policy.exit_level))

    def reset(self) -> None:
        self.active = False  # inside a run above threshold
        self.alerts = 0
        self.last_alert_time = -math.inf

    def update(self, p: float, stream_time: float) -> bool:
        """Feed one frame's probability; True when this frame raises an alert."""
        policy = self.policy
        p = float(np.float32(p))
        if self.active:
            if p <= self._exit:
                self.active = False
            return False
        if p <= self._enter:
            return False
        self.active = True  # a rising edge; whether it alerts depends on the quiet rules below
        if policy.max_alerts is not None and self.alerts >= policy.max_alerts:
            return False
        if stream_time - self.last_alert_time < policy.cooldown_s:
            return False
        self.alerts += 1
        self.last_alert_time = stream_time
        return True
