"""Stepping a single-step graph with ONNX Runtime, the state carried by name.

The graph's own metadata (``metadata_props[METADATA_KEY]``) says what its
state is, so a bare .onnx is enough: the initial state comes from the spec
the graph carries, never from guesses about its inputs.

Two ways to step. On the CPU, plain ``session.run`` with numpy state. On a GPU
(and on the CPU when asked, which is how it is tested without a GPU) the state
never leaves the device: ``bound_step.DeviceBuffers`` allocates the frame, the
outputs and two complete state sets once, binds them in two IOBindings made once
(A reads set 0 and writes set 1, B the reverse) and alternates them; optionally
each binding is replayed as a CUDA graph. Nothing is allocated or copied per
frame but the frame going in and the embedding coming out.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from sdqes_edge.contract import EMBEDDING_OUTPUT, FP16, FRAME_INPUT, INT8, LOGITS_OUTPUT, METADATA_KEY, QUERY_INPUT
from sdqes_edge.errors import SetupWarning, UserError
from sdqes_edge.files import parse_json
from sdqes_edge.package_builds import require_provider
from sdqes_edge.state import StateSpec

from .backend import STATE_BUFFER_SETS, State, StepResult, check_state_arrays
from .bound_step import BoundState, DeviceBuffers, runs_to_steady
from .fused_ops import MissingKernelsWarning, idle_library_words, load_fused_ops, missing_kernels_words
from .ort_releases import fused_operators_warning
from .ort_sessions import DEVICE_PROVIDERS, check_providers, create_session

__all__ = ["OnnxRuntimeStep", "BoundState", "DeviceBuffers", "State", "StepResult"]


class SlowPrecisionWarning(RuntimeWarning):
    """The step graph asked for runs slower on this ONNX Runtime provider than the fp32 graph would
    (``warnings.simplefilter("error", SlowPrecisionWarning)`` makes it an error)."""


def slow_precision_words(precision: str, device: str, bundle: str | Path) -> str | None:
    """Why ``precision``'s graph is the wrong one for ``device``'s provider, and which to use; None where it fits."""
    if device == "cuda" and precision == INT8:
        return ("the int8 graph (QDQ) is a CPU and TensorRT format: ONNX Runtime's CUDA build has only QuantizeLinear, "
                "DequantizeLinear and MatMulInteger, so it runs float products between them, slower than fp32; on this "
                "GPU use the fp16 graph, or run int8 through TensorRT (ONNX Runtime's tensorrt device, or an engine "
                "from `sdqes-edge build-engine`)")
    if device == "cpu" and precision == FP16:
        return ("the fp16 graph is a GPU format: ONNX Runtime's CPU provider has no fp16 kernel for most of its "
                "operators and runs them in float32 between Casts it adds, no faster than fp32 (`sdqes-edge inspect "
                f"{bundle} --precision fp16` counts them); on a CPU use fp32 or int8")
    return None


class OnnxRuntimeStep:
    """One step graph in an ``onnxruntime.InferenceSession``.

    ``device`` "cpu", "cuda" or "tensorrt" (execution providers, checked after the session is made: a
    provider ONNX Runtime could not create is named, never silently replaced). ``io_binding`` (default: on
    for a GPU) keeps the state in device buffers bound once; ``cuda_graph`` (default: on for "cuda")
    replays each binding as a CUDA graph. ``spin_wait``: ONNX Runtime's worker threads busy-wait between
    runs (ORT's own default); off here, as in every session of the project (``session_options`` says why).
    ``fused_ops``: the path of this project's kernel library (runtime/fused_ops.py), registered in the session.
    """

    def __init__(self, path: str | Path, device: str = "cpu", threads: int | None = None,
                 io_binding: bool | None = None, cuda_graph: bool | None = None, spin_wait: bool = False,
                 fused_ops: str | Path | None = None):
        if device not in DEVICE_PROVIDERS:
            raise UserError(f"ONNX Runtime device {device!r} is not one of {', '.join(DEVICE_PROVIDERS)}")
        ort = require_provider(DEVICE_PROVIDERS[device][0])
        self.device, self.io_binding = device, (device != "cpu" if io_binding is None else io_binding)
        self.cuda_graph = (device == "cuda") if cuda_graph is None else cuda_graph
        if self.cuda_graph and device != "cuda":
            raise UserError("CUDA graphs are replayed by the CUDA execution provider: use --ort-device cuda")
        if self.cuda_graph and not self.io_binding:
            raise UserError("a CUDA graph replays fixed device buffers: it needs io_binding")
        self._ort_device, self._ort = ("cpu" if device == "cpu" else "cuda"), ort
        if not (path := Path(path)).is_file():
            raise UserError(f"step graph {path} does not exist; export a bundle with `sdqes-edge export`")
        self.path, self.fused_ops = path, load_fused_ops(fused_ops) if fused_ops else None
        self.session, self.cuda_graph = create_session(path, device, threads, self.cuda_graph, spin_wait,
                                                       self.fused_ops)
        self.providers = self.session.get_providers()
        check_providers(device, self.providers)
        meta = self.session.get_modelmeta().custom_metadata_map
        if METADATA_KEY not in meta:
            raise UserError(f"{path} carries no {METADATA_KEY!r} description, so it was not made by "
                            "`sdqes-edge export`; re-export it")
        try:
            self.description: dict[str, Any] = parse_json(meta[METADATA_KEY])
        except ValueError as exc:
            raise UserError(f"{path}'s {METADATA_KEY!r} description is not valid JSON ({exc}); re-export it") from None
        if not isinstance(self.description, dict) or not isinstance(self.description.get("state"), list):
            raise UserError(f"{path}'s {METADATA_KEY!r} description is not the one `sdqes-edge export` writes; "
                            "re-export it")
        operators = self.description.get("operators")
        if warning := (fused_operators_warning(device, operators, path.name)  # (the three exclude each other)
                       or idle_library_words(self.fused_ops, operators, path.name)):
            warnings.warn(warning, SetupWarning, stacklevel=2)
        elif missing := missing_kernels_words(self.fused_ops, self.description.get("fused_ops"), path.name):
            warnings.warn(missing, MissingKernelsWarning, stacklevel=2)
        self.spec = StateSpec.from_list(self.description["state"])
        self._output_names = [o.name for o in self.session.get_outputs()]
        self._input_names = {i.name for i in self.session.get_inputs()}
        missing = [t.input_name for t in self.spec if t.input_name not in self._input_names]
        missing += [t.output_name for t in self.spec if t.output_name not in self._output_names]
        if missing:
            raise UserError(f"{path} lacks state tensors its description lists ({', '.join(missing[:3])}); "
                            "re-export it")
        self.graph_shapes = _graph_shapes(self.session, self.spec, path)
        # (name, input, output, graph shape, spec shape) per state tensor, worked out once: the step reads these.
        self._state_io = [(t.name, t.input_name, t.output_name, self.graph_shapes[t.name], t.shape)
                          for t in self.spec]
        self.buffers = (DeviceBuffers(self.session, self.spec, self.graph_shapes, self._ort_device, self.cuda_graph)
                        if self.io_binding else None)

    @property
    def fused_queries(self) -> bool:
        return QUERY_INPUT in self._input_names

    @property
    def warm_up_steps(self) -> int:
        """Steps that carry one-off work: the first (memory arenas, cuDNN's algorithm search); bound, each
        binding's first; with CUDA graphs, each binding's uncaptured runs and then its capture."""
        if not self.io_binding:
            return 1
        return STATE_BUFFER_SETS * runs_to_steady(self.cuda_graph)

    def _initial_host(self) -> State:
        return dict(zip(self.spec.names, self.spec.initial_numpy()))

    def initial_state(self):
        return self.state_from_numpy(self._initial_host())

    # State operations every backend provides, so the detector never reaches into a backend's state
    # (with I/O binding it is a handle on one of the two device buffer sets; the TensorRT backend has its own).
    @property
    def frame_buffer(self) -> np.ndarray | None:
        """The host buffer the bound step uploads its frame from (page-locked on a GPU); None unbound."""
        return self.buffers.host_frame if self.buffers is not None else None

    def state_to_numpy(self, state) -> State:
        if self.buffers is not None:
            return self.buffers.read(state)
        return {name: np.array(value, copy=True) for name, value in state.items()}

    def state_from_numpy(self, arrays: State):
        check_state_arrays(self.spec, arrays)
        host = {t.name: np.ascontiguousarray(arrays[t.name], dtype=t.dtype) for t in self.spec}
        if self.buffers is not None:
            return self.buffers.write(host)
        return host

    def keep_streams(self, new, old, streams: list[int]):
        """``new`` with the rows (streams) in ``streams`` taken from ``old``: an idle stream keeps its state."""
        if self.buffers is not None:
            return self.buffers.keep_rows(new, old, streams)
        for name in new:  # host arrays this backend owns: copy the rows in place
            new[name][streams] = old[name][streams]
        return new

    def reset_streams(self, state, streams: list[int] | None = None):
        if streams is None:
            return self.initial_state()
        initial = self._initial_host()
        if self.buffers is not None:
            return self.buffers.set_rows(state, initial, streams)
        for name in state:
            state[name][streams] = initial[name][streams]
        return state

    def step(self, frame: np.ndarray, state, query_embeddings: np.ndarray | None = None) -> StepResult:
        """frame [B, 3, R, R] float32 (normalized) -> embedding, next state (and logits if fused)."""
        if self.fused_queries and query_embeddings is None:
            raise UserError(f"{self.path.name} scores queries inside the graph: pass query_embeddings "
                            f"[{self.description['query_count']}, {self.description['embed_dim']}]")
        if self.buffers is not None:
            return self.buffers.step(frame, state, query_embeddings)
        feeds = {FRAME_INPUT: np.ascontiguousarray(frame, dtype=np.float32)}
        for name, graph_input, _, graph_shape, _ in self._state_io:  # the spec's shape as the graph's (a view)
            feeds[graph_input] = state[name].reshape(graph_shape)
        if self.fused_queries:
            feeds[QUERY_INPUT] = np.ascontiguousarray(query_embeddings, dtype=np.float32)
        outputs = dict(zip(self._output_names, self.session.run(self._output_names, feeds)))
        next_state = {name: outputs[graph_output].reshape(shape) for name, _, graph_output, _, shape in self._state_io}
        return StepResult(outputs[EMBEDDING_OUTPUT], next_state, outputs.get(LOGITS_OUTPUT))


def _graph_shapes(session, spec: StateSpec, path: Path) -> dict[str, tuple[int, ...]]:
    """Each state tensor's shape at the graph's boundary: its ``graph_shape`` (streams and tokens merged), or
    the spec's own shape in a graph exported before that layout; the same bytes either way."""
    declared = {i.name: i.shape for i in session.get_inputs()}
    shapes = {}
    for t in spec:
        shape = tuple(declared[t.input_name])
        if shape not in t.boundary_shapes:
            raise UserError(f"{path} takes {t.input_name} as {list(shape)}, but its description says {list(t.shape)}; "
                            "re-export it")
        shapes[t.name] = shape
    return shapes
