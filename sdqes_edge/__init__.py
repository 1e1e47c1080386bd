"""sdqes-edge: streaming detection of queried event start, from checkpoint to device.

Importing this package does not import torch: the configuration, state spec
and tokenizer are torch-free so the runtime can use them on a device. The
torch model lives in ``sdqes_edge.model``.
"""

from __future__ import annotations

from .config import ADAPTER_KINDS, PRESETS, ModelConfig, preset
from .errors import UserError

__version__ = "0.1.0"


def __getattr__(name: str):
    """The state spec on first use: it needs numpy, which the command line's start-up does without (a Ctrl-C
    there is caught only once the entry point runs)."""
    if name in ("StateSpec", "StateTensorSpec"):
        from . import state

        return getattr(state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["ADAPTER_KINDS", "PRESETS", "ModelConfig", "preset", "UserError", "StateSpec", "StateTensorSpec",
           "__version__"]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
