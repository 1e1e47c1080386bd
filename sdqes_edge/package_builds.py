"""Which distributions installed a shared import folder, and the one-line fix where two of them collide.

Some packages come as several distributions that install the same import folder: ``onnxruntime`` (the CPU
build), ``onnxruntime-gpu`` (NVIDIA's Jetson wheels are named so too), -directml, -openvino ... all install
``onnxruntime/``; opencv-python, opencv-python-headless and their -contrib twins all install ``cv2/``. pip lets two
of them be installed at once: the files of the one installed last are the ones that run, and uninstalling either
removes files both need. Both happen to users of this project, since ``sdqes-edge[runtime]`` brings the CPU build
of ONNX Runtime and headless OpenCV, beside what a GPU machine or another library (opencv-python) brought:

- ``pip install onnxruntime-gpu 'sdqes-edge[runtime]'`` ran the CPU build (measured: onnxruntime 1.32.0 over
  onnxruntime-gpu 1.31.1). ``--ort-device cuda`` then found no CUDA provider and advised installing
  onnxruntime-gpu, which was installed.
- ``pip uninstall onnxruntime`` after that left ``import onnxruntime`` an empty package, and every command
  ended in "module 'onnxruntime' has no attribute ..." (a traceback).
- ``pip uninstall opencv-python`` beside opencv-python-headless of the same release removed ``cv2/`` whole;
  every command then advised ``pip install 'sdqes-edge[runtime]'``, which pip answers "already satisfied".

So each place that needs ONNX Runtime imports it through ``load_onnxruntime``, the command line checks ``cv2``
with ``check_opencv`` before it opens a source, a module found missing is checked with ``files_gone``, and a
missing execution provider is explained by ``missing_provider_words``: each names the distributions installed
and the pip commands that leave one.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from sdqes_edge.compat import packages_distributions
from sdqes_edge.errors import UserError, install_command

ONNXRUNTIME = "onnxruntime"  # the folder every ONNX Runtime build installs
OPENCV = "cv2"  # the folder every OpenCV wheel installs
CPU_BUILD = "onnxruntime"  # the distribution sdqes-edge[runtime] and [export] bring
GPU_BUILD = "onnxruntime-gpu"  # what an NVIDIA machine needs instead (sdqes-edge[gpu])
GPU_INSTALL = "'sdqes-edge[gpu]'"  # what brings it, with OpenCV, and no CPU build
# What each shared folder is called in messages, and the distribution to keep where several are registered.
PACKAGE_NAMES = {ONNXRUNTIME: "ONNX Runtime", OPENCV: "OpenCV (cv2)"}
PREFERRED_BUILD = {ONNXRUNTIME: GPU_BUILD, OPENCV: "opencv-python-headless"}
CUDA_PROVIDER = "CUDAExecutionProvider"
JETSON_NOTE = "on a Jetson, NVIDIA's onnxruntime-gpu wheel for its JetPack"


def installed_builds(package: str = ONNXRUNTIME) -> dict[str, str]:
    """{distribution: version} of every distribution that installed the import folder ``package`` where Python
    looks (its metadata, which outlives files another one's uninstall removed). Reads every distribution's file
    list: error paths only."""
    from importlib import metadata

    builds = {}
    for name in packages_distributions().get(package, []):
        try:
            builds.setdefault(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return dict(sorted(builds.items()))


def files_gone(package: str) -> bool:
    """True where a distribution of ``package`` is registered but ``package/__init__.py`` is not there: another
    one's uninstall removed the files they shared."""
    from importlib import metadata

    return any(not Path(str(metadata.distribution(name).locate_file(f"{package}/__init__.py"))).exists()
               for name in installed_builds(package))


def _listed(builds: dict[str, str]) -> str:
    return " and ".join(f"{name} {version}" for name, version in builds.items())


def _pinned(builds: dict[str, str], name: str) -> str:
    return f"{name}=={builds[name]}" if name in builds else name


def _kept_build(builds: dict[str, str], package: str = ONNXRUNTIME) -> str:
    """Of several distributions installing ``package``, the one to keep: the preferred build (onnxruntime-gpu,
    opencv-python-headless), else one that is not the CPU build of ONNX Runtime, else the first."""
    preferred = PREFERRED_BUILD[package]
    if preferred in builds:
        return preferred
    return next((name for name in builds if name != CPU_BUILD), next(iter(builds)))


def _replace_with(builds: dict[str, str], install: str) -> str:
    """The pip commands that put ``install`` in the place of ``builds``: all of them out first (two that collide
    share their files, and one alone would be shadowed by it), then the one to keep in."""
    return f"pip uninstall -y {' '.join(builds)} && pip install {install}"


def keep_one_command(builds: dict[str, str], package: str = ONNXRUNTIME) -> str:
    """The pip commands that leave one of the ``builds`` (several distributions of ``package``): the one to keep,
    at its version."""
    return _replace_with(builds, _pinned(builds, _kept_build(builds, package)))


def load_onnxruntime() -> ModuleType:
    """``import onnxruntime``, refusing in one line a package whose files another build's uninstall removed."""
    import onnxruntime

    if not hasattr(onnxruntime, "InferenceSession"):
        raise UserError(incomplete_package_words(ONNXRUNTIME))
    return onnxruntime


def require_provider(provider: str) -> ModuleType:
    """``load_onnxruntime()``, refusing in one line (``missing_provider_words``) a build without ``provider``."""
    ort = load_onnxruntime()
    if provider not in ort.get_available_providers():
        raise UserError(missing_provider_words(provider, ort))
    return ort


def check_opencv() -> None:
    """Refuse in one line a ``cv2`` folder another OpenCV wheel's uninstall emptied (it imports, with nothing in)."""
    import cv2

    if not hasattr(cv2, "VideoCapture"):
        raise UserError(incomplete_package_words(OPENCV))


def incomplete_package_words(package: str) -> str:
    """Why ``package`` imports as an empty (or no) package while a distribution is still registered, and the fix."""
    builds = installed_builds(package)
    what = PACKAGE_NAMES[package]
    if not builds:
        return (f"the {package} folder here holds no {what} (what is left of an uninstalled one): "
                f"{install_command(package)}")
    keep = _kept_build(builds, package)
    verb = "is" if len(builds) == 1 else "are"
    return (f"{what} is broken here: {_listed(builds)} {verb} installed, but the files of the {package} folder are "
            "gone (uninstalling one of two distributions that share that folder removes them); reinstall it: "
            f"pip install --force-reinstall --no-deps {_pinned(builds, keep)}")


def missing_provider_words(wanted: str, ort: ModuleType, on_cpu: str = "use --ort-device cpu") -> str:
    """Why this ONNX Runtime lists no ``wanted`` execution provider, and what to install; ``on_cpu``: how the
    caller's user runs on the CPU instead."""
    available = ", ".join(ort.get_available_providers())
    builds = installed_builds()
    if len(builds) > 1:  # distinct names: at least one is not the CPU build
        return (f"{_listed(builds)} are both installed and share one {ONNXRUNTIME} folder, and the files in use "
                f"(ONNX Runtime {ort.__version__}) have no {wanted} (only {available}); keep one build: "
                f"{keep_one_command(builds)} "
                f"({JETSON_NOTE}), and install sdqes-edge[gpu], not [runtime], which brings the CPU build")
    if CPU_BUILD in builds:
        return (f"this onnxruntime is the CPU build ({_listed(builds)}): it has no {wanted} (only {available}); on "
                f"an NVIDIA machine replace it with the GPU build: {_replace_with(builds, GPU_INSTALL)} "
                f"({JETSON_NOTE}), or {on_cpu}")
    return (f"this onnxruntime ({_listed(builds) or 'ONNX Runtime ' + ort.__version__}) has no {wanted} (only "
            f"{available}); install {GPU_BUILD} on an NVIDIA machine, or {on_cpu}")


def update_command() -> str:
    """The pip command that updates the ONNX Runtime installed here to a newer release of the same build: naming
    another build (``pip install -U onnxruntime`` where onnxruntime-gpu runs) would install a second one beside it,
    whose files then win over the GPU build's."""
    builds = installed_builds()
    if len(builds) == 1:
        return f"pip install -U {next(iter(builds))}"
    if builds:  # two builds already collide: updating either leaves them colliding
        return _replace_with(builds, _kept_build(builds))
    return f"pip install -U {CPU_BUILD} (or {JETSON_NOTE})"

