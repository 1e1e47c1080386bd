"""What a power cut may leave, an edge device's common end: a file replaced atomically (a state snapshot, a score
trace, a manifest) reaches the disk before it is renamed over the old one, and the rename before the call returns,
so the old file or the new one is there whole, never an empty one; an export's every file reaches the disk before
the new bundle is renamed into place and the old one removed.

A power cut cannot be made here. These tests watch the calls that make the difference, fsync and rename, in the
order the kernel gets them, each still doing its real work."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from runtime_fixtures import QUERY

from sdqes_edge.cli import run
from sdqes_edge.errors import UserError
from sdqes_edge.files import set_aside, staged_directory, write_text_atomically
from sdqes_edge.runtime.snapshots import Snapshot, StreamRecord, read_snapshot, write_snapshot
from sdqes_edge.traces import StreamScores, load_scores, save_scores

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(),
                                reason="names a synced descriptor's file through /proc/self/fd (Linux)")


@pytest.fixture
def disk_calls(monkeypatch) -> list[tuple]:
    """("fsync", path), ("replace", source, target) and ("rmtree", path), in the order they are made."""
    calls: list[tuple] = []
    real_fsync, real_replace, real_rmtree = os.fsync, os.replace, shutil.rmtree

    def fsync(fd):
        calls.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def replace(source, target):
        calls.append(("replace", Path(source).absolute(), Path(target).absolute()))
        return real_replace(source, target)

    def rmtree(path, *args, **kwargs):
        calls.append(("rmtree", Path(path).absolute()))
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    return calls


def position(calls: list[tuple], call: tuple) -> int:
    assert call in calls, f"{call} was not made; made: {calls}"
    return calls.index(call)


def test_a_state_snapshot_reaches_the_disk_before_it_replaces_the_last_one(tmp_path, disk_calls):
    path = tmp_path / "state.npz"
    for frames in (1, 2):  # the second replaces the first, as a service's every stop does
        disk_calls.clear()
        write_snapshot(path, Snapshot("model", {"x": np.full(3, frames, np.float32)}, [StreamRecord(frames)]))
        [(_, partial, target)] = [call for call in disk_calls if call[0] == "replace"]
        assert target == path
        assert position(disk_calls, ("fsync", partial)) < position(disk_calls, ("replace", partial, path)) \
            < position(disk_calls, ("fsync", tmp_path))
    assert read_snapshot(path).streams[0].frames == 2


def test_a_text_file_written_atomically_reaches_the_disk_before_its_rename(tmp_path, disk_calls):
    path = tmp_path / "manifest.json"
    write_text_atomically(path, "{}")
    [(_, partial, _)] = [call for call in disk_calls if call[0] == "replace"]
    assert position(disk_calls, ("fsync", partial)) < position(disk_calls, ("replace", partial, path)) \
        < position(disk_calls, ("fsync", tmp_path))


def test_every_file_of_an_export_reaches_the_disk_before_the_old_bundle_is_replaced_and_removed(tmp_path,
                                                                                                disk_calls):
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "step.fp32.onnx").write_bytes(b"the old graph")
    with staged_directory(target) as staging:
        (staging / "engines").mkdir()
        for name in ("step.fp32.onnx", "manifest.json", "engines/cache.json"):
            (staging / name).write_bytes(name.encode())
    [(_, retired)] = [call for call in disk_calls if call[0] == "rmtree"]
    swap = position(disk_calls, ("replace", staging, target))
    for written in (staging / "step.fp32.onnx", staging / "manifest.json", staging / "engines" / "cache.json",
                    staging / "engines", staging):
        assert position(disk_calls, ("fsync", written)) < swap
    assert swap < position(disk_calls, ("fsync", tmp_path)) < position(disk_calls, ("rmtree", retired))
    assert (target / "step.fp32.onnx").read_bytes() == b"step.fp32.onnx" and not retired.exists()


def test_a_file_set_aside_keeps_its_contents_and_suffix_under_a_name_of_its_own(tmp_path, monkeypatch):
    moment = time.strptime("2026-11-28 03:15:02", "%Y-%m-%d %H:%M:%S")
    monkeypatch.setattr(time, "gmtime", lambda *_: moment)  # both set aside within one second
    path = tmp_path / "state.npz"
    kept = []
    for contents in (b"one", b"two"):
        path.write_bytes(contents)
        kept.append(set_aside(path, "unusable"))
        assert not path.exists()
    assert [k.name for k in kept] == ["state.unusable-20261128T031502Z.npz", "state.unusable-20261128T031502Z-2.npz"]
    assert [k.read_bytes() for k in kept] == [b"one", b"two"]


@pytest.mark.parametrize("kind", ["state snapshot", "score trace"])
def test_a_snapshot_or_trace_cut_short_at_any_byte_is_named_as_cut_short_not_a_traceback(tmp_path, kind):
    """A file copied off a device whose copy stopped, or written where nothing syncs: numpy raised BadZipFile
    or EOFError, which neither reader caught."""
    whole = tmp_path / "whole.npz"
    if kind == "state snapshot":
        write_snapshot(whole, Snapshot("model", {"x": np.zeros((4, 64), np.float32)}, [StreamRecord(3)]))
        read = read_snapshot
    else:
        save_scores(whole, StreamScores("clip", 5.0, ["a query"], ["q0"], np.zeros(1), np.full((40, 1), 0.5)))
        read = load_scores
    data = whole.read_bytes()
    cut = tmp_path / "cut.npz"
    for length in range(0, len(data), 7):
        cut.write_bytes(data[:length])
        with pytest.raises(UserError, match=f"is not a {kind} written by .*cut short"):
            read(cut)


def test_a_service_killed_after_an_alert_keeps_that_alert_across_its_restart(exported, endless_stream, tmp_path):
    """`run --state` wrote its snapshot only when the stream ended or was stopped: a power cut or a SIGKILL (the
    OOM killer, a hardware watchdog) lost every alert's count, and a query to be alerted once (--max-alerts 1)
    alerted again after the restart. The snapshot is written after an alert now."""
    _, bundle = exported
    state, events = tmp_path / "state.npz", tmp_path / "alerts.jsonl"
    command = ["run", str(bundle), "--source", endless_stream, "--query", QUERY, "--threshold", "0.01",
               "--max-alerts", "1", "--events", str(events), "--state", str(state), "--quiet"]
    service = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", *command], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not state.exists() and service.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        service.kill()  # as a power cut ends it: nothing of its own runs after
        _, err = service.communicate()
    assert service.returncode == -9, err
    assert len(events.read_text().splitlines()) == 1
    with np.load(state) as snapshot:
        assert snapshot["alert_counts"].tolist() == [[1]]
    assert run([*command, "--max-frames", "10"]) == 0  # the restart
    assert len(events.read_text().splitlines()) == 1  # asked once, alerted once


def test_an_interruption_just_after_the_staging_folder_is_made_removes_it(tmp_path, monkeypatch):
    """A SIGTERM (raised as an exception) that landed after the staging folder was made, before the block was
    entered, left the folder beside the bundle (a fresh-clone CI run's SIGTERM test caught it once)."""
    import sdqes_edge.files as files

    made = files.make_staging_directory

    def made_then_interrupted(target):
        made(target)
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "make_staging_directory", made_then_interrupted)
    (tmp_path / "bundle").mkdir()
    with pytest.raises(KeyboardInterrupt):
        with staged_directory(tmp_path / "bundle"):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
