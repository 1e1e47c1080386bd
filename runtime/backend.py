"""What the detector needs from a backend, declared once: ``StepBackend``.

A backend steps one graph (ONNX Runtime: ``onnxruntime_backend.OnnxRuntimeStep``; TensorRT:
``tensorrt_backend.TensorRTStep``) and owns its state's representation: numpy arrays on the host, or a
handle on one of two device buffer sets. The detector only passes the handle back, and converts through
``state_to_numpy``/``state_from_numpy`` when it saves, restores or inspects the state.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Protocol, runtime_checkable

import numpy as np

from sdqes_edge.errors import SetupWarning, UserError
from sdqes_edge.state import StateSpec

from .bundle import Bundle

# What ``--backend`` names: ONNX Runtime (the default) and TensorRT.
BACKENDS = ("ort", "trt")

# State tensor name (as in the spec, no prefix) -> array, batch on axis 0. typing's Dict: an alias is evaluated at
# import, and Python 3.8 (JetPack 5) has no dict[...] there.
State = Dict[str, np.ndarray]

# A device backend's state buffer sets: a step reads one and writes the other (a state input and its output are
# never the same buffer), so steps alternate between two bindings, each captured once as a CUDA graph.
STATE_BUFFER_SETS = 2


@dataclass(frozen=True)
class BoundState:
    """A device backend's state handle: which of its two buffer sets holds the state, and since which step."""
    buffer_set: int
    generation: int


class BufferSetLedger:
    """Which step's state each of a device backend's two buffer sets holds, so that a handle on a set that has
    been written since (two steps old, or from before a load) is refused, never read as if it were current."""

    def __init__(self):
        self.generation = [0, -1]  # the step whose state each set holds (-1: nothing valid yet)

    def current(self, state: BoundState) -> int:
        """The buffer set ``state`` names, if it still holds that state."""
        if not isinstance(state, BoundState) or self.generation[state.buffer_set] != state.generation:
            raise UserError("this state handle is stale: a bound step keeps only the latest state (and the one "
                            "before it); step from the state the last step returned, or save it with "
                            "state_to_numpy first")
        return state.buffer_set

    def loaded(self) -> BoundState:
        """A state was written into set 0 (the initial state, or one loaded): every older handle goes stale."""
        self.generation = [max(self.generation) + 1, -1]
        return BoundState(0, self.generation[0])

    def stepped(self, read_set: int) -> BoundState:
        """A step read ``read_set`` and wrote the other set: the handle on what it wrote."""
        written = 1 - read_set
        self.generation[written] = self.generation[read_set] + 1
        return BoundState(written, self.generation[written])


@dataclass
class StepResult:
    embedding: np.ndarray  # [B, E], L2-normalized
    state: Any  # the next state, in the backend's representation
    logits: np.ndarray | None = None  # [B, Q] when query scoring is fused into the graph


@runtime_checkable
class StepBackend(Protocol):
    spec: StateSpec  # the state the graph carries, in graph order
    fused_queries: bool  # the graph scores a fixed query set itself (query_embeddings in, logits out)
    warm_up_steps: int  # steps before it runs at its steady speed (each binding used, each CUDA graph captured)

    def initial_state(self) -> Any:
        """Every stream's state at its initial value."""

    def step(self, frame: np.ndarray, state: Any, query_embeddings: np.ndarray | None = None) -> StepResult:
        """frame [B, 3, R, R] float32 (normalized) and the current state -> embedding and the next state."""

    def state_to_numpy(self, state: Any) -> State:
        """A host copy of ``state``, by name."""

    def state_from_numpy(self, arrays: State) -> Any:
        """``arrays`` (by name, as ``state_to_numpy`` gives) loaded as the current state."""

    def keep_streams(self, new: Any, old: Any, streams: list[int]) -> Any:
        """``new`` with the rows of ``streams`` taken from ``old``: an idle stream keeps its state."""

    def reset_streams(self, state: Any, streams: list[int] | None = None) -> Any:
        """The rows of ``streams`` (all when None) back to their initial value."""


def frame_batch_buffer(backend: StepBackend, shape: tuple[int, ...]) -> np.ndarray:
    """Where to assemble a batch of ``shape`` frames for ``backend``: the buffer it uploads from, where it has one
    (``frame_buffer``: the bound ONNX Runtime step's page-locked frame), else a new one. A batch assembled in the
    backend's own buffer and passed to ``step`` as it is is not copied again: at 32 streams of 224 px that copy
    is 19 MB a step (1.5 ms on one core of a 2-core Xeon), beside a GPU step of about 13 ms."""
    buffer = getattr(backend, "frame_buffer", None)
    if buffer is not None and buffer.shape == tuple(shape) and buffer.dtype == np.float32:
        return buffer
    return np.zeros(shape, np.float32)


def check_state_arrays(spec: StateSpec, arrays: State) -> None:
    """Refuse host arrays that are not the state ``spec`` describes, before a backend loads them: a tensor missing
    was a KeyError, one of another shape failed in a reshape, or (TensorRT) was copied past its device buffer."""
    if not isinstance(arrays, dict):
        raise UserError(f"state_from_numpy takes the state tensors by name (a dict, as state_to_numpy returns "
                        f"them), not a {type(arrays).__name__}")
    for tensor in spec:
        if tensor.name not in arrays:
            raise UserError(f"state_from_numpy: no {tensor.name!r}; give every state tensor by name, as "
                            "state_to_numpy returns them")
        if tuple(np.shape(arrays[tensor.name])) != tuple(tensor.shape):
            raise UserError(f"state_from_numpy: {tensor.name} is {list(np.shape(arrays[tensor.name]))}, but this "
                            f"graph's is {list(tensor.shape)} (a state of another model or batch size?)")


def warm_up(backend: StepBackend, frame: np.ndarray, state: Any, query_embeddings: np.ndarray | None = None) -> Any:
    """Step ``frame`` from ``state`` ``backend.warm_up_steps`` times -> the state after: the one-off work of the
    first steps (arenas, each binding's first use, CUDA graph capture) done before anything is streamed or timed.
    ``query_embeddings``: what a graph that scores its queries (``fused_queries``) takes with each frame."""
    for _ in range(backend.warm_up_steps):
        state = backend.step(frame, state, query_embeddings).state
    return state


# The detector's options that choose how it makes its text encoder; the others choose its backend.
TEXT_ENCODER_OPTIONS = ("truncate_queries",)


def check_parts_from(bundle: Bundle, backend: StepBackend | None, text_graph: Path | None,
                     options: dict[str, tuple]) -> None:
    """Refuse a backend or a text encoder loaded from another bundle and handed to a detector of ``bundle`` (to load
    the graphs once for many streams): another export's graphs of the same shapes would run the other weights
    silently, and other shapes failed deep inside ONNX Runtime. ``text_graph``: the text encoder's graph.

    ``options``: the detector's options that choose how it makes a backend or a text encoder itself, name ->
    (value, default); given one made already, those not at their default are ignored, which a warning says
    (precision="fp16" beside an fp32 backend ran fp32 without a word)."""
    ignored = [f"{name}={value!r}" for name, (value, default) in options.items() if value != default
               and (text_graph if name in TEXT_ENCODER_OPTIONS else backend) is not None]
    if ignored:
        warnings.warn(f"{', '.join(ignored)} ignored: the detector was given its backend_instance or text_encoder "
                      "already made; choose them where you make those (make_backend(bundle, ...), "
                      "text_encoder_for(bundle, ...))", SetupWarning, stacklevel=3)  # at StreamingDetector(...)
    fix = f"make it from this bundle ({bundle.root}): "
    if backend is not None:
        own = [(t.name, tuple(t.shape)) for t in bundle.state_spec]
        if [(t.name, tuple(t.shape)) for t in backend.spec] != own:
            raise UserError(f"backend_instance carries another state than this bundle's (another model or batch "
                            f"size); {fix}make_backend(bundle, ...)")
        graph = getattr(backend, "path", None)  # the graph an ONNX Runtime step runs
        steps = [entry["file"] for entry in bundle.manifest["graphs"]["step"].values()]
        if graph is not None and not bundle.holds(graph, steps):
            raise UserError(f"backend_instance runs {graph}, which is none of this bundle's step graphs; "
                            f"{fix}make_backend(bundle, ...)")
    if text_graph is not None and not bundle.holds(text_graph, [bundle.manifest["graphs"]["text"]["file"]]):
        raise UserError(f"text_encoder runs {text_graph}, which is not this bundle's text graph; "
                        f"{fix}text_encoder_for(bundle)")
