"""What this machine can run: each package and device sdqes-edge uses, found or not, and what to do about it.

A robot or headset is set up by hand, often over SSH, from pieces that each fail in their own way: a CPU build
of ONNX Runtime where the GPU build was meant, two builds sharing one folder, onnxruntime-gpu whose CUDA
libraries do not load (it then runs on the CPU), an OpenCV without GStreamer for a Jetson's CSI camera, a
kernel library built for another GPU. Every command refuses such a state when it meets it; ``sdqes-edge
doctor`` reports them all at once, before anything is run, with the fix for each, and says what the machine
can therefore do. Nothing here imports torch (its version is read from its metadata): the report is quick, and
it runs on a device that has the runtime alone, or not even that.

Each ``Finding`` is ``ok`` (True), missing but optional here (None), or broken (False): something installed that
will fail or silently run elsewhere than asked. ``Report.broken`` makes the command's exit status 1.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from sdqes_edge import __version__, package_builds
from sdqes_edge.contract import FP32, step_graph_name
from sdqes_edge.errors import UserError, install_command, module_absent

NVIDIA_SMI_TIMEOUT_S = 10  # a driver in a bad state can hang nvidia-smi; the report goes on without its line
JETSON_RELEASE = Path("/etc/nv_tegra_release")  # L4T's release line, on every Jetson


@dataclass
class Finding:
    topic: str
    ok: Optional[bool]  # True: works; None: not here, and optional; False: broken (fails, or runs elsewhere)
    detail: str
    fix: str = ""


@dataclass
class Report:
    findings: list = field(default_factory=list)
    can: dict = field(default_factory=dict)  # what the machine can do -> True/False

    @property
    def broken(self) -> list:
        return [f for f in self.findings if f.ok is False]

    def as_dict(self) -> dict:
        return {"sdqes_edge_version": __version__, "python": platform.python_version(), "platform": _platform_words(),
                "findings": [asdict(f) for f in self.findings], "can": dict(self.can)}


def _platform_words() -> str:
    return f"{platform.system()} {platform.machine()}"


def _version(distribution: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def numpy_finding() -> Finding:
    import numpy

    return Finding("numpy", True, numpy.__version__)


def opencv_finding() -> Finding:
    """OpenCV: there, whole, and which video back-ends it has (GStreamer for a Jetson's CSI camera)."""
    if module_absent(package_builds.OPENCV):
        return Finding("OpenCV", None, "not installed: no video, camera or annotated output",
                       install_command("cv2"))
    import cv2

    if not hasattr(cv2, "VideoCapture"):
        return Finding("OpenCV", False, "the cv2 folder is empty",
                       package_builds.incomplete_package_words(package_builds.OPENCV))
    from sdqes_edge.runtime.frame_source import STREAM_TIMEOUT_S
    from sdqes_edge.runtime.live_source import opencv_has_gstreamer

    registry = cv2.videoio_registry
    usable = {kind: [registry.getBackendName(b) for b in listed() if registry.hasBackend(b)] or ["none"]
              for kind, listed in (("videos", registry.getStreamBackends), ("cameras", registry.getCameraBackends),
                                   ("writing", registry.getWriterBackends))}
    gstreamer = ("GStreamer pipelines: yes" if opencv_has_gstreamer() else
                 "GStreamer pipelines: no (pip's wheels never have it; a Jetson's CSI camera needs JetPack's OpenCV)")
    detail = f"{cv2.__version__}; " + "; ".join(f"{kind}: {', '.join(names)}" for kind, names in usable.items())
    streams = (f"stream URLs: FFMPEG, given up after {STREAM_TIMEOUT_S:g} s without a frame (run --stream-timeout)"
               if registry.hasBackend(cv2.CAP_FFMPEG) else
               "stream URLs: no FFMPEG, so a stalled stream waits for its back-end's own timeout")
    detail += f"; {gstreamer}; {streams}"
    builds = package_builds.installed_builds(package_builds.OPENCV)
    if len(builds) > 1:  # works, whichever was installed last; uninstalling either would empty the folder
        return Finding("OpenCV", True, f"{detail}; {' and '.join(builds)} share the cv2 folder",
                       f"keep one: {package_builds.keep_one_command(builds, package_builds.OPENCV)}")
    return Finding("OpenCV", True, detail)


def onnxruntime_finding():
    """(Finding, the onnxruntime module or None)."""
    if module_absent(package_builds.ONNXRUNTIME):
        return Finding("ONNX Runtime", None, "not installed: no bundle can run", install_command("onnxruntime")), None
    try:
        ort = package_builds.load_onnxruntime()
    except UserError as exc:
        return Finding("ONNX Runtime", False, "the onnxruntime folder is empty", str(exc)), None
    builds = package_builds.installed_builds()
    names = " and ".join(builds) or "not registered with pip"
    if list(builds) == [package_builds.CPU_BUILD]:
        names = "onnxruntime, the CPU build"
    detail = f"{ort.__version__} ({names}): {', '.join(ort.get_available_providers())}"
    if len(builds) > 1:  # broken where the files in use are not the GPU build's (the CPU build won)
        gpu_build_runs = package_builds.CUDA_PROVIDER in ort.get_available_providers()
        fix = (f"keep one: {package_builds.keep_one_command(builds)} (uninstalling either alone empties the folder "
               "the other uses)" if gpu_build_runs else
               package_builds.missing_provider_words(package_builds.CUDA_PROVIDER, ort))
        return Finding("ONNX Runtime", gpu_build_runs, f"{detail}; {names} are both installed", fix), ort
    return Finding("ONNX Runtime", True, detail), ort


def gpu_finding() -> Finding:
    """The NVIDIA GPU, found through its driver without loading CUDA; nvidia-smi names it where it is."""
    from sdqes_edge.runtime.tensorrt_backend import nvidia_gpu_present

    if not nvidia_gpu_present():
        return Finding("NVIDIA GPU", None, "none found (no NVIDIA driver loaded): bundles run on the CPU")
    if JETSON_RELEASE.is_file():
        return Finding("NVIDIA GPU", True, f"Jetson ({JETSON_RELEASE.read_text().splitlines()[0].strip('# ')})")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Finding("NVIDIA GPU", True, "NVIDIA driver loaded (no nvidia-smi to name the GPU)")
    try:
        listed = subprocess.run([smi, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Finding("NVIDIA GPU", False, f"nvidia-smi did not answer in {NVIDIA_SMI_TIMEOUT_S} s",
                       "check the driver (nvidia-smi, dmesg); a reboot may be needed")
    if listed.returncode != 0:
        return Finding("NVIDIA GPU", False, f"nvidia-smi failed: {listed.stdout.strip() or listed.stderr.strip()}",
                       "check the driver; in a container, give it the GPU (docker run --gpus all)")
    gpus = [line.split(", ") for line in listed.stdout.strip().splitlines()]
    return Finding("NVIDIA GPU", True, "; ".join(f"{g[0]} (sm_{g[2].replace('.', '')}, driver {g[1]})"
                                                 if len(g) == 3 else ", ".join(g) for g in gpus))


def cuda_session_finding(ort, gpu: Finding) -> Finding:
    """Whether ``--ort-device cuda`` runs: a session on the CUDA provider made from a real bundle's graph, as
    ``run`` makes it (the provider listed is not enough: ONNX Runtime drops one whose libraries do not load)."""
    topic = "ONNX Runtime on the GPU"
    if gpu.ok is None:
        return Finding(topic, None, "no (no NVIDIA GPU here)")
    if ort is None:
        return Finding(topic, None, "no ONNX Runtime", f"pip install {package_builds.GPU_INSTALL}")
    if package_builds.CUDA_PROVIDER not in ort.get_available_providers():
        return Finding(topic, None, "no CUDA execution provider",
                       package_builds.missing_provider_words(package_builds.CUDA_PROVIDER, ort,
                                                             on_cpu="run on the CPU"))
    from sdqes_edge.demo import DEMO_BUNDLE  # a real bundle's graph, shipped in the package
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

    with warnings.catch_warnings(record=True) as said:  # a capture refused: part of the finding, not a stray line
        warnings.simplefilter("always")
        try:
            step = OnnxRuntimeStep(DEMO_BUNDLE / step_graph_name(FP32), device="cuda")
        except UserError as exc:
            return Finding(topic, False, "the CUDA provider is listed, but a session on it fails", str(exc))
    graphs = "with CUDA graphs" if step.cuda_graph else "without CUDA graphs"
    notes = "".join(f"; {w.message}" for w in said)
    return Finding(topic, True, f"a CUDA session runs, state bound on the device, {graphs}{notes}: --ort-device cuda")


def tensorrt_finding(ort, gpu: Finding) -> Finding:
    """TensorRT for build-engine and --backend trt (tensorrt and pycuda), and ONNX Runtime's TensorRT provider."""
    from sdqes_edge.runtime.tensorrt_backend import INSTALL_HINT

    topic = "TensorRT"
    tensorrt, pycuda = _version("tensorrt") or _module_version("tensorrt"), _version("pycuda")
    if gpu.ok is None:
        return Finding(topic, None, "no (TensorRT runs on an NVIDIA GPU)")
    provider = ""
    if ort is not None and "TensorrtExecutionProvider" in ort.get_available_providers():
        from sdqes_edge.runtime.ort_sessions import provider_library_problem

        problem = provider_library_problem("TensorrtExecutionProvider")
        provider = ("; ONNX Runtime's TensorRT provider: " +
                    (f"will not load ({problem})" if problem else "loads (--ort-device tensorrt)"))
    if tensorrt is None:
        return Finding(topic, None, "not installed: no build-engine, no --backend trt" + provider, INSTALL_HINT)
    if pycuda is None:
        return Finding(topic, None, f"{tensorrt}, without pycuda: neither build-engine nor --backend trt" + provider,
                       install_command("pycuda"))
    return Finding(topic, True, f"{tensorrt}, pycuda {pycuda}: build-engine, --backend trt" + provider)


def _module_version(module: str) -> Optional[str]:
    """A module's own __version__ where no distribution metadata names it (JetPack's TensorRT is a Debian
    package); None where it does not import."""
    if module_absent(module):
        return None
    try:
        return str(getattr(__import__(module), "__version__", "installed"))
    except ImportError:
        return None


def kernel_library_finding(library: Path, gpu: Finding) -> Finding:
    """This project's ONNX Runtime kernels (--ort-ops): built, with CUDA kernels, and able to run on this GPU."""
    from sdqes_edge.runtime.fused_ops import BUILD_COMMAND, cuda_problem, load_fused_ops

    topic = "kernel library"
    if not library.is_file():  # which compilers a build would use is build.sh's to say (--print-archs)
        return Finding(topic, None,
                       f"none at {library} (optional: one kernel per QRNN pooling or RetNet retention step)",
                       f"{BUILD_COMMAND} (--print-archs: which nvcc and GPUs it would build for)")
    try:
        fused = load_fused_ops(library)
    except UserError as exc:
        return Finding(topic, False, f"{library} does not load", str(exc))
    if not fused.with_cuda:
        return Finding(topic, True, f"{library}: CPU kernels (built without nvcc)")
    if gpu.ok is None:
        return Finding(topic, True, f"{library}: CPU and CUDA kernels (no GPU here to run the CUDA ones)")
    problem = cuda_problem(fused.path)
    if problem:
        return Finding(topic, False, f"{library}: its CUDA kernels cannot run on this GPU", problem)
    return Finding(topic, True, f"{library}: CPU and CUDA kernels, ready on this GPU (--ort-ops {library})")


def export_finding() -> Finding:
    """The workstation's side (export, check, info --preset, bench, train): torch and onnx, read from metadata."""
    torch, onnx = (None if module_absent(name) else _version(name) for name in ("torch", "onnx"))
    if torch is None or onnx is None:
        missing = " and ".join(name for name, v in (("torch", torch), ("onnx", onnx)) if v is None)
        return Finding("export", None, f"no {missing}: export, check, bench and train run on a workstation",
                       install_command("torch"))
    return Finding("export", True, f"torch {torch}, onnx {onnx}: export, check, bench, train")


def diagnose(library: Path) -> Report:
    """Every finding for this machine, and what it can therefore do."""
    report = Report()
    ort_finding, ort = onnxruntime_finding()
    gpu = gpu_finding()
    opencv = opencv_finding()
    cuda = cuda_session_finding(ort, gpu)
    trt = tensorrt_finding(ort, gpu)
    export = export_finding()
    report.findings = [numpy_finding(), opencv, ort_finding, gpu, cuda, trt, kernel_library_finding(library, gpu),
                       export]
    runs = ort is not None and opencv.ok is True  # the runtime reads sources with OpenCV; any ONNX Runtime steps
    report.can = {"run bundles on the CPU": runs,
                  "run bundles on the GPU (--ort-device cuda)": runs and cuda.ok is True,
                  "build and run TensorRT engines (build-engine, --backend trt)": runs and trt.ok is True,
                  "export bundles (export, check, bench, train)": export.ok is True}
    return report


def report_lines(report: Report) -> list:
    """The report as the command prints it: one line per finding, its fix under it, then what the machine can do."""
    mark = {True: "ok", None: "--", False: "FIX"}
    lines = [f"sdqes-edge {__version__}, Python {platform.python_version()} on {_platform_words()} ({sys.executable})",
             ""]
    width = max(len(f.topic) for f in report.findings)
    for f in report.findings:
        lines.append(f"  {mark[f.ok]:<4}{f.topic:<{width}}  {f.detail}")
        if f.fix:
            lines.append(f"      {'':<{width}}  -> {f.fix}")
    lines.append("")
    lines += [f"  {'yes' if able else 'no ':<4}{what}" for what, able in report.can.items()]
    return lines
