"""The bound step: ONNX Runtime's state kept in device buffers allocated once, never leaving the device.

``DeviceBuffers`` allocates the frame, the outputs and two complete state sets once, binds them in two
IOBindings made once (A reads set 0 and writes set 1, B the reverse) and alternates them; with CUDA graphs
each binding is captured once and replayed. Nothing is allocated or copied per frame but the frame going in
(from page-locked host memory where the CUDA runtime can be reached) and the embedding coming out.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from sdqes_edge.contract import EMBEDDING_OUTPUT, FRAME_INPUT, LOGITS_OUTPUT, QUERY_INPUT
from sdqes_edge.errors import UserError
from sdqes_edge.state import StateSpec

from .backend import STATE_BUFFER_SETS, State, StepResult

__all__ = ["BoundState", "DeviceBuffers", "host_copy", "pin_host_memory", "runs_to_steady"]

# ONNX Runtime's CUDA provider runs a graph id this many times uncaptured (so its memory arena is grown), then
# captures it on the next run (``min_num_runs_before_cuda_graph_capture_``: 1 in old releases, 2 in current ones).
ORT_RUNS_BEFORE_CAPTURE = 2


def runs_to_steady(cuda_graph: bool) -> int:
    """Runs of one binding before it steps at its steady speed: its first; with CUDA graphs, ONNX Runtime's
    uncaptured runs and then the capture."""
    return ORT_RUNS_BEFORE_CAPTURE + 1 if cuda_graph else 1


@dataclass(frozen=True)
class BoundState:
    """The current state of a bound step: which of the two buffer sets holds it, and since which step."""
    buffer_set: int
    generation: int


class DeviceBuffers:
    """Everything a bound step touches, allocated once: the frame, the outputs, two state sets.

    Binding ``k`` reads state set ``k`` and writes set ``1 - k`` (a state input and its output are never
    the same buffer); steps alternate the bindings. With ``cuda_graph`` each binding is captured as its own
    CUDA graph (run option ``gpu_graph_id``) once ONNX Runtime has run it ``ORT_RUNS_BEFORE_CAPTURE`` times
    uncaptured, and replayed after.
    """

    def __init__(self, session: Any, spec: StateSpec, graph_shapes: dict[str, tuple[int, ...]], device: str,
                 cuda_graph: bool):
        """``session``: an ``onnxruntime.InferenceSession`` of a step graph; ``graph_shapes``: each state tensor's
        shape at its boundary; ``device``: where the buffers live ("cpu" or "cuda")."""
        import onnxruntime as ort

        self.session = session
        self.spec = spec
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = {o.name: o for o in session.get_outputs()}

        def allocate(shape, dtype="float32"):
            return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.dtype(dtype).type, device, 0)

        # The host side of the frame: page-locked where the CUDA runtime can be reached, so the upload is a DMA.
        self.host_frame = np.zeros(inputs[FRAME_INPUT].shape, np.float32)
        self.pinned = device == "cuda" and pin_host_memory(self, self.host_frame)
        self.frame = allocate(inputs[FRAME_INPUT].shape)
        self.queries = allocate(inputs[QUERY_INPUT].shape) if QUERY_INPUT in inputs else None
        self.outputs = {name: allocate(outputs[name].shape) for name in (EMBEDDING_OUTPUT, LOGITS_OUTPUT)
                        if name in outputs}
        # Filled by ``write`` (initial_state, load) and by the steps; a set is read only while its generation
        # says it holds a state.
        self.shapes = {t.name: t.shape for t in self.spec}  # the spec's; the buffers have the graph's
        self.sets = [{t.name: allocate(graph_shapes[t.name], t.dtype) for t in self.spec}
                     for _ in range(STATE_BUFFER_SETS)]
        self.bindings = [self._bind(k) for k in range(STATE_BUFFER_SETS)]
        self.run_options = []
        for k in range(STATE_BUFFER_SETS):
            options = ort.RunOptions()
            if cuda_graph:
                options.add_run_config_entry("gpu_graph_id", str(k + 1))  # one captured graph per binding
            self.run_options.append(options)
        self.generation = [0, -1]  # the step whose state each set holds (-1: nothing valid yet)

    def _bind(self, k: int):
        binding = self.session.io_binding()
        binding.bind_ortvalue_input(FRAME_INPUT, self.frame)
        if self.queries is not None:
            binding.bind_ortvalue_input(QUERY_INPUT, self.queries)
        for name, value in self.outputs.items():
            binding.bind_ortvalue_output(name, value)
        for t in self.spec:
            binding.bind_ortvalue_input(t.input_name, self.sets[k][t.name])
            binding.bind_ortvalue_output(t.output_name, self.sets[1 - k][t.name])
        return binding

    # --- the handle the detector carries --------------------------------------------------
    def _current(self, state: BoundState) -> int:
        if not isinstance(state, BoundState) or self.generation[state.buffer_set] != state.generation:
            raise UserError("this state handle is stale: a bound step keeps only the latest state (and the one "
                            "before it); step from the state the last step returned, or save it with "
                            "state_to_numpy first")
        return state.buffer_set

    def read(self, state: BoundState) -> State:
        k = self._current(state)
        return {name: host_copy(value).reshape(self.shapes[name]) for name, value in self.sets[k].items()}

    def write(self, host: State) -> BoundState:
        """Load host arrays as the current state (into set 0, which binding A reads)."""
        for name, value in host.items():
            self.sets[0][name].update_inplace(np.ascontiguousarray(value).reshape(self.sets[0][name].shape()))
        self.generation = [max(self.generation) + 1, -1]
        return BoundState(0, self.generation[0])

    def keep_rows(self, new: BoundState, old: BoundState, streams: list[int]) -> BoundState:
        return self.set_rows(new, self.read(old), streams)

    def set_rows(self, state: BoundState, source: State, streams: list[int]) -> BoundState:
        """Rows ``streams`` of the current state replaced by those of ``source`` (host arrays), in place."""
        k = self._current(state)
        for name, value in self.sets[k].items():
            rows = value.numpy().reshape(self.shapes[name])  # streams on axis 0 again
            rows[streams] = source[name][streams]
            value.update_inplace(np.ascontiguousarray(rows).reshape(value.shape()))
        return state

    def step(self, frame: np.ndarray, state: BoundState, query_embeddings: np.ndarray | None) -> StepResult:
        k = self._current(state)
        np.copyto(self.host_frame, frame, casting="same_kind")
        self.frame.update_inplace(self.host_frame)
        if self.queries is not None:
            self.queries.update_inplace(np.ascontiguousarray(query_embeddings, dtype=np.float32))
        self.session.run_with_iobinding(self.bindings[k], self.run_options[k])
        self.generation[1 - k] = self.generation[k] + 1
        embedding = host_copy(self.outputs[EMBEDDING_OUTPUT])
        logits = host_copy(self.outputs[LOGITS_OUTPUT]) if LOGITS_OUTPUT in self.outputs else None
        return StepResult(embedding, BoundState(1 - k, self.generation[1 - k]), logits)


def host_copy(value) -> np.ndarray:
    """A bound OrtValue's contents as an array the caller owns. ``numpy()`` copies a GPU buffer to the host,
    but of a CPU buffer it gives a view, which the next step (or a warm-up) would overwrite under the caller."""
    array = value.numpy()
    return array if array.flags.owndata else array.copy()


CUDA_RUNTIME_LIBRARIES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


def pin_host_memory(owner: object, array: np.ndarray) -> bool:
    """Page-lock ``array`` with the CUDA runtime (cudaHostRegister) for as long as ``owner`` lives, so copies
    from it are DMA transfers.

    ONNX Runtime's Python API has no pinned host allocator; the CUDA runtime it loads has one. Returns False
    (the upload then goes through pageable memory: correct, slower) where no CUDA runtime can be loaded.
    """
    names = [n for n in (ctypes.util.find_library("cudart"),) if n] + list(CUDA_RUNTIME_LIBRARIES)
    for name in names:
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        pointer = ctypes.c_void_p(array.ctypes.data)
        if cudart.cudaHostRegister(pointer, ctypes.c_size_t(array.nbytes), 0) != 0:
            return False
        weakref.finalize(owner, cudart.cudaHostUnregister, pointer)
        return True
    return False
