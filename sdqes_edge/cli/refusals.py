"""What the command line says of an OSError that is not a bug of ours: a write the machine refused (a full disk, a
disk gone read-only) or a path the system refused for its form (a name too long), each in one line with what to do."""

from __future__ import annotations

import errno

from sdqes_edge.errors import UserError
from sdqes_edge.path_checks import path_form_words

# A full disk (or quota) is the machine's state, not a bug: one line, like every refusal, with what to do.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def machine_refusal_words(exc: OSError) -> str | None:
    """What to say of a write the machine refused (a full disk, a file past its file system's largest, a disk gone
    read-only or failing, permissions taken away after the up-front checks: the machine's state, not a bug of
    ours), or None for any other OSError."""
    where = f" writing {exc.filename}" if exc.filename else ""
    if exc.errno in DISK_FULL_ERRNOS:
        return f"the disk is full{where} ({exc.strerror}); free some space or write to another disk, and run again"
    if exc.errno == errno.EFBIG:  # an SD card's FAT32 holds 4 GiB a file; `ulimit -f` caps a shell's files
        return (f"a file grew past the largest its file system or this process allows{where} ({exc.strerror}: "
                "FAT32 holds 4 GiB a file, and `ulimit -f` may set a limit); write to a disk whose file system holds "
                "larger files (ext4, exFAT), or raise the limit, and run again")
    if exc.errno == errno.EROFS:  # an SD card or eMMC the kernel remounted read-only after errors
        return (f"the disk is read-only{where} ({exc.strerror}: the kernel remounts a failing SD card or eMMC "
                "read-only, see `dmesg`); write to another disk, or mount it writable, and run again")
    if exc.errno in (errno.EACCES, errno.EPERM) and exc.filename:  # paths are checked up front: changed since
        return (f"{exc.filename}: {exc.strerror}, where the command's checks found it usable (were its permissions "
                "changed while it ran?); give a path this user may use, and run again")
    if exc.errno == errno.EIO:
        return (f"the disk failed{where} ({exc.strerror}: see `dmesg`; an SD card wears out); check it or write to "
                "another disk, and run again")
    return None


def refusal_words(exc: OSError) -> tuple[str, int] | None:
    """(what to say, the exit status) of an OSError that is the machine's state (1: a service manager starts the
    command again) or a path the user gave that reaches nothing (2, a mistake's: one a check up front did not
    reach, --resume's); None for any other, a bug of ours whose traceback a report needs."""
    words = machine_refusal_words(exc)
    if words is not None:
        return words, 1
    words = path_form_words(exc, exc.filename) if exc.filename else None
    return None if words is None else (words, UserError.exit_code)
