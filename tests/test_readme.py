"""The README's Python examples run as written: a user copies them first, so they may not rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sdqes_edge.demo import run_demo
from sdqes_edge.train_options import DEMO_SEED

README = Path(__file__).resolve().parents[1] / "README.md"
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)


def test_the_readme_shows_the_runtime_and_the_model_in_python():
    code = "\n".join(PYTHON_BLOCKS)
    assert "StreamingDetector(" in code and "SDQESModel(" in code


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"block{i}" for i in range(len(PYTHON_BLOCKS))])
def test_a_readme_python_block_runs_as_written_after_the_demo(block, tmp_path, monkeypatch, capsys):
    """In a fresh folder where `sdqes-edge demo` (the README's first command) has run, as a user would."""
    monkeypatch.chdir(tmp_path)
    if "sdqes-demo/" in block:  # it reads what the demo wrote
        run_demo(DEMO_SEED, Path("sdqes-demo"), next_command="sdqes-edge")
        capsys.readouterr()
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    if "CallbackSink" in block:  # the demo's lamp turns on, and the example's callback says so
        assert "The lamp is on." in capsys.readouterr().out
