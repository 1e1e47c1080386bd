"""What the two runtimes say, written as shared vectors by tests/native_vectors.py: where frame times stop coming at
the model's rate (runtime/pacing.py), what a training record says the model was trained on, and what a manifest says
of a preset's random weights (train_options.py). The C++ tests (native/tests/) must say the same of each case."""

from __future__ import annotations

import math
import re
import warnings

from sdqes_edge.train_options import random_weights_words, training_data_words

__all__ = ["PACING_CASES", "RANDOM_WEIGHTS", "TRAINING_RECORDS", "pace_problem", "random_weights_words",
           "training_data_words"]


def _camera_on_a_grid(rate: float, fps: float, frames: int) -> list[float]:
    """The times a live source keeps of a camera's frames ``1 / rate`` s apart: the first at or after each k / fps."""
    stamps, kept, k = [j / rate for j in range(frames)], [], 0
    for stamp in stamps:
        if stamp >= k / fps:
            kept.append(stamp)
            k = int(stamp * fps) + 1
    return kept


# Frame times a program gives -> the frame at which they are first found not to come at the model's rate, and the
# words that say how (runtime/pacing.py); a time that goes back is not among them (the C API refuses it outright).
PACING_CASES = [
    {"name": "a 30-fps camera's every frame into a 5-fps model", "fps": 5.0, "times": [k / 30 for k in range(40)]},
    {"name": "the model's rate, with jitter and missed samples", "fps": 5.0,
     "times": [round(k * 0.2 + 0.04 * math.sin(7.3 * k), 6) for k in range(60) if k % 7 != 3]},
    {"name": "a 6.5-fps camera kept on a 5-fps grid", "fps": 5.0, "times": _camera_on_a_grid(6.5, 5.0, 100)},
    {"name": "times in milliseconds", "fps": 5.0, "times": [k * 200.0 for k in range(20)]},
    {"name": "a camera that stalls for minutes now and then", "fps": 5.0,
     "times": [k * 0.2 for k in range(10)] + [120 + k * 0.2 for k in range(10)] + [400 + k * 0.2 for k in range(10)]},
    {"name": "every frame at one time", "fps": 5.0, "times": [0.0] * 10},
    {"name": "just under 0.8 of the period", "fps": 1.0, "times": [k * 0.79 for k in range(12)]},
    {"name": "just over 0.8 of the period", "fps": 1.0, "times": [k * 0.81 for k in range(12)]},
]

# A bundle's training record -> what `run` and `sdqes-run` say its model was trained on (train_options.py).
TRAINING_RECORDS = [
    {"name": "the demo's record", "record": {"data": {"train": {"seeds": [100000, 100119], "streams": 120}}}},
    {"name": "streams as a float", "record": {"data": {"train": {"seeds": [1, 3], "streams": 3.0}}}},
    {"name": "no seeds: not data train drew", "record": {"data": {"train": {"streams": 120}}}},
    {"name": "no stream count", "record": {"data": {"train": {"seeds": [1, 3]}}}},
    {"name": "streams as text", "record": {"data": {"train": {"seeds": [1], "streams": "many"}}}},
    {"name": "streams as a numeric string", "record": {"data": {"train": {"seeds": [1], "streams": "3"}}}},
    {"name": "streams as a bool", "record": {"data": {"train": {"seeds": [1], "streams": True}}}},
    {"name": "streams past what a record counts", "record": {"data": {"train": {"seeds": [1], "streams": 1e300}}}},
    {"name": "streams below 0", "record": {"data": {"train": {"seeds": [1], "streams": -3}}}},
    {"name": "train as a number", "record": {"data": {"train": 5}}},
    {"name": "train as a list naming seeds", "record": {"data": {"train": ["seeds", "streams"]}}},
    {"name": "data as a list", "record": {"data": [1, 2]}},
    {"name": "no data", "record": {"threshold": 0.6}},
    {"name": "a list, not a record", "record": [1, 2]},
]

# A manifest's "random_weights" (written by `export --preset`) -> what both runtimes say of the weights.
RANDOM_WEIGHTS = [
    {"name": "a preset's export", "manifest": {"random_weights": {"preset": "tiny+qrnn", "seed": 0}}},
    {"name": "another seed", "manifest": {"random_weights": {"preset": "clip-vit-b16+st", "seed": 42}}},
    {"name": "a checkpoint's export: none", "manifest": {"checkpoint": {"file": "epoch=9.ckpt"}}},
    {"name": "null", "manifest": {"random_weights": None}},
    {"name": "false", "manifest": {"random_weights": False}},
    {"name": "an empty mapping", "manifest": {"random_weights": {}}},
    {"name": "true", "manifest": {"random_weights": True}},
    {"name": "a seed as a float", "manifest": {"random_weights": {"preset": "tiny", "seed": 0.0}}},
    {"name": "a seed as a bool", "manifest": {"random_weights": {"preset": "tiny", "seed": True}}},
    {"name": "a preset as a number", "manifest": {"random_weights": {"preset": 5, "seed": 0}}},
    {"name": "a text", "manifest": {"random_weights": "yes"}},
]


def pace_problem(case: dict) -> dict | None:
    """Where StreamPace first warns of ``case``'s times: {"frame": its index, "words": the warning up to its first
    ':' or ';', the stream's name left out}; None where it never does."""
    from sdqes_edge.runtime.pacing import FrameRateWarning, StreamPace

    pace = StreamPace(1.0 / case["fps"])
    for index, time in enumerate(case["times"]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FrameRateWarning)
            pace.observe("stream0", time)
        if caught:
            message = str(caught[0].message).removeprefix("stream0: ")
            return {"frame": index, "words": re.split(r"[:;]", message, maxsplit=1)[0]}
    return None
