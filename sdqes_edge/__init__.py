"""sdqes-edge: streaming detection of queried event start, from checkpoint to device.

Importing this package does not import torch: the configuration, state spec
and tokenizer are torch-free so the runtime can use them on a device. The
torch model lives in ``sdqes_edge.model``.
"""

from .config import ADAPTER_KINDS, PRESETS, ModelConfig, preset
from .errors import UserError
from .state import StateSpec, StateTensorSpec

__version__ = "0.1.0"

__all__ = ["ADAPTER_KINDS", "PRESETS", "ModelConfig", "preset", "UserError", "StateSpec", "StateTensorSpec",
           "__version__"]
