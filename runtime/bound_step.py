"""The bound step: ONNX Runtime's state kept in device buffers allocated once, never leaving the device.

``DeviceBuffers`` allocates the frame, the outputs and two complete state sets once, binds them in two
IOBindings made once (A reads set 0 and writes set 1, B the reverse) and alternates them; with CUDA graphs
each binding is captured once and replayed. Nothing is allocated or copied per frame but the frame going in
(from page-locked host memory where the CUDA runtime can be reached) and the embedding coming out. An idle
stream keeps its rows, and a reset stream gets fresh ones, by copying only those rows where the buffers live.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from sdqes_edge.contract import EMBEDDING_OUTPUT, FRAME_INPUT, LOGITS_OUTPUT, QUERY_INPUT
from sdqes_edge.package_builds import load_onnxruntime
from sdqes_edge.state import StateSpec

from .backend import STATE_BUFFER_SETS, BoundState, BufferSetLedger, State, StepResult

__all__ = ["BoundState", "DeviceBuffers", "RowCopier", "host_copy", "pin_host_memory", "runs_to_steady",
           "stream_runs"]

# ONNX Runtime's CUDA provider runs a graph id this many times uncaptured (so its memory arena is grown), then
# captures it on the next run (``min_num_runs_before_cuda_graph_capture_``: 1 in old releases, 2 in current ones).
ORT_RUNS_BEFORE_CAPTURE = 2


def runs_to_steady(cuda_graph: bool) -> int:
    """Runs of one binding before it steps at its steady speed: its first; with CUDA graphs, ONNX Runtime's
    uncaptured runs and then the capture."""
    return ORT_RUNS_BEFORE_CAPTURE + 1 if cuda_graph else 1


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
        ort = load_onnxruntime()
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
        # Filled by ``write`` (initial_state, load) and by the steps; a set is read only while the ledger says
        # it holds the state a handle names.
        self.shapes = {t.name: t.shape for t in self.spec}  # the spec's; the buffers have the graph's
        self.dtypes = {t.name: t.dtype for t in self.spec}
        self.stream_bytes = {t.name: t.nbytes // t.shape[0] for t in self.spec}  # streams on axis 0, contiguous
        self.sets = [{t.name: allocate(graph_shapes[t.name], t.dtype) for t in self.spec}
                     for _ in range(STATE_BUFFER_SETS)]
        self.bindings = [self._bind(k) for k in range(STATE_BUFFER_SETS)]
        self.run_options = []
        for k in range(STATE_BUFFER_SETS):
            options = ort.RunOptions()
            if cuda_graph:
                options.add_run_config_entry("gpu_graph_id", str(k + 1))  # one captured graph per binding
            self.run_options.append(options)
        self.ledger = BufferSetLedger()
        self.row_copier = RowCopier.for_device(device)  # None: rows go through the host (no CUDA runtime found)

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
    def read(self, state: BoundState) -> State:
        k = self.ledger.current(state)
        return {name: host_copy(value).reshape(self.shapes[name]) for name, value in self.sets[k].items()}

    def write(self, host: State) -> BoundState:
        """Load host arrays as the current state (into set 0, which binding A reads)."""
        for name, value in host.items():
            self.sets[0][name].update_inplace(np.ascontiguousarray(value).reshape(self.sets[0][name].shape()))
        return self.ledger.loaded()

    def keep_rows(self, new: BoundState, old: BoundState, streams: list[int]) -> BoundState:
        """Rows ``streams`` of the state ``new`` taken from ``old`` (the other set), copied where they live."""
        k_new, k_old = self.ledger.current(new), self.ledger.current(old)
        if self.row_copier is None:
            return self.set_rows(new, self.read(old), streams)
        for name, value in self.sets[k_new].items():
            self.row_copier.copy(value.data_ptr(), self.sets[k_old][name].data_ptr(), self.stream_bytes[name],
                                 streams)
        self.row_copier.finish()
        return new

    def set_rows(self, state: BoundState, source: State, streams: list[int]) -> BoundState:
        """Rows ``streams`` of the current state replaced by those of ``source`` (host arrays), in place."""
        k = self.ledger.current(state)
        host = {name: np.ascontiguousarray(source[name], dtype=self.dtypes[name]) for name in self.sets[k]}
        if self.row_copier is None:  # through the host: every tensor down, patched, and up again
            for name, value in self.sets[k].items():
                rows = value.numpy().reshape(self.shapes[name])  # streams on axis 0 again
                rows[streams] = host[name][streams]
                value.update_inplace(np.ascontiguousarray(rows).reshape(value.shape()))
            return state
        for name, value in self.sets[k].items():
            self.row_copier.copy(value.data_ptr(), host[name].ctypes.data, self.stream_bytes[name], streams)
        self.row_copier.finish()
        return state

    def step(self, frame: np.ndarray, state: BoundState, query_embeddings: np.ndarray | None) -> StepResult:
        k = self.ledger.current(state)
        if frame is not self.host_frame:  # a batch assembled in place (backend.frame_batch_buffer) is not copied
            np.copyto(self.host_frame, frame, casting="same_kind")
        self.frame.update_inplace(self.host_frame)
        if self.queries is not None:
            self.queries.update_inplace(np.ascontiguousarray(query_embeddings, dtype=np.float32))
        self.session.run_with_iobinding(self.bindings[k], self.run_options[k])
        next_state = self.ledger.stepped(k)
        embedding = host_copy(self.outputs[EMBEDDING_OUTPUT])
        logits = host_copy(self.outputs[LOGITS_OUTPUT]) if LOGITS_OUTPUT in self.outputs else None
        return StepResult(embedding, next_state, logits)


def host_copy(value) -> np.ndarray:
    """A bound OrtValue's contents as an array the caller owns. ``numpy()`` copies a GPU buffer to the host,
    but of a CPU buffer it gives a view, which the next step (or a warm-up) would overwrite under the caller."""
    array = value.numpy()
    return array if array.flags.owndata else array.copy()


def stream_runs(streams: list[int]) -> list[tuple[int, int]]:
    """Streams as runs of adjacent ones, (first, count), so that each run is one contiguous copy:
    [5, 1, 2] -> [(1, 2), (5, 1)]."""
    runs: list[tuple[int, int]] = []
    for s in sorted(set(streams)):
        if runs and runs[-1][0] + runs[-1][1] == s:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    return runs


class RowCopier:
    """Copies some streams' rows of a state tensor where the buffers live, touching nothing else.

    A state buffer holds its streams one after another (streams on axis 0, contiguous), so the rows of a run
    of adjacent streams are one byte range. On the CPU the copy is a memmove; on the GPU it is the CUDA
    runtime's cudaMemcpy (direction inferred from the addresses, which holds on every 64-bit CUDA platform),
    then one device synchronization, so the next step reads the copied rows. ONNX Runtime's Python API has no
    copy of part of a device buffer; the CUDA runtime it loads has one.
    """

    CUDA_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the kind inferred from the pointers (unified addressing)

    def __init__(self, memcpy, finish=None):
        self._memcpy = memcpy
        self._finish = finish

    @classmethod
    def for_device(cls, device: str) -> "RowCopier | None":
        """The copier for buffers on ``device`` ("cpu" or "cuda"); None on a GPU whose CUDA runtime cannot be
        loaded from Python (callers then move the rows through the host: correct, slower)."""
        if device == "cpu":
            return cls(ctypes.memmove)
        cudart = cuda_runtime()
        if cudart is None:
            return None
        cudart.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

        def memcpy(dst: int, src: int, nbytes: int) -> None:
            _check_cuda(cudart, cudart.cudaMemcpy(dst, src, nbytes, cls.CUDA_MEMCPY_DEFAULT), "cudaMemcpy")

        # cudaMemcpy between device buffers (or from pageable memory) may return before the copy lands.
        return cls(memcpy, lambda: _check_cuda(cudart, cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize"))

    def copy(self, destination: int, source: int, stream_bytes: int, streams: list[int]) -> None:
        """Rows ``streams`` of the buffer at address ``destination`` from the same rows of the buffer at
        ``source``; both hold their streams one after another, ``stream_bytes`` each."""
        for first, count in stream_runs(streams):
            offset = first * stream_bytes
            self._memcpy(destination + offset, source + offset, count * stream_bytes)

    def finish(self) -> None:
        """Returns once every copy has landed."""
        if self._finish is not None:
            self._finish()


def _check_cuda(cudart, code: int, call: str) -> None:
    if code != 0:
        cudart.cudaGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{call} failed: {cudart.cudaGetErrorString(code).decode()}")


CUDA_RUNTIME_LIBRARIES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


@functools.lru_cache(maxsize=None)
def cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library, or None: the one already loaded in this process (ONNX Runtime's CUDA provider
    loads its own when a session is made) before any other a search finds, so that the buffers ONNX Runtime
    allocated and the copies made here go through the same runtime."""
    names = loaded_library_paths("libcudart.so") + [n for n in (ctypes.util.find_library("cudart"),) if n]
    for name in names + list(CUDA_RUNTIME_LIBRARIES):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def loaded_library_paths(prefix: str) -> list[str]:
    """Paths of the shared libraries mapped into this process whose file name starts with ``prefix`` (Linux's
    /proc/self/maps; empty elsewhere)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = {fields[5] for fields in (line.split(maxsplit=5) for line in maps.splitlines()) if len(fields) == 6}
    return sorted(path for path in paths if Path(path).name.startswith(prefix))


def pin_host_memory(owner: object, array: np.ndarray) -> bool:
    """Page-lock ``array`` with the CUDA runtime (cudaHostRegister) for as long as ``owner`` lives, so copies
    from it are DMA transfers.

    ONNX Runtime's Python API has no pinned host allocator; the CUDA runtime it loads has one. Returns False
    (the upload then goes through pageable memory: correct, slower) where no CUDA runtime can be loaded.
    """
    cudart = cuda_runtime()
    if cudart is None:
        return False
    pointer = ctypes.c_void_p(array.ctypes.data)
    if cudart.cudaHostRegister(pointer, ctypes.c_size_t(array.nbytes), 0) != 0:
        return False
    weakref.finalize(owner, cudart.cudaHostUnregister, pointer)
    return True
