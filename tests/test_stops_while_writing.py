"""A stop signal that lands while a file is written whole (a score trace, a state snapshot) is held until the file is
in place, then stops the work as it would have: zipfile, cut inside a handle's close, raised ValueError in its own
cleanup instead, so a SIGTERM became a trace that could not be written and `score` went on to the next video."""

from __future__ import annotations

import signal
import zipfile

import numpy as np
import pytest

from sdqes_edge.stopping import FinishFrameThenStop, Stopped, raise_on_termination, stops_held
from sdqes_edge.traces import StreamScores, load_scores, save_scores


@pytest.fixture
def termination_raises():
    """SIGTERM raises ``Stopped``, as the command line sets it up; the test's handlers put back after."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    raise_on_termination()
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.fixture
def signal_inside_zip_close(monkeypatch):
    """SIGTERM delivered from inside the first zip member's close: where the exception masked itself."""
    close = zipfile._ZipWriteFile.close

    def close_after_a_signal(self):
        monkeypatch.setattr(zipfile._ZipWriteFile, "close", close)
        signal.raise_signal(signal.SIGTERM)
        close(self)

    monkeypatch.setattr(zipfile._ZipWriteFile, "close", close_after_a_signal)


def test_a_sigterm_while_a_trace_is_written_stops_after_the_trace_is_whole(termination_raises,
                                                                            signal_inside_zip_close, tmp_path):
    probs = np.linspace(0.2, 0.8, 40, dtype=np.float32)[:, None]
    with pytest.raises(Stopped) as stopped:
        save_scores(tmp_path / "cam.npz", StreamScores("cam", 1.0, ["when it starts"], ["q1"], np.zeros(1), probs))
    assert stopped.value.exit_code == 143
    np.testing.assert_array_equal(load_scores(tmp_path / "cam.npz").probs, probs)
    assert [p.name for p in tmp_path.iterdir()] == ["cam.npz"]  # no partial file left beside it


def test_a_second_ctrl_c_while_a_file_is_written_whole_stops_at_once_after_it():
    """A stream's loop asks to finish the frame in hand at the first signal and stops at once at the second; two
    that land while a file is written still do both, after it."""
    with FinishFrameThenStop() as stop, pytest.raises(Stopped):
        with stops_held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            assert not stop.requested
    assert stop.requested


def test_signals_held_are_given_to_the_handlers_before_in_the_order_they_came_and_the_handlers_put_back():
    seen = []
    before = {signum: signal.signal(signum, lambda signum, _frame: seen.append(signum))
              for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
        with stops_held():
            for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGHUP):
                signal.raise_signal(signum)
            assert seen == []
        assert seen == [signal.SIGHUP, signal.SIGTERM, signal.SIGHUP]
        assert {signum: signal.getsignal(signum) for signum in handlers} == handlers
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
