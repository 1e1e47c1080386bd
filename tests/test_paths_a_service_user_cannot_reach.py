"""An output under a folder the service's user may not enter (systemd's User=, docker's USER), or a bundle it may
not read (one root keeps), is refused up front in one line that says so. pathlib's checks raise PermissionError
there, which the command line's last net worded as permissions changed while the command ran. The tests run as
root, whom no folder is closed to, so the check runs in a process forked from this one (the modules already
loaded) that has become `nobody`."""

from __future__ import annotations

import multiprocessing
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from sdqes_edge.errors import UserError
from sdqes_edge.path_checks import check_output_dir, check_output_file
from sdqes_edge.runtime.bundle import load_bundle
from sdqes_edge.runtime.sources import open_source


def _become_nobody() -> None:
    user = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)


def _refusal(check: str, path: str) -> str:
    """What ``check`` says of ``path`` in this (forked, nobody's) process: its UserError, or that it took it."""
    try:
        {"file": lambda: check_output_file(path, "--events", "alerts.jsonl"),
         "folder": lambda: check_output_dir(path, "--scores"), "bundle": lambda: load_bundle(path),
         "source": lambda: open_source(path, 5.0)}[check]()
    except UserError as refused:
        return str(refused)
    return "taken"


@pytest.fixture
def closed_folder():
    """A folder in /tmp that root alone may enter, with a folder inside it."""
    if os.geteuid() != 0:
        pytest.skip("becomes another user, which only root may do (here the tests run as that user)")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no user 'nobody'")
    closed = Path(tempfile.mkdtemp(prefix="sdqes-closed-"))
    (closed / "logs").mkdir()
    closed.chmod(0o700)
    yield closed
    shutil.rmtree(closed, ignore_errors=True)


@pytest.mark.parametrize("check, name, flag", [("file", "alerts.jsonl", "--events"), ("folder", "traces", "--scores")])
def test_an_output_under_a_folder_the_user_may_not_enter_is_refused_up_front_saying_so(closed_folder, check, name,
                                                                                       flag):
    target = closed_folder / "logs" / name
    with multiprocessing.get_context("fork").Pool(1, initializer=_become_nobody) as nobody:
        said = nobody.apply(_refusal, (check, str(target)))
    assert said == (f"{flag} {target} cannot be written: this user may not enter {closed_folder} (Permission "
                    "denied); give a path in a folder this user may write")


def test_a_bundle_the_user_may_not_read_is_refused_saying_so_where_it_did_not_exist_or_raised(closed_folder):
    """sdqes-run gives the same words (tests/test_native_service_user.py)."""
    kept = closed_folder.parent / f"{closed_folder.name}-kept-bundle"
    kept.mkdir(mode=0o700)  # a bundle folder root alone may read
    try:
        with multiprocessing.get_context("fork").Pool(1, initializer=_become_nobody) as nobody:
            under_closed = nobody.apply(_refusal, ("bundle", str(closed_folder / "logs")))
            unreadable = nobody.apply(_refusal, ("bundle", str(kept)))
    finally:
        kept.rmdir()
    fix = "give the folder `sdqes-edge export --out` wrote, the one holding manifest.json"
    assert under_closed == (f"bundle {closed_folder / 'logs'} cannot be read: this user may not enter {closed_folder} "
                            f"(Permission denied); {fix}")
    assert unreadable == f"bundle {kept} cannot be read: this user may not read it (Permission denied); {fix}"


def test_a_video_the_user_may_not_read_is_refused_saying_so_not_as_missing_or_undecodable(closed_folder):
    kept = closed_folder.parent / f"{closed_folder.name}-kept.mp4"
    kept.write_bytes(b"a video root keeps")
    kept.chmod(0o600)
    try:
        with multiprocessing.get_context("fork").Pool(1, initializer=_become_nobody) as nobody:
            under_closed = nobody.apply(_refusal, ("source", str(closed_folder / "logs" / "kitchen.mp4")))
            unreadable = nobody.apply(_refusal, ("source", str(kept)))
    finally:
        kept.unlink()
    assert under_closed == (f"source {closed_folder / 'logs' / 'kitchen.mp4'} cannot be read: this user may not enter "
                            f"{closed_folder} (Permission denied); give a video this user may read")  # "neither a file"
    assert unreadable == (f"source {kept} cannot be read: this user may not read it (Permission denied); give a video "
                          "this user may read")  # "OpenCV cannot decode a frame of ..."
