"""The Python API refuses what would otherwise fail deep inside or, worse, run wrong: each mistake a one-line
UserError that says what to pass instead."""

from __future__ import annotations

import numpy as np
import pytest

from sdqes_edge.errors import UserError
from sdqes_edge.runtime import Frame, StreamingDetector


@pytest.fixture(scope="module")
def detector(exported):
    _, bundle = exported
    return StreamingDetector(bundle)


def test_an_image_in_place_of_a_frame_is_refused_with_the_wrapping_to_use(detector):
    image = np.zeros((48, 64, 3), np.uint8)
    with pytest.raises(UserError, match=r"step takes one Frame .* not a ndarray: wrap an image as .*Frame\(image="):
        detector.step([image])
    detector.step([Frame(image=image, time=0.0, index=0)])  # what it says to do works


def test_a_float_image_is_refused_rather_than_seen_as_a_black_one(detector):
    """A float image in [0, 1] read as 8-bit grey levels would be near black: alerts would be silently wrong."""
    image = np.full((48, 64, 3), 0.5, np.float32)
    with pytest.raises(UserError, match=r"expected a uint8 BGR frame .* got float32; .*astype\(numpy.uint8\)"):
        detector.step([Frame(image=image, time=0.0, index=0)])


def test_resetting_a_stream_the_bundle_does_not_step_is_refused(detector):
    with pytest.raises(UserError, match="stream 1 is not one of this bundle's streams, 0 to 0"):
        detector.reset(stream=1)
    with pytest.raises(UserError, match="stream -1 is not one of"):
        detector.reset(stream=-1)
    detector.reset(stream=0)


def test_a_frame_without_a_finite_time_is_refused(detector):
    """Alerts, their cooldowns and the traces are timed by the frame's time: a NaN would pass every comparison."""
    with pytest.raises(UserError, match="a Frame's time is seconds into its stream, a finite number, not nan"):
        detector.step([Frame(image=np.zeros((48, 64, 3), np.uint8), time=float("nan"), index=0)])
