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

import contextlib
import ctypes
import io
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from sdqes_edge.contract import EMBEDDING_OUTPUT, FP16, FRAME_INPUT, INT8, LOGITS_OUTPUT, METADATA_KEY, QUERY_INPUT
from sdqes_edge.errors import SetupWarning, UserError, first_line
from sdqes_edge.files import file_sha256, user_cache_dir
from sdqes_edge.package_builds import CUDA_PROVIDER, load_onnxruntime, require_provider, update_command
from sdqes_edge.state import StateSpec

from .backend import STATE_BUFFER_SETS, State, StepResult, check_state_arrays
from .bound_step import BoundState, DeviceBuffers, runs_to_steady
from .cores import checked_threads
from .fused_ops import FusedOps, idle_library_words, load_fused_ops, register_fused_ops
from .ort_releases import (
    CUDA_GRAPH_IDS_SINCE,
    MEM_PATTERN_FIXED_IN,
    cuda_options,
    fused_operators_warning,
    onnxruntime_release,
    session_keywords,
)

__all__ = ["OnnxRuntimeStep", "BoundState", "DeviceBuffers", "State", "StepResult", "create_session"]


TENSORRT_PROVIDER = "TensorrtExecutionProvider"
# Execution providers per device, best first; ONNX Runtime falls back along the list.
DEVICE_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": [CUDA_PROVIDER, "CPUExecutionProvider"],
    "tensorrt": [TENSORRT_PROVIDER, CUDA_PROVIDER, "CPUExecutionProvider"],
}


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
        _check_providers(device, self.providers)
        meta = self.session.get_modelmeta().custom_metadata_map
        if METADATA_KEY not in meta:
            raise UserError(f"{path} carries no {METADATA_KEY!r} description, so it was not made by "
                            "`sdqes-edge export`; re-export it")
        self.description: dict[str, Any] = json.loads(meta[METADATA_KEY])
        operators = self.description.get("operators")
        if warning := (fused_operators_warning(device, operators, path.name)  # (the two exclude each other)
                       or idle_library_words(self.fused_ops, operators, path.name)):
            warnings.warn(warning, SetupWarning, stacklevel=2)
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


# ONNX Runtime's session option for its worker threads' busy-waiting between runs ("1", its default, or "0").
SPIN_WAIT_OPTION = "session.intra_op.allow_spinning"


def session_options(threads: int | None = None, spin_wait: bool = False):
    """``onnxruntime.SessionOptions`` as every session of this project starts: the thread count checked
    (``cores.checked_threads``), ORT's own warnings quiet, and its workers' busy-waiting between runs off.

    Off by default because a session's idle workers keep spinning after its run and take the cores whatever
    runs next needs: the runtime's reader and preprocessing threads (the loop 1.3-1.4x slower on a 2-core
    CPU with spinning, tiny preset), another session, or the other candidates of an interleaved benchmark
    (PyTorch eager's tiny QRNN step took 57 ms between spinning sessions, 1.5 ms between quiet ones, 1.3 ms
    alone). Alone, the step was no faster with spinning (0.26 against 0.27 ms)."""
    ort = load_onnxruntime()

    options = ort.SessionOptions()
    threads = checked_threads(threads)
    if threads:
        options.intra_op_num_threads = threads
    if not spin_wait:
        options.add_session_config_entry(SPIN_WAIT_OPTION, "0")
    options.log_severity_level = 3  # ORT's warnings are about graph rewrites, not the user's input
    if onnxruntime_release(ort.__version__) < MEM_PATTERN_FIXED_IN:
        # ONNX Runtime 1.17 and 1.18 on the CPU return NaN from every run of an fp16 step graph after the first
        # when they reuse the first run's memory plan (mlp, qrnn and retnet tiny graphs; measured). Without the
        # plan the same graphs agree with 1.32 to 2e-4 over 20 frames; 1.19 is right with it. Off there for every
        # provider: the plan only saves allocations.
        options.enable_mem_pattern = False
    return options


def load_refusal(exc: BaseException, path: Path, what: str) -> UserError:
    """Why ONNX Runtime would not load the graph at ``path``, in one line. An operator or operator-set version
    this ONNX Runtime lacks means an old ONNX Runtime, not a damaged file, and says so."""
    ort = load_onnxruntime()

    words = first_line(exc)
    if "NOT_IMPLEMENTED" in words or "opset" in words.lower():
        return UserError(f"ONNX Runtime {ort.__version__} cannot run {path} ({words}): the graph needs a newer ONNX "
                         f"Runtime; update it ({update_command()}), or "
                         "re-export the bundle with this sdqes-edge, whose graphs run on ONNX Runtime 1.17 and newer")
    return UserError(f"ONNX Runtime cannot load {path} ({words}); the file is damaged or not {what}: re-export it")


def create_session(path: Path, device: str, threads: int | None = None, cuda_graph: bool = False,
                   spin_wait: bool = False, fused_ops: FusedOps | None = None):
    """An ``InferenceSession`` for ``path`` on ``device``'s providers -> (session, whether it replays CUDA graphs).

    ONNX Runtime refuses CUDA graph capture when making the session (a node left on the CPU, control flow),
    in words that have changed between releases; so a refused capture is found by making the session
    again without it, which then steps uncaptured with a one-line warning saying why.
    """
    ort = load_onnxruntime()

    if cuda_graph and onnxruntime_release(ort.__version__) < CUDA_GRAPH_IDS_SINCE:
        warnings.warn(f"ONNX Runtime {ort.__version__} replays one CUDA graph per session, and the step alternates "
                      "two bindings (one per state buffer set): stepping without CUDA graphs; ONNX Runtime "
                      f"{'.'.join(map(str, CUDA_GRAPH_IDS_SINCE))} and newer replay one per binding "
                      f"({update_command()})", SetupWarning, stacklevel=2)
        cuda_graph = False
    options = session_options(threads, spin_wait)
    if fused_ops is not None:
        register_fused_ops(options, fused_ops, device)
    cuda = (CUDA_PROVIDER, cuda_options(ort.__version__))
    providers: list = [cuda if p == CUDA_PROVIDER else p for p in DEVICE_PROVIDERS[device]]
    if device == "tensorrt":
        # No trt_fp16_enable/trt_int8_enable: without them ONNX Runtime (1.22 and newer) builds strongly typed
        # TensorRT networks, so each bundle graph runs in the precision it was exported and checked in.
        providers[0] = (TENSORRT_PROVIDER, tensorrt_cache_options(path))

    def make(capture: bool):
        chosen = [(CUDA_PROVIDER, {**cuda[1], "enable_cuda_graph": "1"}), *providers[1:]] if capture else providers
        with quiet_provider_fallback(ort, device):
            return ort.InferenceSession(str(path), options, providers=chosen, **session_keywords(device))

    return session_with_capture_fallback(make, cuda_graph, path)


def tensorrt_cache_options(path: Path) -> dict[str, str]:
    """ONNX Runtime's TensorRT provider options that keep its engines and timing cache on disk.

    The provider builds its TensorRT engines when the session is made (minutes for a ViT-B/16 on a Jetson);
    cached, they load in seconds. It names a cached engine after the graph's file name and structure, not its
    weights (every bundle of one architecture has the same step.fp32.onnx), so another bundle or a re-exported
    one could load a stale engine: the folder is keyed by the graph file's sha256. Where no
    cache folder can be made, engines are built every time, with a one-line warning."""
    folder = user_cache_dir() / "ort-tensorrt" / file_sha256(path)[:16]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        first_use = not any(folder.iterdir())
    except OSError as exc:
        warnings.warn(f"cannot make a TensorRT engine cache at {folder} ({exc.strerror or exc}); ONNX Runtime "
                      "builds the engines again every run (set XDG_CACHE_HOME to a writable folder)", SetupWarning,
                      stacklevel=2)
        return {}
    if first_use and provider_library_problem(TENSORRT_PROVIDER) is None:  # else no engine is built: it fails
        print(f"ONNX Runtime's TensorRT provider builds engines for {path.name} on first use (minutes); they are "
              f"kept in {folder}", file=sys.stderr)
    return {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(folder),
            "trt_timing_cache_enable": "True", "trt_timing_cache_path": str(folder)}


def session_with_capture_fallback(make, cuda_graph: bool, path: Path):
    """``make(capture)`` -> session; with ``cuda_graph``, a session made without capture when capture is refused."""
    if cuda_graph:
        try:
            return make(True), True
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            refusal = first_line(exc)
    try:
        session = make(False)
    except Exception as exc:  # a damaged file fails here too, captured or not
        raise load_refusal(exc, path, "a step graph") from None
    if cuda_graph:
        warnings.warn(f"ONNX Runtime refused CUDA graph capture for {path.name} ({refusal}); stepping without it",
                      SetupWarning, stacklevel=2)
    return session, False


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


@contextlib.contextmanager
def quiet_provider_fallback(ort, device: str) -> Iterator[None]:
    """ONNX Runtime's own words while it makes a GPU session, kept off the terminal: a provider it cannot create
    is logged in two coloured lines and, for TensorRT, a ten-line "EP Error" block printed to stdout (where
    `run` writes its alerts), all before the one line ``_check_providers`` says it in, with the library that
    is missing. ONNX Runtime has no getter for its default log level: it goes back to ORT's default after."""
    if device == "cpu":
        yield
        return
    ort.set_default_logger_severity(ORT_FATAL_ONLY)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        ort.set_default_logger_severity(ORT_DEFAULT_SEVERITY)


def provider_library_problem(provider: str, capi: Path | None = None) -> str | None:
    """Why the shared library of ``provider`` will not load ("libcublasLt.so.13: cannot open shared object
    file: ..."), found by loading it as ONNX Runtime does; None where it loads, or is not a Linux library."""
    if provider not in PROVIDER_LIBRARIES:
        return None
    capi = capi or Path(load_onnxruntime().__file__).parent / "capi"
    library = capi / f"libonnxruntime_providers_{PROVIDER_LIBRARIES[provider]}.so"
    if not library.is_file():
        return None
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return first_line(exc)
    return None


def _check_providers(device: str, assigned: list[str]) -> None:
    """Say what runs: ONNX Runtime silently drops a provider it cannot create (TensorRT without libnvinfer,
    CUDA without its libraries) and runs the next one on the list."""
    wanted = DEVICE_PROVIDERS[device][0]
    if assigned and assigned[0] == wanted:
        return
    problem = provider_library_problem(wanted)  # the library it names, where its own library will not load
    missing = f"its library will not load: {problem}" if problem else PROVIDER_NEEDS.get(wanted, wanted)
    if device == "tensorrt" and CUDA_PROVIDER in assigned:
        warnings.warn(f"ONNX Runtime could not create the TensorRT execution provider ({missing}); running on the "
                      "CUDA execution provider instead", SetupWarning, stacklevel=2)
        return
    # Named in words too: "libnvinfer.so.10: cannot open ..." alone does not say that TensorRT is what is missing.
    words = {CUDA_PROVIDER: "CUDA", TENSORRT_PROVIDER: "TensorRT"}.get(wanted, wanted)
    raise UserError(f"ONNX Runtime could not create the {words} execution provider, {wanted} ({missing}), and would "
                    f"run on {', '.join(assigned) or 'nothing'}; fix the installation or use --ort-device cpu")


# ONNX Runtime's log levels (0 verbose ... 4 fatal) and the one its default logger starts at.
ORT_FATAL_ONLY, ORT_DEFAULT_SEVERITY = 4, 2
# The shared library each GPU provider lives in: capi/libonnxruntime_providers_{name}.so.
PROVIDER_LIBRARIES = {CUDA_PROVIDER: "cuda", TENSORRT_PROVIDER: "tensorrt"}
PROVIDER_NEEDS = {
    TENSORRT_PROVIDER: "TensorRT's libraries, libnvinfer, are not loadable: install TensorRT",
    CUDA_PROVIDER: "the CUDA and cuDNN libraries onnxruntime-gpu was built for are not loadable",
}
