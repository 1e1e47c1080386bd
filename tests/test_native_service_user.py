"""sdqes-run as a service's own user, not root (systemd's User=, docker's USER): the tests otherwise run as root, whom
access() never refuses, so a check that asked for a writable folder where a file was what mattered refused
`--events /dev/stdout` ("/dev: Permission denied") for every other user, and no test saw it. Here sdqes-run, its
ONNX Runtime library, a bundle and a video are copied where any user may read them, and run as `nobody`."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def _service_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("runs sdqes-run as another user, which only root may do (here the tests run as that user)")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no user 'nobody' to run sdqes-run as")


@pytest.fixture
def readable_by_all(sdqes_run_on_the_cpu, bundle, video):
    """A folder any user may read (in /tmp: the test's own folders are root's alone) holding sdqes-run, the ONNX
    Runtime library it loads, a bundle and a video -> (the folder, the environment that finds the library)."""
    place = Path(tempfile.mkdtemp(prefix="sdqes-service-user-"))
    try:
        shutil.copy2(sdqes_run_on_the_cpu, place / "sdqes-run")
        found = subprocess.run(["ldd", str(sdqes_run_on_the_cpu)], capture_output=True, text=True).stdout
        for line in found.splitlines():  # the libraries of the build's own folders (ONNX Runtime's, the runtime's)
            if "=>" in line and "/tmp/" in line:
                library = Path(line.split("=>")[1].split("(")[0].strip())
                shutil.copy2(library.resolve(), place / line.split("=>")[0].strip())
        shutil.copytree(bundle, place / "bundle")
        shutil.copy2(video, place / "clip.avi")
        for path in [place, *place.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        yield place, dict(os.environ, LD_LIBRARY_PATH=str(place))
    finally:
        shutil.rmtree(place, ignore_errors=True)


def _as(user: pwd.struct_passwd):
    def drop() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    return drop


def test_sdqes_run_as_a_service_user_writes_its_alerts_to_stdout_and_refuses_a_folder_it_may_not_write(
        readable_by_all):
    user = _service_user()
    place, env = readable_by_all
    captured = place / "stdout.jsonl"  # stdout as a file the service user owns, as a unit's StandardOutput=file:
    captured.touch()
    os.chown(captured, user.pw_uid, user.pw_gid)
    command = [str(place / "sdqes-run"), str(place / "bundle"), "--source", str(place / "clip.avi"),
               "--threshold", "0.01", "--events", "/dev/stdout"]
    with captured.open("a") as stdout:
        done = subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
                              preexec_fn=_as(user), timeout=300)
    assert done.returncode == 0, done.stderr
    logged = [json.loads(line) for line in captured.read_text().splitlines() if line.startswith("{")]
    assert logged and logged[0]["frame_index"] == 0  # the alert log, on stdout, for the service user too
    roots = place / "roots"  # open to all, written by root alone
    roots.mkdir(mode=0o755)
    refused = subprocess.run(command[:-1] + [str(roots / "alerts.jsonl")], capture_output=True, text=True,
                             env=env, preexec_fn=_as(user), timeout=300)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "cannot be written" in refused.stderr and "Permission denied" in refused.stderr
    (roots / "closed").mkdir(mode=0o700)  # a folder the service user may not even enter, above the log's
    (roots / "closed" / "logs").mkdir()
    closed = subprocess.run(command[:-1] + [str(roots / "closed" / "logs" / "alerts.jsonl")], capture_output=True,
                            text=True, env=env, preexec_fn=_as(user), timeout=300)
    assert closed.returncode == 2 and closed.stderr.strip() == (  # it was told the folder "does not exist"
        f"sdqes-run: error: --events {roots / 'closed' / 'logs' / 'alerts.jsonl'} cannot be written: this user may "
        f"not enter {roots / 'closed'} (Permission denied); give a path in a folder this user may write"), closed.stderr


def _refusals_of_what_root_keeps(place, env, copy, name: str, bundle_of, source_of) -> list[str]:
    """sdqes-run's words, as the service user, for a ``name`` it may not read: one under a folder it may not enter,
    and one it may not read itself (``copy`` makes it; ``bundle_of``/``source_of`` place it in the command)."""
    user = _service_user()
    (place / "closed").mkdir(mode=0o700)
    copy(place / name, place / "closed" / name)
    copy(place / name, place / f"kept-{name}")
    (place / f"kept-{name}").chmod(0o700)
    said = []
    for kept in (place / "closed" / name, place / f"kept-{name}"):
        done = subprocess.run([str(place / "sdqes-run"), str(bundle_of(kept)), "--source", str(source_of(kept))],
                              capture_output=True, text=True, env=env, preexec_fn=_as(user), timeout=300)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        said.append(done.stderr.strip())
    return said


def test_sdqes_run_as_a_service_user_says_which_bundle_or_video_it_may_not_read(readable_by_all):
    """It was told the bundle "does not exist" (under a folder it may not enter) or "has no manifest.json" (a bundle
    folder it may not read), and a video was "neither a video file, ..." or not decoded: the Python runtime's words
    now (tests/test_paths_a_service_user_cannot_reach.py)."""
    place, env = readable_by_all
    closed, kept = place / "closed" / "bundle", place / "kept-bundle"
    fix = "give the folder `sdqes-edge export --out` wrote, the one holding manifest.json"
    assert _refusals_of_what_root_keeps(place, env, shutil.copytree, "bundle", lambda b: b,
                                        lambda b: place / "clip.avi") == [
        f"sdqes-run: error: bundle {closed} cannot be read: this user may not enter {place / 'closed'} (Permission "
        f"denied); {fix}",
        f"sdqes-run: error: bundle {kept} cannot be read: this user may not read it (Permission denied); {fix}"]
    shutil.rmtree(place / "closed")
    closed, kept = place / "closed" / "clip.avi", place / "kept-clip.avi"
    fix = "give a video this user may read"
    assert _refusals_of_what_root_keeps(place, env, shutil.copy2, "clip.avi", lambda v: place / "bundle",
                                        lambda v: v) == [
        f"sdqes-run: error: --source {closed} cannot be read: this user may not enter {place / 'closed'} (Permission "
        f"denied); {fix}",
        f"sdqes-run: error: --source {kept} cannot be read: this user may not read it (Permission denied); {fix}"]
