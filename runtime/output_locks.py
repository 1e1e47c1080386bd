"""One process at a time per output (an alert log, a state snapshot, a score trace, an annotated video, a bundle).

Two runs given the same ``--state`` (a service started again while the first still ran, a second container on the
same volume, a run by hand beside the service) each resumed from and saved over the other's snapshot, and wrote one
alert log between them, without a word. A process now holds an advisory lock (``flock``) on a file beside each
output it writes, ``.NAME.lock``, holding its process id, while it writes it (the file removed as it lets go): the
command line for its whole command (cli/output_locks.py), each sink of the library for its life and ``save_state``
for its write, so that two programs of a user's own are kept apart too. Within a process an output's lock is taken
once and counted (the command line's and its sink's are one), and held for one kind of output only: an alert log
and a score trace given one file wrote it in turn. The kernel lets the lock go when the process ends, however it ends (a
kill -9, a power cut), so a lock file left behind stops no one. sdqes-run takes the same locks on its --events and
--state (``sdqes::hold_output``), so neither runtime shares those files with the other either. Where a lock cannot
be taken (a file system without locks, a folder this user may append to but not create in, an output that is a
device such as /dev/stdout) the output is written unlocked, as it was before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from sdqes_edge.errors import UserError
from sdqes_edge.files import make_folders, through_links

LOCK_SUFFIX = ".lock"
# What an output is (``hold``'s kind): the command line's option for it and the library's sink share one lock.
ALERT_LOG = "an alert log"
SCORE_TRACE = "a score trace"
ANNOTATED_VIDEO = "an annotated video"
STATE_SNAPSHOT = "a state snapshot"
BUNDLE = "a bundle"  # a folder, locked beside it as a file is: an export replaces it whole
PROGRAM = "sdqes-edge"  # what the lock file says holds it, beside the process id (sdqes-run writes its own name)


class HeldByAnotherRun(UserError):
    """``hold``'s refusal of an output another process holds; ``holder`` names it ("pid 1234, sdqes-edge"), for a
    command that goes on to a name of its own instead (``cli.common.folder_for_new_results``)."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass
class _Held:
    fd: int
    holders: int  # the takers not yet let go (the command line's, a sink's)
    pid: int  # the process that took it: a child made by fork() inherits the table, not the locks' ownership
    option: str  # the first taker's name for it (--events, JsonlSink) and what it writes there (an alert log)
    kind: str | None
    made: list[Path]  # the folders its taking made, deepest first: removed as it is let go, where still empty


_HELD: dict[Path, _Held] = {}  # the locks this process holds, by lock file
_TABLE = threading.Lock()  # sinks are made and closed on several threads (a detector each)


def lock_path(output: Path) -> Path:
    """The lock file of an output: hidden beside it (alerts.jsonl -> .alerts.jsonl.lock)."""
    return output.with_name(f".{output.name}{LOCK_SUFFIX}")


def hold(output: str | os.PathLike, option: str, kind: str | None = None,
         folder: str | os.PathLike | None = None) -> Path | None:
    """Take ``output``'s lock until ``release`` of what this returns (or ``release_all``), or refuse (a UserError
    naming ``option`` and the run that holds it). The lock file's path, or None where the output is written unlocked
    (see the module's docstring). ``kind``: what is written there ("an alert log"); a file this process holds for
    another kind is refused (a JsonlSink and a ScoreTraceRecorder given one path wrote it in turn). ``folder``: the
    folder ``option`` names, whose file ``output`` stands for it (score's --out), named in the refusal instead."""
    with _TABLE:
        return _hold(output, option, kind, folder)


def hold_folder(folder: str | os.PathLike, option: str, kind: str) -> Path | None:
    """Take the lock of a folder a command writes whole (a bundle, a dataset, a demo), as ``hold`` takes a file's:
    ``.NAME.lock`` beside it, made or not yet."""
    return hold(folder, option, kind, folder=folder)


def hold_bundle(bundle: str | os.PathLike, option: str) -> Path | None:
    """Take a bundle folder's lock (``hold_folder``) for a program that writes into it (a threshold, an engine);
    None, taking nothing, for a path that is no folder, which the caller's ``load_bundle`` refuses in its own words
    (a lock would have made the folders it names)."""
    return hold_folder(bundle, option, BUNDLE) if os.path.isdir(bundle) else None


def _hold(output: str | os.PathLike, option: str, kind: str | None, folder: str | os.PathLike | None) -> Path | None:
    try:
        import fcntl
    except ImportError:  # not a POSIX system: nothing to lock with
        return None
    target = through_links(output)  # two links to one file are one file
    if target.exists() and not (target.is_file() or target.is_dir()):  # /dev/stdout, a FIFO: not what a run keeps
        return None
    if not target.name:  # "/": no folder above it to hold its lock, and the command refuses it in its own words
        return None
    lock = lock_path(target)
    held = _HELD.get(lock)
    if held is not None and held.pid == os.getpid():  # this process's already (the command line's): counted
        if kind and held.kind and kind != held.kind:
            raise UserError(f"{option} {output} is the file {held.option} writes ({held.kind}) in this program: each "
                            f"output needs a file of its own; give {option} another path")
        held.holders += 1
        held.kind = held.kind or kind
        return lock
    made, tries = _missing_folders(lock.parent), 0
    while True:
        try:
            make_folders(lock.parent)  # as the run would make them: a first run into a new folder is locked too
            fd = _open_lock(lock)
        except FileNotFoundError:  # its folder removed meanwhile, empty, by a run letting go of its lock there
            tries += 1
            if tries < 3:
                continue  # made again
            fd = None
        except OSError:  # a folder this user may not create in, a link planted in the lock's place
            fd = None
        if fd is None:  # unlocked
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise HeldByAnotherRun(f"{option} {folder or output} is being written by another run ({holder}); stop that "
                                   f"run, or give this one another {'folder' if folder else 'file'}", holder) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):  # a file system without
                return None
            raise
        if _same_file(fd, lock):
            break
        os.close(fd)  # the lock file was replaced between its open and its lock: lock the one there now
    if os.fstat(fd).st_uid == os.geteuid():  # another user's lock file (a shared folder) is locked, not written
        # Who holds it, for a second run's refusal only: a full disk that refuses these bytes is said by the output
        # itself, by name (this write has none), and the lock holds without them.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {PROGRAM}\n".encode())
    _HELD[lock] = _Held(fd, 1, os.getpid(), option, kind, made)
    return lock


def _missing_folders(folder: Path) -> list[Path]:
    """The folders of ``folder`` and above it that are not there yet, deepest first."""
    missing = []
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing


def _open_lock(lock: Path) -> int | None:
    """The lock file opened, made where missing; None where what is there is no lock file of a run's. It is the
    program's own file, not one the user named, so a symbolic link there is never followed (O_NOFOLLOW: one planted
    in a shared folder such as /tmp would have had the pid written over the file it leads to), nor a file with other
    names (a hard link) written; another user's lock file is opened to read, which is all a lock needs."""
    flags = os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(lock, os.O_RDWR | flags, 0o644)
    except PermissionError:
        fd = os.open(lock, os.O_RDONLY | flags)
    held = os.fstat(fd)
    if not stat.S_ISREG(held.st_mode) or held.st_nlink != 1:
        os.close(fd)
        return None
    return fd


def release(lock: Path | None) -> None:
    """Let go of a lock ``hold`` took (None: one it could not take); the last of its takers lets it go."""
    with _TABLE:
        held = _HELD.get(lock) if lock is not None else None
        if held is not None:
            held.holders -= 1
            if held.holders <= 0:
                _let_go(lock, _HELD.pop(lock))


def release_all() -> None:
    """Let go of every lock this process holds, whoever took it (the command line, as its command ends)."""
    with _TABLE:
        while _HELD:
            _let_go(*_HELD.popitem())


def _let_go(lock: Path, held: _Held) -> None:
    """The lock file removed first (a run that opened it meanwhile finds it gone and makes its own: ``hold`` locks
    only the file that is there); one inherited through fork() is the parent's to remove, and only closed here."""
    if held.pid == os.getpid():
        try:
            if _same_file(held.fd, lock):
                lock.unlink()
            # A command refused after taking its lock (a bad annotation file, an eval whose traces match nothing)
            # left an empty --out folder behind, made by the lock alone.
            for folder in held.made:
                folder.rmdir()
        except OSError:  # left behind: a lock file stops no one once its holder has let go; a folder written in
            pass
    os.close(held.fd)


def _same_file(fd: int, lock: Path) -> bool:
    try:
        there = os.stat(lock)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def _holder(fd: int) -> str:
    """Who holds a lock, from its file ("pid 1234, sdqes-edge"), or words for one that has not said yet."""
    words = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
    if len(words) >= 2 and words[0].isdigit():
        return f"pid {words[0]}, {words[1]}"
    return "a process that has only just started"
