"""What the device side uses that Python 3.8 lacks, in one place.

JetPack 5, the last JetPack for a Jetson Xavier (TensorRT 8.5), ships Python 3.8, and NVIDIA's onnxruntime-gpu and
TensorRT wheels for it are built for that Python alone, so the runtime, and everything a device runs, keeps to
Python 3.8 (``tests/test_device_python.py`` holds it there; the workstation side is tested on CI's Python, 3.11).
"""

from __future__ import annotations

import sys
from concurrent.futures import Executor

__all__ = ["packages_distributions", "shutdown_cancelling"]


def packages_distributions() -> dict[str, list[str]]:
    """``importlib.metadata.packages_distributions()`` (Python 3.10 and newer; before, from the importlib-metadata
    backport pyproject.toml brings there): {import folder: distributions that installed it}."""
    if sys.version_info >= (3, 10):
        from importlib import metadata
    else:
        import importlib_metadata as metadata
    return metadata.packages_distributions()


def shutdown_cancelling(pool: Executor, wait: bool) -> None:
    """``pool.shutdown`` with the work not yet started cancelled (``cancel_futures``, Python 3.9 and newer). On 3.8
    that work still runs, once: at most the few frames a source had queued, and nothing where the pool's workers
    were ended first."""
    if sys.version_info >= (3, 9):
        pool.shutdown(wait=wait, cancel_futures=True)
    else:
        pool.shutdown(wait=wait)
