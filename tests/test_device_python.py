"""What a device runs keeps to the oldest Python pyproject.toml accepts (3.8: JetPack 5, the last JetPack for a
Jetson Xavier, and the only Python NVIDIA builds its onnxruntime-gpu and TensorRT wheels for there).

In CI, which runs a newer Python: ruff (target-version py38) refuses syntax 3.8 lacks and (rule FA102) annotations
it cannot evaluate in a module without the annotations future import; here, vermin finds the standard-library calls
(functools.cache, str.removesuffix, importlib.resources.files ...), and two searches what vermin cannot see:
builtin generics in module-level aliases, and methods of objects whose type it cannot infer (Path.is_relative_to,
an executor's cancel_futures). By hand, `scripts/oldest_stack_check.sh python3.8` runs the demo, inspect and run on
a real Python 3.8.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The layers a device imports: the base package (tokenizer, contract, state, metrics, the command line), the
# runtime, and export (build-engine runs on the device that will run the engine). Not the benchmarks.
DEVICE_SIDE = ("sdqes_edge", "runtime", "export")


def device_sources() -> list[Path]:
    return [path for folder in DEVICE_SIDE for path in sorted((REPO / folder).rglob("*.py"))]


def oldest_python() -> str:
    """pyproject.toml's lowest Python, '3.8' from '>=3.8'."""
    return re.search(r'^requires-python = ">=(\d+\.\d+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)


def vermin(*paths: str | Path) -> subprocess.CompletedProcess:
    pytest.importorskip("vermin", reason="vermin is a dev dependency (scripts/setup.sh --dev)")
    command = "import sys, vermin; sys.exit(vermin.main())"  # its console script's entry point (no __main__)
    return subprocess.run([sys.executable, "-c", command, f"-t={oldest_python()}-", "--violations", "--no-tips",
                           "--no-parse-comments", *map(str, paths)], capture_output=True, text=True, cwd=REPO)


def test_the_device_side_calls_nothing_the_oldest_python_lacks():
    checked = vermin(*DEVICE_SIDE)
    assert checked.returncode == 0, f"needs a newer Python than {oldest_python()}:\n{checked.stdout}"


def test_the_check_finds_what_the_oldest_python_lacks(tmp_path):
    """The check above can fail: the calls this project made before it kept to 3.8 are each found."""
    newer = tmp_path / "newer.py"
    newer.write_text("import functools\nfrom importlib import resources\n\n\n@functools.cache\ndef schema():\n"
                     "    return resources.files(__package__)\n\n\nNAME = 'x.index.json'.removesuffix('.json')\n")
    found = vermin(newer)
    assert found.returncode != 0
    for call in ("functools.cache", "importlib.resources.files", "str.removesuffix"):
        assert call in found.stdout


def test_module_level_aliases_evaluate_on_the_oldest_python():
    """An alias is evaluated at import, so ``dict[str, X]`` there needs Python 3.9 whatever the future import says
    (annotations stay strings); vermin does not flag it when the file imports annotations from the future."""
    alias = re.compile(r"^[A-Z]\w* = (dict|list|tuple|set|frozenset|type)\[", re.MULTILINE)
    found = [f"{path.relative_to(REPO)}: {match.group(0)}"
             for path in device_sources() for match in alias.finditer(path.read_text())]
    assert not found, "use typing's Dict, List, Tuple for these: " + "; ".join(found)


# Methods of objects whose type vermin cannot infer, with the Python that brought them: a name here in the device
# side is a call the oldest Python lacks (each was, or is easy to write, in this project's kind of code).
NEWER_METHODS = {r"\.is_relative_to\(": "3.9", r"\.with_stem\(": "3.9", r"\.readlink\(": "3.9",
                 r"cancel_futures\s*=": "3.9", r"\.hardlink_to\(": "3.10", r"\bzip\([^)]*\bstrict\s*=": "3.10",
                 r"\.bit_count\(": "3.10", r"\.walk\(\s*(top_down|on_error|follow_symlinks)": "3.12"}


def test_the_device_side_calls_no_method_the_oldest_python_lacks_where_vermin_cannot_see_the_type():
    """sdqes_edge/compat.py, the one place that asks the Python's version, may call them behind that check."""
    paths = [path for path in device_sources() if path != REPO / "sdqes_edge" / "compat.py"]
    found = [f"{path.relative_to(REPO)}:{number} ({since}): {line.strip()}"
             for path in paths for number, line in enumerate(path.read_text().splitlines(), 1)
             for pattern, since in NEWER_METHODS.items() if re.search(pattern, line.split("#")[0])]
    assert not found, f"Python {oldest_python()} lacks: " + "; ".join(found)
