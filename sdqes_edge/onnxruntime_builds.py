"""Which ONNX Runtime build is installed, and the one-line fix where two builds share one folder.

``onnxruntime`` (the CPU build), ``onnxruntime-gpu`` (and -directml, -openvino, NVIDIA's Jetson wheels, which
are named onnxruntime-gpu too) are separate distributions that install the same import package,
``onnxruntime/``. pip lets two of them be installed at once: the files of the one installed last are the ones
that run, and uninstalling either removes files both need. Both happen to users of this project, since
``sdqes-edge[runtime]`` brings the CPU build:

- ``pip install onnxruntime-gpu 'sdqes-edge[runtime]'`` ran the CPU build (measured: onnxruntime 1.32.0 over
  onnxruntime-gpu 1.31.1). ``--ort-device cuda`` then found no CUDA provider and advised installing
  onnxruntime-gpu, which was installed.
- ``pip uninstall onnxruntime`` after that left ``import onnxruntime`` an empty package, and every command
  ended in "module 'onnxruntime' has no attribute ..." (a traceback).

So each place that needs ONNX Runtime imports it through ``load_onnxruntime``, and a missing provider is
explained by ``missing_provider_words``, both naming the builds installed and the pip commands that leave one.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from sdqes_edge.errors import UserError

IMPORT_PACKAGE = "onnxruntime"  # the folder every build installs
CPU_BUILD = "onnxruntime"  # the distribution sdqes-edge[runtime] and [export] bring
GPU_BUILD = "onnxruntime-gpu"  # what an NVIDIA machine needs instead (sdqes-edge[gpu])
CUDA_PROVIDER = "CUDAExecutionProvider"
JETSON_NOTE = "on a Jetson, NVIDIA's onnxruntime-gpu wheel for its JetPack"


def installed_builds() -> dict[str, str]:
    """{distribution: version} of every ONNX Runtime build installed where Python looks (its metadata, which
    outlives files another build's uninstall removed). Reads every distribution's file list: error paths only."""
    from importlib import metadata

    builds = {}
    for name in metadata.packages_distributions().get(IMPORT_PACKAGE, []):
        try:
            builds.setdefault(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return dict(sorted(builds.items()))


def files_gone() -> bool:
    """True where a build is registered but its ``onnxruntime/__init__.py`` is not there: another build's
    uninstall removed the files they shared."""
    from importlib import metadata

    return any(not Path(str(metadata.distribution(name).locate_file(f"{IMPORT_PACKAGE}/__init__.py"))).exists()
               for name in installed_builds())


def _listed(builds: dict[str, str]) -> str:
    return " and ".join(f"{name} {version}" for name, version in builds.items())


def _pinned(builds: dict[str, str], name: str) -> str:
    return f"{name}=={builds[name]}" if name in builds else name


def load_onnxruntime() -> ModuleType:
    """``import onnxruntime``, refusing in one line a package whose files another build's uninstall removed."""
    import onnxruntime

    if not hasattr(onnxruntime, "InferenceSession"):
        raise UserError(incomplete_package_words())
    return onnxruntime


def incomplete_package_words() -> str:
    """Why ``onnxruntime`` imports as an empty (or no) package while a build is still registered, and the fix."""
    builds = installed_builds()
    if not builds:
        return (f"the {IMPORT_PACKAGE} folder here holds no ONNX Runtime (what is left of an uninstalled build): "
                f"pip install 'sdqes-edge[runtime]' (CPU), or pip install 'sdqes-edge[gpu]' on an NVIDIA machine")
    keep = next((name for name in builds if name != CPU_BUILD), CPU_BUILD)
    verb = "is" if len(builds) == 1 else "are"
    return (f"ONNX Runtime is broken here: {_listed(builds)} {verb} installed, but the files of the {IMPORT_PACKAGE} "
            "folder are gone (uninstalling one of two builds that share that folder removes them); reinstall it: "
            f"pip install --force-reinstall --no-deps {_pinned(builds, keep)}")


def missing_provider_words(wanted: str, ort: ModuleType) -> str:
    """Why this ONNX Runtime lists no ``wanted`` execution provider, and what to install."""
    available = ", ".join(ort.get_available_providers())
    builds = installed_builds()
    gpu_builds = [name for name in builds if name != CPU_BUILD]
    if len(builds) > 1 and gpu_builds:
        keep = gpu_builds[0]
        return (f"{_listed(builds)} are both installed and share one {IMPORT_PACKAGE} folder, and the files in use "
                f"(ONNX Runtime {ort.__version__}) have no {wanted} (only {available}); keep one build: "
                f"pip uninstall -y {' '.join(builds)} && pip install {_pinned(builds, keep)} "
                f"({JETSON_NOTE}), and install sdqes-edge[gpu], not [runtime], which brings the CPU build")
    if CPU_BUILD in builds:
        return (f"this onnxruntime is the CPU build ({_listed(builds)}): it has no {wanted} (only {available}); on "
                f"an NVIDIA machine replace it with the GPU build: pip uninstall -y {CPU_BUILD} && pip install "
                f"'sdqes-edge[gpu]' ({JETSON_NOTE}), or use --ort-device cpu")
    return (f"this onnxruntime ({_listed(builds) or 'ONNX Runtime ' + ort.__version__}) has no {wanted} (only "
            f"{available}); install {GPU_BUILD} on an NVIDIA machine, or use --ort-device cpu")
