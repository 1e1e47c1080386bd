"""Making an ONNX Runtime session for a step or text graph, the same way everywhere in this project.

Which execution providers each device asks for (``DEVICE_PROVIDERS``), the session options every session starts
from (threads checked, no busy-waiting), CUDA graph capture with a fallback that says why it was refused, the
TensorRT provider's engine cache keyed by the graph's bytes, and the check that the provider ONNX Runtime actually
assigned is the one asked for (it drops one it cannot create without a word). ``onnxruntime_backend`` steps the
sessions made here; the text encoder, the kernel library's readiness check, the exporter and the bench make theirs
here too.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import sys
import warnings
from pathlib import Path
from typing import Iterator

from sdqes_edge.errors import SetupWarning, UserError, first_line
from sdqes_edge.files import file_sha256, make_folders, user_cache_dir
from sdqes_edge.package_builds import CUDA_PROVIDER, load_onnxruntime, update_command

from .cores import checked_threads
from .fused_ops import FusedOps, register_fused_ops
from .ort_releases import (
    CUDA_GRAPH_IDS_SINCE,
    MEM_PATTERN_FIXED_IN,
    cuda_options,
    onnxruntime_release,
    session_keywords,
)

TENSORRT_PROVIDER = "TensorrtExecutionProvider"
# Execution providers per device, best first; ONNX Runtime falls back along the list.
DEVICE_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": [CUDA_PROVIDER, "CPUExecutionProvider"],
    "tensorrt": [TENSORRT_PROVIDER, CUDA_PROVIDER, "CPUExecutionProvider"],
}



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
        make_folders(folder)
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


@contextlib.contextmanager
def quiet_provider_fallback(ort, device: str) -> Iterator[None]:
    """ONNX Runtime's own words while it makes a GPU session, kept off the terminal: a provider it cannot create
    is logged in two coloured lines and, for TensorRT, a ten-line "EP Error" block printed to stdout (where
    `run` writes its alerts), all before the one line ``check_providers`` says it in, with the library that
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


def check_providers(device: str, assigned: list[str]) -> None:
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
