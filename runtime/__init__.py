"""sdqes_edge.runtime: the torch-free side that runs on the robot or headset.

Imports only numpy-level code: the state spec a bundle describes and the CLIP
tokenizer for encoding new queries on the device. Never imports torch (a test
runs this import in an interpreter where torch cannot be imported).
"""

from ..state import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX, StateSpec, StateTensorSpec
from ..tokenizer import ClipTokenizer, default_tokenizer

__all__ = ["STATE_INPUT_PREFIX", "STATE_OUTPUT_PREFIX", "StateSpec", "StateTensorSpec", "ClipTokenizer",
           "default_tokenizer"]
