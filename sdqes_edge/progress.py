"""Progress bars where tqdm is installed: the export and eval extras bring it, a device with the runtime alone may
not have it, and then work goes on without a bar."""

from __future__ import annotations

import sys
from typing import Iterable


def progress_bar(total: int | None, unit: str, desc: str, enabled: bool = True, iterable: Iterable | None = None):
    """A tqdm bar on stderr (over ``iterable`` when given), or None where disabled, the total is unknown or tqdm
    is not installed."""
    if not enabled or total is None:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(iterable, total=total, unit=unit, desc=desc, leave=False, file=sys.stderr)
