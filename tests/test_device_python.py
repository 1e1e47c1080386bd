"""What a device runs keeps to the oldest Python pyproject.toml accepts (3.8: JetPack 5, the last JetPack for a
Jetson Xavier, and the only Python NVIDIA builds its onnxruntime-gpu and TensorRT wheels for there).

Three checks hold it in CI, which runs a newer Python: ruff (target-version py38) refuses syntax 3.8 lacks and
(rule FA102) annotations it cannot evaluate in a module without the annotations future import; vermin, here, the
standard-library calls (functools.cache, str.removesuffix, importlib.resources.files ...); and the test of
module-level aliases below.
Neither sees a method of an object whose type it cannot infer (Path.is_relative_to, an executor's
cancel_futures): `scripts/oldest_stack_check.sh python3.8` runs the demo, inspect and run on a real Python 3.8.
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
             for folder in DEVICE_SIDE for path in sorted((REPO / folder).rglob("*.py"))
             for match in alias.finditer(path.read_text())]
    assert not found, "use typing's Dict, List, Tuple for these: " + "; ".join(found)
