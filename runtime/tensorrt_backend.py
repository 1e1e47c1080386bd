"""Stepping a TensorRT engine (tensorrt + pycuda), the state kept on the GPU between frames.

Two sets of state buffers live on the device; each frame reads one set and
writes the other, then they swap, so a state input and its output are never
the same buffer (TensorRT does not allow in-place I/O). Only the frame goes in
and the embedding comes out per frame. Engines are specific to a GPU
architecture and a TensorRT version: the sidecar written by ``build-engine``
records both, and a mismatch is refused with the command that rebuilds it.

Every buffer is sized and typed from the engine's own description of its I/O
(``engine_bindings``), checked against the bundle's contract first: an fp16
engine built strongly typed (TensorRT 11) keeps its state in fp16, one built
from the fp32 graph in fp32, and a foreign engine is refused, never bound.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from sdqes_edge.contract import (
    EMBEDDING_OUTPUT,
    ENGINES_FOLDER,
    FP16,
    FRAME_INPUT,
    STATE_INPUT_PREFIX,
    STATE_OUTPUT_PREFIX,
    engine_name,
)
from sdqes_edge.errors import SetupWarning, UserError, first_line, install_command
from sdqes_edge.files import parse_json

from .backend import STATE_BUFFER_SETS, BoundState, BufferSetLedger, StepResult, check_state_arrays
from .bound_step import RowCopier
from .bundle import Bundle, inside_bundle

INSTALL_HINT = f"install TensorRT 8.5 or newer with `{install_command('tensorrt')}` (on Jetson it comes with JetPack)"


def nvidia_gpu_present() -> bool:
    """True where an NVIDIA driver is loaded (checked without importing CUDA libraries)."""
    return any(Path(p).exists() for p in ("/proc/driver/nvidia/version", "/dev/nvidia0", "/dev/nvhost-ctrl-gpu"))


def tensorrt_ready() -> bool:
    """True where this backend can run: an NVIDIA driver, tensorrt and pycuda (checked without a CUDA context)."""
    try:
        import pycuda  # noqa: F401
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return nvidia_gpu_present()


def require_tensorrt():
    """Import tensorrt and pycuda, or raise a one-line UserError naming what is missing."""
    if not nvidia_gpu_present():
        raise UserError("no NVIDIA GPU found on this machine (no NVIDIA driver loaded): TensorRT runs on the "
                        f"device; copy the bundle there, {INSTALL_HINT}, and build the engine there")
    try:
        import tensorrt as trt
    except ImportError:
        raise UserError(f"TensorRT is not installed: {INSTALL_HINT}") from None
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        raise UserError(f"pycuda is not installed: `{install_command('pycuda')}`") from None
    return trt


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    tensorrt_version: str

    @property
    def folder(self) -> str:
        """engines/<gpu-name>-sm<major><minor>-trt<version>"""
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        major, minor = self.compute_capability
        return f"{slug}-sm{major}{minor}-trt{self.tensorrt_version}"


def current_device() -> DeviceInfo:
    trt = require_tensorrt()
    import pycuda.driver as cuda

    try:
        cuda.init()
        count = cuda.Device.count()
    except cuda.Error as exc:
        # The driver's files are there but CUDA cannot start: typically a container started without the GPU
        # (its /proc still shows the host's driver), or a driver older than this CUDA.
        raise UserError(f"CUDA cannot start on this machine ({first_line(exc)}); check `nvidia-smi`, and in a "
                        "container give it the GPU (docker run --gpus all)") from None
    if count == 0:
        raise UserError("the NVIDIA driver reports no CUDA device; check `nvidia-smi`")
    device = cuda.Device(0)
    return DeviceInfo(device.name(), tuple(device.compute_capability()), trt.__version__)


def check_engine_matches(sidecar: dict, device: DeviceInfo, bundle_root: Path, precision: str) -> None:
    """Refuse an engine built for another GPU architecture or TensorRT version, saying how to rebuild."""
    rebuild = f"rebuild it here: sdqes-edge build-engine {bundle_root} --precision {precision}"
    built_cc = tuple(sidecar.get("compute_capability", ()))
    if built_cc != tuple(device.compute_capability):
        raise UserError(f"the {precision} engine was built for compute capability sm{''.join(map(str, built_cc))} "
                        f"({sidecar.get('gpu')}), this GPU is sm{''.join(map(str, device.compute_capability))} "
                        f"({device.name}); {rebuild}")
    if sidecar.get("tensorrt_version") != device.tensorrt_version:
        raise UserError(f"the {precision} engine was built with TensorRT {sidecar.get('tensorrt_version')}, this "
                        f"machine has {device.tensorrt_version}; {rebuild}")


def check_engine_source(sidecar: dict, bundle: Bundle, precision: str) -> None:
    """Refuse an engine built from a step graph that is not this bundle's (an engines folder copied in from another
    export of the model): it would run the other model's weights, silently. The sidecar records the sha256 of the
    graph it was built from; the manifest lists the sha256 of each of the bundle's files."""
    built_from, source = sidecar.get("source_graph_sha256"), sidecar.get("source_graph")
    listed = bundle.manifest["files"].get(source, {}).get("sha256") if isinstance(source, str) else None
    if built_from is not None and built_from != listed:
        raise UserError(f"the {precision} engine in {bundle.root} was built from a {source or 'step graph'} that is "
                        "not this bundle's (an engines folder copied from another export?); rebuild it here: "
                        f"sdqes-edge build-engine {bundle.root} --precision {precision}")


def find_engine(bundle: Bundle, precision: str, device: DeviceInfo) -> tuple[Path, dict]:
    name = f"{ENGINES_FOLDER}/{device.folder}/{engine_name(precision)}"
    engine = inside_bundle(bundle.root, name, named_by_manifest=False)
    rebuild = f"sdqes-edge build-engine {bundle.root} --precision {precision}"
    if not engine.is_file():
        engines = inside_bundle(bundle.root, ENGINES_FOLDER, named_by_manifest=False)
        others = sorted(p.name for p in engines.glob("*") if p.is_dir())
        where = f" (it has engines for: {', '.join(others)})" if others else ""
        raise UserError(f"{bundle.root} has no {precision} engine for {device.folder}{where}; build one here: "
                        f"{rebuild}")
    sidecar_path = inside_bundle(bundle.root, str(PurePosixPath(name).with_suffix(".json")), named_by_manifest=False)
    try:
        sidecar = parse_json(sidecar_path.read_text())
    except (OSError, ValueError):  # build-engine writes it beside the engine; without it nothing says what it is
        raise UserError(f"{sidecar_path}, which says what the {precision} engine was built for and from, is missing "
                        f"or unreadable; rebuild the engine: {rebuild}") from None
    if not isinstance(sidecar, dict):
        raise UserError(f"{sidecar_path} is not the record build-engine writes; rebuild the engine: {rebuild}")
    check_engine_matches(sidecar, device, bundle.root, precision)
    check_engine_source(sidecar, bundle, precision)
    if not sidecar.get("verification"):  # built with --verify-frames 0, or by a version that did not check
        warnings.warn(f"the {precision} engine was never checked against the bundle's fp32 graph; rebuild it to "
                      f"check it: {rebuild}", SetupWarning, stacklevel=2)
    return engine, sidecar


@dataclass(frozen=True)
class Binding:
    """One of an engine's I/O tensors, as the engine describes it."""

    shape: tuple[int, ...]
    dtype: np.dtype


# TensorRT's I/O types as numpy's, by the DataType's name. Not ``trt.nptype``: TensorRT 8.5's (JetPack 5's, a Jetson
# Xavier's last) builds its table with ``np.bool``, which numpy 1.24, the oldest this project takes, removed, so
# every call of it raised AttributeError.
NUMPY_DTYPE_OF_TENSORRT = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32,
                           "INT64": np.int64, "UINT8": np.uint8, "BOOL": np.bool_}


def numpy_dtype(tensorrt_dtype) -> np.dtype:
    """``trt.DataType.HALF`` -> float16; a type numpy lacks (BF16, FP8, INT4) is refused in one line."""
    name = getattr(tensorrt_dtype, "name", str(tensorrt_dtype).rpartition(".")[2])
    if name not in NUMPY_DTYPE_OF_TENSORRT:
        raise UserError(f"the engine has an input or output of TensorRT type {name}, which numpy cannot hold; "
                        "rebuild the engine with `sdqes-edge build-engine` from the bundle's own graphs")
    return np.dtype(NUMPY_DTYPE_OF_TENSORRT[name])


def engine_bindings(engine) -> dict[str, Binding]:
    """An engine's I/O tensors by name (TensorRT's named-tensor API, 8.5 and newer)."""
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    return {name: Binding(tuple(int(d) for d in engine.get_tensor_shape(name)),
                          numpy_dtype(engine.get_tensor_dtype(name))) for name in names}


def expected_bindings(spec, embed_dim: int, image_size: int, batch: int) -> dict[str, set[tuple[int, ...]]]:
    """The shapes the step graph's I/O may have, by name, from the bundle's contract (no fused queries); a state
    tensor's are its ``boundary_shapes``."""
    shapes = {FRAME_INPUT: {(batch, 3, image_size, image_size)}, EMBEDDING_OUTPUT: {(batch, embed_dim)}}
    for tensor in spec:
        shapes[tensor.input_name] = shapes[tensor.output_name] = tensor.boundary_shapes
    return shapes


def check_bindings(bindings: dict[str, Binding], expected: dict[str, set[tuple[int, ...]]], engine: str,
                   rebuild: str) -> None:
    """Refuse, in one line with ``rebuild``, an engine whose I/O is not the bundle's step graph's: other names,
    other shapes, or a dtype the step cannot carry (a state input and its output must agree)."""
    def refuse(problem: str):
        raise UserError(f"{engine} does not fit the bundle's step graph ({problem}); {rebuild}")

    if set(bindings) != set(expected):
        extra, missing = sorted(set(bindings) - set(expected)), sorted(set(expected) - set(bindings))
        refuse(", ".join(part for part in (f"missing {missing[:3]}" if missing else "",
                                           f"unexpected {extra[:3]}" if extra else "") if part))
    for name, shapes in expected.items():
        if bindings[name].shape not in shapes:
            refuse(f"{name} is {list(bindings[name].shape)}, the bundle's is {list(max(shapes, key=len))}")
        if bindings[name].dtype.kind != "f":
            refuse(f"{name} is {bindings[name].dtype}, not floating point")
    for name in expected:
        if name.startswith(STATE_INPUT_PREFIX):
            output = STATE_OUTPUT_PREFIX + name[len(STATE_INPUT_PREFIX):]
            if bindings[name].dtype != bindings[output].dtype:
                refuse(f"{name} is {bindings[name].dtype} but {output} is {bindings[output].dtype}")


def _in_cuda_context(method):
    """``method`` run with the backend's CUDA context current on the calling thread. pycuda makes a context current
    only on the thread that created it, so a step from another thread (a ROS 2 executor's callback, a program's
    worker) ran where no context was current, or CUDA's primary one, which TensorRT's own runtime calls would have
    made, and which does not hold this backend's buffers."""
    @functools.wraps(method)
    def in_context(self, *args, **kwargs):
        with self._current():
            return method(self, *args, **kwargs)
    return in_context


class TensorRTStep:
    def __init__(self, engine_path: Path, spec, embed_dim: int, image_size: int, batch: int,
                 rebuild: str = "rebuild it with sdqes-edge build-engine"):
        current_device()  # TensorRT, pycuda and a CUDA that starts (else one line saying which is missing)
        import pycuda.autoinit  # (creates the CUDA context, current on this thread alone)
        import pycuda.driver as cuda

        self.cuda, self.spec, self.cuda_context = cuda, spec, pycuda.autoinit.context
        with self._current():
            self._load(engine_path, spec, embed_dim, image_size, batch, rebuild)
        self.fused_queries = False
        self.warm_up_steps = STATE_BUFFER_SETS  # each buffer set's first use

    @contextlib.contextmanager
    def _current(self):
        """This backend's CUDA context current on this thread meanwhile (pushed on its stack, then popped)."""
        self.cuda_context.push()
        try:
            yield
        finally:
            self.cuda.Context.pop()

    def _load(self, engine_path: Path, spec, embed_dim: int, image_size: int, batch: int, rebuild: str) -> None:
        """The engine, its execution context and every buffer it binds, allocated once."""
        import tensorrt as trt

        cuda = self.cuda
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise UserError(f"TensorRT cannot load {engine_path}; {rebuild}")
        bindings = engine_bindings(self.engine)
        check_bindings(bindings, expected_bindings(spec, embed_dim, image_size, batch), Path(engine_path).name,
                       rebuild)
        self.context = self.engine.create_execution_context()
        self.stream = cuda.Stream()
        self.frame_host = cuda.pagelocked_empty(bindings[FRAME_INPUT].shape, bindings[FRAME_INPUT].dtype)
        self.embedding_host = cuda.pagelocked_empty(bindings[EMBEDDING_OUTPUT].shape,
                                                    bindings[EMBEDDING_OUTPUT].dtype)
        self.frame_device = cuda.mem_alloc(self.frame_host.nbytes)
        self.embedding_device = cuda.mem_alloc(self.embedding_host.nbytes)
        # The state as the engine holds it: fp16 in an fp16 engine built strongly typed, else fp32.
        self.initial = [a.astype(bindings[t.input_name].dtype) for t, a in zip(spec, spec.initial_numpy())]
        self.sets = [[cuda.mem_alloc(max(a.nbytes, 1)) for a in self.initial] for _ in range(STATE_BUFFER_SETS)]
        self.initial_device = [cuda.mem_alloc(max(a.nbytes, 1)) for a in self.initial]
        for buffer, array in zip(self.initial_device, self.initial):
            cuda.memcpy_htod(buffer, array)
        self.ledger = BufferSetLedger()  # a stale handle is refused, as on ONNX Runtime's bound path
        # Streams' rows copied on the device in this backend's stream, as ONNX Runtime's bound path copies them.
        self.row_copier = RowCopier(lambda dst, src, nbytes: cuda.memcpy_dtod_async(dst, src, nbytes, self.stream),
                                    self.stream.synchronize)

    @classmethod
    def from_bundle(cls, bundle: Bundle, precision: str = FP16) -> "TensorRTStep":
        engine, _ = find_engine(bundle, precision, current_device())
        return cls.for_bundle(engine, bundle)

    @classmethod
    def for_bundle(cls, engine: Path, bundle: Bundle) -> "TensorRTStep":
        """An engine file built from ``bundle``'s step graph (found or not by ``find_engine``)."""
        precision = engine.name.split(".")[1]  # step.<precision>.engine[.tmp]
        return cls(engine, bundle.state_spec, int(bundle.manifest["embed_dim"]), bundle.image_size,
                   int(bundle.manifest["batch"]),
                   rebuild=f"rebuild it: sdqes-edge build-engine {bundle.root} --precision {precision}")

    def _copy_rows(self, dst_set: list, src_set: list, rows: list[int] | None) -> None:
        """Rows (streams) ``rows`` of every state tensor, all when None, from ``src_set`` into ``dst_set``."""
        for dst, src, array in zip(dst_set, src_set, self.initial):
            streams = range(array.shape[0]) if rows is None else rows  # batch on axis 0, contiguous
            self.row_copier.copy(int(dst), int(src), array.nbytes // array.shape[0], list(streams))
        self.row_copier.finish()

    @_in_cuda_context
    def initial_state(self) -> BoundState:
        self._copy_rows(self.sets[0], self.initial_device, None)
        return self.ledger.loaded()

    @_in_cuda_context
    def step(self, frame: np.ndarray, state: BoundState, query_embeddings=None) -> StepResult:
        k = self.ledger.current(state)
        src, dst = self.sets[k], self.sets[1 - k]
        np.copyto(self.frame_host, frame)
        self.cuda.memcpy_htod_async(self.frame_device, self.frame_host, self.stream)
        self.context.set_tensor_address(FRAME_INPUT, int(self.frame_device))
        self.context.set_tensor_address(EMBEDDING_OUTPUT, int(self.embedding_device))
        for spec, buffer_in, buffer_out in zip(self.spec, src, dst):
            self.context.set_tensor_address(spec.input_name, int(buffer_in))
            self.context.set_tensor_address(spec.output_name, int(buffer_out))
        if not self.context.execute_async_v3(self.stream.handle):
            raise UserError("TensorRT failed to run the engine; rebuild it with sdqes-edge build-engine")
        self.cuda.memcpy_dtoh_async(self.embedding_host, self.embedding_device, self.stream)
        self.stream.synchronize()
        return StepResult(self.embedding_host.astype(np.float32), self.ledger.stepped(k))

    @_in_cuda_context
    def state_to_numpy(self, state: BoundState) -> dict[str, np.ndarray]:
        out = {}
        for spec, buffer, array in zip(self.spec, self.sets[self.ledger.current(state)], self.initial):
            host = np.empty_like(array)
            self.cuda.memcpy_dtoh(host, buffer)
            out[spec.name] = host
        return out

    @_in_cuda_context
    def state_from_numpy(self, arrays: dict[str, np.ndarray]) -> BoundState:
        check_state_arrays(self.spec, arrays)  # an array of another size would be copied past its buffer
        for spec, buffer, initial in zip(self.spec, self.sets[0], self.initial):
            self.cuda.memcpy_htod(buffer, np.ascontiguousarray(arrays[spec.name], dtype=initial.dtype))
        return self.ledger.loaded()

    @_in_cuda_context
    def keep_streams(self, new: BoundState, old: BoundState, streams: list[int]) -> BoundState:
        self._copy_rows(self.sets[self.ledger.current(new)], self.sets[self.ledger.current(old)], streams)
        return new

    @_in_cuda_context
    def reset_streams(self, state: BoundState, streams: list[int] | None = None) -> BoundState:
        self._copy_rows(self.sets[self.ledger.current(state)], self.initial_device, streams)
        return state
