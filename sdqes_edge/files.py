"""File helpers shared by the exporter and the runtime (torch-free)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


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


def staging_directory(target: Path) -> Path:
    """A fresh directory beside ``target`` (same file system, so the final rename is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.staging-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


def replace_directory(staging: Path, target: Path) -> None:
    """Move a finished ``staging`` directory to ``target``, replacing what was there.

    The old directory is first renamed aside, so at every moment either the old
    or the new one is complete at ``target``'s path (never a half-written mix).
    """
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
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
