"""Whether a stream's frames come at the rate its model steps at, for frames a program gives ``detector.step``.

A step graph's temporal adapters (a QRNN's lookback, a RetNet's decay, an ST adapter's causal convolution) were
trained on frames ``1 / fps`` seconds apart. The sources of ``open_source`` sample at the bundle's fps by
timestamp; a program that steps frames from its own pipeline (a ROS topic, a headset SDK) must do the same, and
one that steps every camera frame (30 a second into a 1-fps model) got scores from a model that sees time run
30 times fast, with no word. So each stream's intervals are watched: frames clearly faster than the model's rate,
or a stream time that goes back without ``reset``, raise a ``FrameRateWarning`` once per stream. Slower frames
are not warned about (a live source skips the samples a stalled camera missed, by design) unless each of the
last is ``TOO_SLOW_FACTOR`` periods apart: times in milliseconds, not seconds. (``detector.run``
refuses outright a source opened at another rate than the bundle's.)
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass, field

PACE_WINDOW = 8  # consecutive intervals whose mean (the span of the last 9 frames / 8) is compared with the period
# A mean interval under this fraction of the period: frames come too fast. A camera's every frame (30 fps into a
# 1-fps model) is far below. The mean, not the median: a live source keeps, for each sample time, the first frame
# after it, so a 6.5-fps camera sampled at 5 fps steps frames 0.154 s apart two times in three and 0.308 s apart
# the third (median 0.77 of the period, mean 1.0); over 8 intervals that grid costs at most 1/8 of the period.
TOO_FAST_FRACTION = 0.8
# Every one of the last intervals over this many periods: times in another unit than seconds (milliseconds read
# 1000x slow). Every one, not their mean: a camera that stalls for minutes is one long gap among them.
TOO_SLOW_FACTOR = 100.0


class FrameRateWarning(RuntimeWarning):
    """Frames given to ``detector.step`` do not come at the bundle's fps (``warnings.simplefilter("error",
    FrameRateWarning)`` makes it an error)."""


@dataclass
class StreamPace:
    """One stream's recent frame times, since it started or was reset."""
    period: float  # seconds between the frames the model was trained on (1 / fps)
    times: deque = field(default_factory=lambda: deque(maxlen=PACE_WINDOW + 1))  # the last frames' times
    warned: bool = False  # once per stream: a pipeline that steps too fast does so every frame

    def restart(self) -> None:
        """A new scene (``reset``) or a new source: stream times may start again from 0."""
        self.times.clear()

    def observe(self, stream: str, time: float) -> None:
        """The stream's next frame time; warns (once) where the frames are too fast or go back in time."""
        if self.warned:
            return
        if self.times and time < self.times[-1]:
            last = self.times[-1]
            self._warn(f"{stream}: frame time went back from {last:.3f} s to {time:.3f} s without reset(); a Frame's "
                       "time is seconds since its stream started and only goes forward (alerts and cooldowns are "
                       "timed by it): call detector.reset(stream) for a new scene, or give each frame its own time")
            return
        self.times.append(time)
        if len(self.times) <= PACE_WINDOW:
            return
        interval = (self.times[-1] - self.times[0]) / PACE_WINDOW  # the mean of the last PACE_WINDOW intervals
        if interval == 0:
            self._warn(f"{stream}: frames keep the same time ({time:g} s); a Frame's time is seconds since its stream "
                       "started, and alerts, cooldowns and this check of the model's rate are timed by it: give each "
                       "frame its own (index / detector.fps for frames at the bundle's rate)")
        elif interval < TOO_FAST_FRACTION * self.period:
            self._warn(f"{stream}: frames come {interval:.3g} s apart ({1 / interval:.3g} per second), but this "
                       f"bundle's model steps at {1 / self.period:g} frames per second: its temporal adapters see time "
                       f"run {self.period / interval:.3g}x fast, and its scores are not what it was trained to give; "
                       f"step one frame per {self.period:g} s (keep a frame when its time reaches the next "
                       "k / detector.fps, as open_source's sources do)")
        elif interval > TOO_SLOW_FACTOR * self.period and (
                self._shortest_interval() > TOO_SLOW_FACTOR * self.period):
            self._warn(f"{stream}: frames come {interval:.4g} s apart, {interval / self.period:.0f}x the "
                       f"{self.period:g} s between this bundle's frames: a Frame's time is seconds since its stream "
                       "started (a time in milliseconds reads as 1000x slow), and alerts, their cooldowns and their "
                       "logged times go by it; give each frame its time in seconds (frames truly this far apart are "
                       "too far for the model's memory of recent frames)")

    def _shortest_interval(self) -> float:
        """The shortest of the last PACE_WINDOW intervals (called only where their mean is long: rarely)."""
        times = list(self.times)
        return min(later - earlier for earlier, later in zip(times, times[1:]))

    def _warn(self, message: str) -> None:
        self.warned = True
        warnings.warn(message, FrameRateWarning, stacklevel=5)  # at the program's call of detector.step
