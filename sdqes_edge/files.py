"""File helpers shared by the exporter and the runtime (torch-free)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Iterable, Iterator, NoReturn

from .stopping import stops_held

# How a user's own text files (annotations, queries, model configs) are read: UTF-8 with or without the byte-order
# mark that Excel's "CSV UTF-8" and Windows Notepad put first. Read as plain UTF-8 the mark became part of the
# first column's name ("missing column split") or of the first query's text.
USER_TEXT_ENCODING = "utf-8-sig"
# ... unless the file begins with a UTF-16 or UTF-32 byte-order mark (Notepad's "Unicode", Excel's "Unicode Text",
# PowerShell 5's default): read in that encoding, which the mark names unambiguously. UTF-32's marks first, since
# UTF-32 LE's begins with UTF-16 LE's.
MARKED_ENCODINGS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
                    (b"\xfe\xff", "utf-16"))


def user_text_encoding(path: str | os.PathLike) -> str:
    """The encoding to read a user's text file in (``open(path, encoding=...)``): the one its byte-order mark
    names, else UTF-8 (``USER_TEXT_ENCODING``). A file that cannot be opened is left for the reader to refuse."""
    try:
        with open(path, "rb") as fh:
            start = fh.read(4)
    except OSError:
        return USER_TEXT_ENCODING
    return next((encoding for mark, encoding in MARKED_ENCODINGS if start.startswith(mark)), USER_TEXT_ENCODING)


def encoding_name(encoding: str) -> str:
    """'utf-8-sig' -> 'UTF-8', 'utf-16' -> 'UTF-16': what a refusal calls the encoding a file was read in."""
    return encoding.upper().replace("-SIG", "")


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def raise_naming(refusal: OSError, target: Path, stand_in: Path) -> NoReturn:
    """Raise ``refusal`` (a full disk), naming ``target``, what the user asked for, where it names nothing or only
    ``stand_in`` (our partial copy or staging folder, or a file in it): numpy, zipfile and torch's ONNX exporter write
    into handles and name no file, so the command line said "the disk is full" and not where."""
    name = refusal.filename  # a str or bytes, None, or a file descriptor (os.stat of one): a number names nothing
    named = Path(os.fsdecode(name)) if isinstance(name, (str, bytes, os.PathLike)) else None
    if refusal.errno is None or (named is not None and named != stand_in and stand_in not in named.parents):
        raise refusal
    raise OSError(refusal.errno, refusal.strerror, str(target)) from refusal


def through_links(path: str | os.PathLike) -> Path:
    """``path`` with its symbolic links followed, one that leads nowhere yet too (to where it points): what a write
    to it reaches, as the shell's ``>`` reaches it. A file or folder replaced by a rename replaced the link itself:
    ``state.npz -> /data/state.npz`` became a file of its own, the linked one left stale, and an export to
    ``bundles/current -> v3`` made ``current`` a folder, v3 unchanged and the old link left beside it."""
    return Path(os.path.realpath(path))


def make_folders(folder: str | os.PathLike) -> None:
    """``folder`` and those above it, made where missing, through symbolic links: ``mkdir -p`` refuses a link to a
    folder not made yet ("File exists")."""
    through_links(folder).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A path beside ``path`` for the block to write; it replaces ``path`` only when the block ends without error
    and is removed otherwise. So ``path`` holds the new contents or what it held before, never part of them. A stop
    signal that comes meanwhile (a second Ctrl-C, SIGTERM) is held until the file is in place (``stops_held``).
    Missing folders above ``path`` are made, as ``check_output_file`` promises when it accepts a path in them. A
    symbolic link at ``path`` is kept, and the file it leads to replaced (``through_links``)."""
    path = Path(path)
    target = through_links(path)
    target.parent.mkdir(parents=True, exist_ok=True)  # its links followed already
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        with stops_held():  # a stop that comes meanwhile lands after the file is whole (zipfile masks it otherwise)
            _claim(partial)
            yield partial
            flush_to_disk(partial)
            os.replace(partial, target)
            flush_to_disk(target.parent)
    except OSError as exc:
        raise_naming(exc, path, partial)
    finally:
        partial.unlink(missing_ok=True)


def _claim(partial: Path) -> None:
    """``partial`` made afresh as an empty file of this process's, whatever was at its name (a leftover of a process
    that had this pid, or a link planted there: its name can be guessed, and in a shared folder a link put in its
    place had the block write through it to the file it led to). Never following a link (O_NOFOLLOW), and made only
    where nothing is (O_EXCL), so that a link planted again between the two is refused, not followed."""
    partial.unlink(missing_ok=True)
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))


def flush_to_disk(path: Path) -> None:
    """fsync a file, or a folder (its entries: a rename into it), so that what was written there survives a power
    loss. Without it a replace is atomic only while the machine stays up: after a power cut (an edge device's
    common end) a file renamed over its old self may come back empty, the old contents gone too, since the kernel
    may write the rename to disk before the data. Where a file system cannot sync a folder (Windows, some FUSE
    mounts), the rename is as durable as it makes it."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # Windows opens no folder
        return
    try:
        os.fsync(fd)
    except OSError:  # EINVAL: this file system syncs no folders
        pass
    finally:
        os.close(fd)


def flush_tree_to_disk(folder: Path) -> None:
    """``flush_to_disk`` every file and folder under ``folder``, and ``folder``: before a finished export is renamed
    into place, so that the bundle a power cut leaves at the target is whole (old or new), never one of empty
    graphs whose old copy was already removed."""
    for root, _, files in os.walk(folder):
        for name in files:
            flush_to_disk(Path(root) / name)
        flush_to_disk(Path(root))


UTC_STAMP_FORMAT = "%Y%m%dT%H%M%SZ"  # a moment in a file's name: UTC, sortable, no colons (FAT, Windows)


def utc_stamp(moment: float | None = None) -> str:
    """1764299702.0 -> '20261128T031502Z' (now, where no moment is given)."""
    return time.strftime(UTC_STAMP_FORMAT, time.gmtime(moment))


def free_name(path: Path) -> Path:
    """``path`` where nothing is there yet, else the first free of NAME-2.EXT, NAME-3.EXT, ...: names made from a
    moment (``utc_stamp``) meet when two files are made within one second."""
    free, n = path, 1
    while free.exists():
        n += 1
        free = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return free


def set_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to a free name beside it that says ``why`` and when ("state.npz" -> "state.unusable-
    20261128T031502Z.npz"), its suffix kept so that it still opens as what it is; the new path. For a file the
    program would otherwise refuse at every start, or write over: kept rather than deleted, it is the user's."""
    kept = free_name(path.with_name(f"{path.stem}.{why}-{utc_stamp()}{path.suffix}"))
    os.replace(path, kept)
    flush_to_disk(path.parent)
    return kept


def write_text_atomically(path: Path, text: str) -> Path:
    """``path`` holds ``text`` or what it held before, never part of it."""
    with replaced_atomically(path) as partial:
        partial.write_text(text)
    return path


def user_cache_dir() -> Path:
    """Where this user's caches go: ``$XDG_CACHE_HOME/sdqes-edge``, else ``~/.cache/sdqes-edge``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sdqes-edge"


def _process_is_gone(pid: int) -> bool:
    if os.name != "posix":  # Windows' os.kill(pid, 0) is not a probe: it sends Ctrl-C
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def remove_dead_staging(target: Path) -> list[Path]:
    """Remove the ``.NAME.staging-PID`` / ``.NAME.retired-PID`` folders of exports whose process is gone.

    A process killed outright (SIGKILL, power loss) cannot clean up after itself. Only folders whose PID no
    longer runs are removed: one of a concurrent export to the same target is left alone.
    """
    folders = [f for kind in ("staging", "retired") for f in target.parent.glob(f".{target.name}.{kind}-*")]
    return _remove_orphans((folder, _number(folder.name.rsplit("-", 1)[1])) for folder in folders)


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _remove_orphans(owned: Iterable[tuple[Path, int | None]]) -> list[Path]:
    """Remove each folder whose owner (a process id; None: not a folder of ours) is gone and is not this process:
    a process killed outright (SIGKILL, power loss) cannot clean up after itself."""
    removed = []
    for folder, pid in owned:
        if pid is not None and pid != os.getpid() and folder.is_dir() and _process_is_gone(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def staging_path(target: Path) -> Path:
    """This process's staging folder beside ``target`` (same file system, so the final rename is atomic)."""
    return target.parent / f".{target.name}.staging-{os.getpid()}"


def make_staging_directory(target: Path) -> Path:
    """``staging_path(target)`` made fresh; stale staging folders of dead exports to the same target are removed
    first."""
    make_folders(target.parent)
    remove_dead_staging(target)
    staging = staging_path(target)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


def replace_directory(staging: Path, target: Path) -> None:
    """Move a finished ``staging`` directory to ``target``, replacing what was there.

    The old directory is first renamed aside, so at every moment either the old
    or the new one is complete at ``target``'s path (never a half-written mix).
    """
    flush_tree_to_disk(staging)
    retired = None
    if target.exists():
        retired = target.parent / f".{target.name}.retired-{os.getpid()}"
        if retired.exists():
            shutil.rmtree(retired)
        os.replace(target, retired)
    try:
        os.replace(staging, target)
    except OSError:
        if retired is not None:
            os.replace(retired, target)  # put the old one back
        raise
    flush_to_disk(target.parent)  # the new bundle's name on disk before the old one's files are removed
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(target: Path) -> Iterator[Path]:
    """Write a folder's contents into the staging folder this yields; it replaces ``target`` only once the block
    ends without error. On any error, Ctrl-C included, the staging folder is removed and ``target`` is as it was:
    a failed or interrupted run leaves neither half a result nor a folder that blocks the next run.

    ``target`` is made absolute first: "." (an export run inside the bundle it replaces) had no name to stage beside,
    so its staging folder went inside it and the final rename of "." failed (EBUSY) after all the work. A symbolic
    link at ``target`` is kept, and the folder it leads to replaced (``through_links``)."""
    target = through_links(target)
    # Named before it is made, and made inside the try: a SIGTERM raised (stopping.raise_on_termination) just after
    # the folder was made, before the block was entered, left it behind.
    staging = staging_path(target)
    try:
        yield make_staging_directory(target)
        replace_directory(staging, target)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise_naming(exc, target, staging)
        raise


def _scratch_owner(folder: Path, prefix: str) -> int | None:
    """The process of this host that made a ``scratch_directory`` folder, from its name
    ``{prefix}{host}-{pid}-{random}``; None for another host's (its process ids are not ours to probe)."""
    host, _, pid = folder.name[len(prefix):].rpartition("-")[0].rpartition("-")
    return _number(pid) if host == socket.gethostname() else None


def remove_orphaned_scratch(prefix: str) -> list[Path]:
    """Remove the ``scratch_directory`` folders of ``prefix`` that processes of this host left when they were
    killed: a Ray actor at the end of an interrupted run, a worker the pool terminated, SIGKILL. None of those
    runs its cleanup, and each left a whole bundle copy or a stream's trace chunks in the temp folder. A folder
    of a process that still runs, or of another host sharing the folder, is left alone."""
    return _remove_orphans((folder, _scratch_owner(folder, prefix))
                           for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"))


def scratch_directory(prefix: str) -> Path:
    """A fresh private folder in the temp folder, named for this host and process so that the next one to ask
    for a ``prefix`` folder removes it if this process is killed before it removes it itself."""
    remove_orphaned_scratch(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{socket.gethostname()}-{os.getpid()}-"))


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """``scratch_directory`` for the length of a block, removed when it ends (or at the next one's start, if
    this process is killed inside it)."""
    folder = scratch_directory(prefix)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def parse_json(text: str | bytes, **options: Any) -> Any:
    """``json.loads``, with text nested deeper than Python's recursion limit (about a thousand levels) refused as
    ValueError, as any other text that is not JSON is. Python's json reads nesting by recursion, and the
    RecursionError it raised got past every reader's ``except ValueError``: a file of ten thousand ``[``s in a
    bundle, a queries file or a model config was a traceback where it should have been the one-line refusal."""
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise ValueError("nested deeper than the thousand or so levels Python reads") from None


# What numpy raises for a file that is not a whole .npz: not a zip (ValueError), one cut short (BadZipFile where
# its directory is gone, EOFError where an array is), a missing or mangled member (KeyError, IndexError), a member
# whose header claims more than memory holds (MemoryError: numpy allocates the shape the header says before it
# reads a byte, so 200 bytes claiming [10^6, 10^6] floats were "out of memory ... fewer streams (--batch)").
NPZ_READ_ERRORS = (OSError, ValueError, KeyError, IndexError, EOFError, zipfile.BadZipFile, MemoryError)


def npz_problem(exc: BaseException) -> str:
    """numpy's refusal of a file as an .npz, in words for a user. For a file that is no NumPy archive at all its own
    message speaks of pickled data and of loading it "unsafely", which no one should be told to do with a file
    that is not what they meant to give."""
    if isinstance(exc, ValueError) and "pickle" in str(exc):
        return "not a NumPy .npz archive"
    if isinstance(exc, (EOFError, zipfile.BadZipFile)):
        return f"cut short: {exc}" if str(exc) else "cut short"
    if isinstance(exc, MemoryError):  # numpy's words: "Unable to allocate 3.64 TiB for an array with shape ..."
        return f"an array in it claims more memory than this machine has: {exc}"
    return str(exc)
