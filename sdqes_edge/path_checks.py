"""What a path the user gives may be, checked up front: an output a run could not write (a folder, a read-only
place, links in a loop, a name too long) refused in one line before any work, and an input's problem in words."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import UserError
from .files import through_links


def as_path(path: object, what: str) -> Path:
    """``path`` (a str or an os.PathLike) as a Path; anything else refused naming ``what`` takes it ("save_state
    takes"), not Path's TypeError ("expected str, bytes or os.PathLike object, not int")."""
    if not isinstance(path, (str, os.PathLike)):
        raise UserError(f"{what} a path (a str or a pathlib.Path), not a {type(path).__name__}")
    return Path(path)


# The errors the system gives a path for its form, whatever is on disk: what each means, and what to do.
PATH_FORM_ERRORS = {
    errno.ENAMETOOLONG: ("has a name longer than its file system holds ({}: most hold 255 bytes a name)",
                         "give a shorter name"),
    errno.ELOOP: ("leads round a loop of symbolic links ({})", "give a path whose links end at a file or folder"),
    errno.ENOTDIR: ("passes through a file where a folder should be ({})", "give a path through folders"),
}


def path_form_problem(exc: OSError) -> str | None:
    """What the system refused in a path's form (a name too long, links that loop, a file where a folder should
    be), in words that finish a sentence naming the path; None for any other OSError. pathlib's ``exists`` and
    ``is_dir`` raise the first (a traceback for a user's mistake) where they answer False to the others."""
    if exc.errno not in PATH_FORM_ERRORS:
        return None
    return PATH_FORM_ERRORS[exc.errno][0].format(exc.strerror)


def path_form_words(exc: OSError, path: object) -> str | None:
    """``path_form_problem`` about ``path`` with what to do: one line of an error."""
    problem = path_form_problem(exc)
    return None if problem is None else f"{path} {problem}; {PATH_FORM_ERRORS[exc.errno][1]}"


@contextlib.contextmanager
def output_path_refused(flag: str, path: str | os.PathLike) -> Iterator[None]:
    """An output path the system refuses, met in the block by a check up front, refused as ``flag``'s in one line
    (exit 2): for its form (``path_form_problem``), or a folder on its way this user may not enter (pathlib's
    checks raise PermissionError there, which the command line's last net took for permissions changed mid-run)."""
    try:
        yield
    except PermissionError as exc:
        raise UserError(f"{flag} {path} cannot be written: this user may not enter {_closed_folder(path, exc)} "
                        f"({exc.strerror}); give a path in a folder this user may write") from None
    except OSError as exc:
        words = path_form_words(exc, f"{flag} {path}")
        if words is None:
            raise
        raise UserError(words) from None


def _closed_folder(path: str | os.PathLike, refusal: PermissionError) -> str:
    """The first folder on the way to ``path`` this user may not enter: what a PermissionError of pathlib's means."""
    return str(next((folder for folder in reversed(Path(path).absolute().parents) if not os.access(folder, os.X_OK)),
                    refusal.filename))


def unreadable_problem(path: str | os.PathLike, access: int = os.R_OK) -> str | None:
    """Why this user may not read ``path`` (a folder on the way it may not enter, or ``path`` itself not granted
    ``access``), in words that finish a sentence naming it; None where it may, or where nothing is there."""
    try:
        os.stat(path)
    except PermissionError as exc:
        return f"cannot be read: this user may not enter {_closed_folder(path, exc)} ({exc.strerror})"
    except OSError:
        return None
    return None if os.access(path, access) else "cannot be read: this user may not read it (Permission denied)"


def path_problem(path: str | os.PathLike, want: str) -> str | None:
    """Why ``path`` is not an existing ``want`` ("file" or "folder") this user may read, in words that finish a
    sentence naming it ("does not exist", "is a folder, not a file"), or None when it is one. A folder given for a
    file is told as such: "does not exist" about a path the user can see is wrong. One the user may not read (a
    service's user given what root keeps) is told so, where its reading raised PermissionError in a traceback."""
    path = Path(path)
    try:
        if (path.is_file() if want == "file" else path.is_dir()):  # and readable by this user (not one root keeps)
            return unreadable_problem(path, os.R_OK if want == "file" else os.R_OK | os.X_OK)
        _refuse_loops(path)  # which pathlib takes for nothing there: "does not exist" about a link the user can see
    except PermissionError:  # a service's user given what root keeps (a bundle under /root)
        return unreadable_problem(path)
    except OSError as exc:
        problem = path_form_problem(exc)
        if problem is None:
            raise
        return problem
    if not path.exists():
        return "does not exist"
    kind = "folder" if path.is_dir() else "file" if path.is_file() else "special file (a pipe or a device)"
    return f"is a {kind}, not a {want}"


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe_folder(folder: Path, flag: str, path: Path) -> None:
    """Create and delete a file in ``folder``: permissions, read-only mounts and /proc all answer the same way."""
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: {folder} is a file, not a folder; choose another path")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise UserError(f"{flag} {path} cannot be written: {folder} refuses new files ({exc.strerror}); choose a "
                        "folder you can write to") from None


TRACE_SUFFIX = ".npz"  # a score trace's (sdqes_edge/traces.py): a folder's traces are the files named so

# A name for each kind of output file: a folder given where one goes is refused with this name in it as the fix.
ALERT_LOG_EXAMPLE = "alerts.jsonl"
SNAPSHOT_EXAMPLE = "state.npz"
SCORE_TRACE_EXAMPLE = f"scores{TRACE_SUFFIX}"
ANNOTATED_VIDEO_EXAMPLE = "annotated.mp4"


def check_output_file(path: str | os.PathLike, flag: str, example: str) -> Path:
    """Refuse, before any work, an output file that cannot be written: a folder, a read-only place, /proc.
    ``example``: a name for such a file ('alerts.jsonl'), which a refused folder is advised to hold.

    Nothing is created or changed: an existing file is opened for appending and closed; for a new one, the
    nearest existing folder must accept a new file (missing folders below it are made when writing).
    """
    path = as_path(path, f"{flag} takes")
    with output_path_refused(flag, path):
        return _check_output_file(path, flag, example)


def _refuse_loops(path: Path) -> None:
    """Raise ELOOP for a path whose symbolic links lead round a loop, which pathlib's checks answer False (as if
    nothing were there: the write failed later, in a traceback)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet, or a file on the way: said below
        pass


def _check_output_file(path: Path, flag: str, example: str) -> Path:
    _refuse_loops(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder; give a file path in it (e.g. {path / example})")
    if path.exists():
        try:
            open(path, "ab").close()
        except OSError as exc:
            raise UserError(f"{flag} {path} cannot be written ({exc.strerror}); choose a path you can "
                            "write to") from None
        return path
    _probe_folder(_nearest_existing(through_links(path).parent), flag, path)  # a link's file: made where it leads
    return path


def check_output_dir(path: str | os.PathLike, flag: str) -> Path:
    """Refuse, before any work, an output folder that is a file or lies where nothing can be written."""
    path = as_path(path, f"{flag} takes")
    with output_path_refused(flag, path):
        _refuse_loops(path)
        if path.exists() and not path.is_dir():
            raise UserError(f"{flag} {path} is a file; give a folder (it is created if missing)")
        _probe_folder(_nearest_existing(through_links(path)), flag, path)
    return path


def check_trace_path(path: Path, stream_name: object, what: str) -> None:
    """A trace is a ``TRACE_SUFFIX`` file (a folder's traces are found by it: one named otherwise was never read by
    eval) of a stream named in text (what eval matches to the annotations' video)."""
    if path.suffix != TRACE_SUFFIX:
        raise UserError(f"{what} writes a {TRACE_SUFFIX} trace (eval reads a folder's *{TRACE_SUFFIX}), not "
                        f"{path.name}; give {path.with_suffix(TRACE_SUFFIX)}")
    if not isinstance(stream_name, str):
        raise UserError(f"{what}'s stream_name is text (the video eval matches it to), not {stream_name!r}")
