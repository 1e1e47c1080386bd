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

from ..errors import UserError
from ..metrics import above_threshold


@dataclass(frozen=True)
class AlertPolicy:
    threshold: float
    exit_threshold: float | None = None  # hysteresis: "on" until p <= this (default: the threshold itself)
    cooldown_s: float = 0.0
    max_alerts: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise UserError(f"threshold {self.threshold} is outside (0, 1): it is a probability sigmoid(cos)")
        if self.exit_threshold is not None and not 0.0 <= self.exit_threshold <= self.threshold:
            raise UserError(f"exit threshold {self.exit_threshold} must lie in [0, threshold {self.threshold}]")
        if self.cooldown_s < 0:
            raise UserError(f"cooldown {self.cooldown_s} s must not be negative")
        if self.max_alerts is not None and self.max_alerts < 1:
            raise UserError(f"max alerts {self.max_alerts} must be at least 1 (or unset for no limit)")


class AlertState:
    """One query's policy applied frame by frame."""

    def __init__(self, policy: AlertPolicy):
        self.policy = policy
        self.reset()

    def reset(self) -> None:
        self.active = False  # inside a run above threshold
        self.alerts = 0
        self.last_alert_time = -math.inf

    def update(self, p: float, stream_time: float) -> bool:
        """Feed one frame's probability; True when this frame raises an alert."""
        policy = self.policy
        if self.active:
            exit_level = policy.threshold if policy.exit_threshold is None else policy.exit_threshold
            if not above_threshold(p, exit_level):
                self.active = False
            return False
        if not above_threshold(p, policy.threshold):
            return False
        self.active = True  # a rising edge; whether it alerts depends on the quiet rules below
        if policy.max_alerts is not None and self.alerts >= policy.max_alerts:
            return False
        if stream_time - self.last_alert_time < policy.cooldown_s:
            return False
        self.alerts += 1
        self.last_alert_time = stream_time
        return True
