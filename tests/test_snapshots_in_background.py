"""``save_state(wait=False)``: the state is copied at once and written by a thread of its own, while the stream goes
on (``run --state`` snapshots after an alert: a write of 32 ViT-B/16 streams' 268 MiB held the stepping thread for
0.3-0.8 s here, its cameras dropping frames). Every snapshot is still written, in order, and a failed write is
raised in the caller's thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from runtime_fixtures import QUERY

from sdqes_edge.errors import UserError
from sdqes_edge.runtime import snapshots
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.runtime.output_locks import lock_path
from sdqes_edge.runtime.snapshots import read_snapshot
from sdqes_edge.runtime.sources import Frame

FRAMES = 6


def stepped(bundle, frames: int = FRAMES) -> StreamingDetector:
    detector = StreamingDetector(bundle)
    detector.add_query(QUERY)
    rng = np.random.default_rng(0)
    for k in range(frames):
        detector.step([Frame(rng.integers(0, 255, (48, 64, 3), np.uint8), k / detector.fps, k)])
    return detector


def same_snapshot(a, b) -> bool:
    return (a.streams == b.streams and a.state.keys() == b.state.keys()
            and all(np.array_equal(a.state[k], b.state[k]) for k in a.state))


def test_a_snapshot_in_the_background_is_the_state_when_asked_written_while_the_stream_goes_on(
        exported, tmp_path, monkeypatch):
    _, bundle = exported
    detector = stepped(bundle)
    detector.save_state(tmp_path / "now.npz")  # the reference: written before returning
    go, real_write = threading.Event(), snapshots.write_snapshot

    def held_write(path, snapshot):
        go.wait(timeout=30)
        return real_write(path, snapshot)

    monkeypatch.setattr(snapshots, "write_snapshot", held_write)
    detector.save_state(tmp_path / "later.npz", wait=False)
    assert not (tmp_path / "later.npz").exists(), "returned only once written"
    detector.step([Frame(np.zeros((48, 64, 3), np.uint8), FRAMES / detector.fps, FRAMES)])  # the stream goes on
    go.set()
    detector.close()  # waits for the write
    assert same_snapshot(read_snapshot(tmp_path / "later.npz"), read_snapshot(tmp_path / "now.npz"))


def test_snapshots_are_written_in_the_order_asked_the_last_one_staying(exported, tmp_path):
    _, bundle = exported
    detector = stepped(bundle)
    path = tmp_path / "state.npz"
    for k in range(3):
        detector.step([Frame(np.full((48, 64, 3), 40 * k, np.uint8), (FRAMES + k) / detector.fps, FRAMES + k)])
        detector.save_state(path, wait=False)
    detector.save_state(tmp_path / "reference.npz")  # waits for those in flight first
    assert read_snapshot(path).streams[0].frames == FRAMES + 3
    assert same_snapshot(read_snapshot(path), read_snapshot(tmp_path / "reference.npz"))
    detector.close()


def test_a_failed_write_in_the_background_is_raised_by_the_next_save_or_by_close(exported, tmp_path, monkeypatch):
    _, bundle = exported
    detector = stepped(bundle, frames=1)

    def full_disk(path, snapshot):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(snapshots, "write_snapshot", full_disk)
    detector.save_state(tmp_path / "a.npz", wait=False)
    with pytest.raises(OSError, match="No space left"):
        detector.save_state(tmp_path / "b.npz", wait=False)
    detector.save_state(tmp_path / "c.npz", wait=False)
    with pytest.raises(OSError, match="No space left"):
        detector.close()


@pytest.mark.parametrize("wait", [False, True], ids=["in the background", "at once"])
def test_on_done_is_told_how_each_write_ended_and_a_refusal_it_is_told_is_not_raised(exported, tmp_path,
                                                                                      monkeypatch, wait):
    """What `run --state` says a refused snapshot with, as it happens, and goes on streaming."""
    _, bundle = exported
    detector = stepped(bundle, frames=1)
    told = []
    detector.save_state(tmp_path / "a.npz", wait=wait, on_done=told.append)
    real_write = snapshots.write_snapshot

    def full_disk(path, snapshot):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(snapshots, "write_snapshot", full_disk)
    detector.save_state(tmp_path / "b.npz", wait=wait, on_done=told.append)
    detector.close()  # raises nothing: the refusal was told
    assert told[0] is None and (told[1].errno, told[1].filename) == (28, str(tmp_path / "b.npz"))
    monkeypatch.setattr(snapshots, "write_snapshot", real_write)
    detector.load_state(tmp_path / "a.npz")
    assert not (tmp_path / "b.npz").exists()
    with pytest.raises(UserError, match="on_done is called with None once the snapshot is written.*not a str"):
        detector.save_state(tmp_path / "c.npz", wait=wait, on_done="print")
    assert not (tmp_path / "c.npz").exists()


def test_a_snapshot_still_being_written_is_waited_for_by_load_state(exported, tmp_path, monkeypatch):
    _, bundle = exported
    detector = stepped(bundle)
    path = tmp_path / "state.npz"
    detector.save_state(path)  # an older snapshot at the path
    detector.step([Frame(np.zeros((48, 64, 3), np.uint8), FRAMES / detector.fps, FRAMES)])
    go, real_write = threading.Event(), snapshots.write_snapshot

    def held_write(path, snapshot):
        go.wait(timeout=30)
        return real_write(path, snapshot)

    monkeypatch.setattr(snapshots, "write_snapshot", held_write)
    detector.save_state(path, wait=False)
    threading.Timer(0.2, go.set).start()
    detector.load_state(path)  # the newer one, not the one it replaces
    assert [slot.frames for slot in detector.streams] == [FRAMES + 1]
    detector.close()


def test_a_wait_that_is_not_true_or_false_is_refused_before_anything_is_written(exported, tmp_path):
    """wait="no" was taken as yes: the stream waited on the disk, the very thing wait=False is for."""
    _, bundle = exported
    detector = stepped(bundle, 1)
    for wait in ("no", 0, None):
        with pytest.raises(UserError, match=rf"^save_state's wait is True or False, not {wait!r}$"):
            detector.save_state(tmp_path / "state.npz", wait=wait)
    assert not lock_path(tmp_path / "state.npz").exists() and not (tmp_path / "state.npz").exists()
    detector.save_state(tmp_path / "state.npz")
    assert (tmp_path / "state.npz").is_file()
