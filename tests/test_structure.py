"""The layers and their import rules (README, "For developers"), and the size limits that keep code readable."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from source_tree import REPO, package_modules, python_sources

MODULES = package_modules()
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400

# What the device library may use from the core package: torch-free modules that define data and formats.
RUNTIME_MAY_USE = {"sdqes_edge.contract", "sdqes_edge.state", "sdqes_edge.errors", "sdqes_edge.files",
                   "sdqes_edge.path_checks",  # files.py's checks of a path up front (the standard library only)
                   "sdqes_edge.tokenizer", "sdqes_edge.traces", "sdqes_edge.metrics", "sdqes_edge.tolerances",
                   "sdqes_edge.package_builds", "sdqes_edge.compat",
                   "sdqes_edge.stopping"}  # (the standard library only: signals, and threads a stop may leave behind)
THIRD_PARTY_NEVER_IN_RUNTIME = {"torch", "onnx", "tqdm", "matplotlib"}


def internal_target(name: str) -> str | None:
    """The package module an import refers to (``sdqes_edge.state.StateSpec`` -> ``sdqes_edge.state``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def dependencies(module: str) -> dict[str, int]:
    """Package modules ``module`` imports (lazily or not), each with the line of its first import."""
    found: dict[str, int] = {}
    for imp in MODULES[module].imports():
        target = internal_target(imp.module)
        if target and target != module and not module.startswith(target + "."):  # a parent package is no edge
            found.setdefault(target, imp.line)
    return found


def where(module: str, line: int) -> str:
    return f"{MODULES[module].path.relative_to(REPO)}:{line}"


def test_the_runtime_imports_neither_torch_nor_export_nor_training_nor_the_command_line():
    wrong = []
    for name in (m for m in MODULES if m.startswith("sdqes_edge.runtime")):
        for imp in MODULES[name].imports():
            if imp.module.split(".")[0] in THIRD_PARTY_NEVER_IN_RUNTIME:
                wrong.append(f"{where(name, imp.line)} imports {imp.module}")
        for target, line in dependencies(name).items():
            if not target.startswith("sdqes_edge.runtime") and target not in RUNTIME_MAY_USE:
                wrong.append(f"{where(name, line)} imports {target}")
    assert not wrong, "the runtime must stay a torch-free library:\n" + "\n".join(wrong)


def test_only_the_command_line_imports_the_command_line():
    wrong = [f"{where(name, line)} imports {target}" for name in MODULES if not name.startswith("sdqes_edge.cli")
             for target, line in dependencies(name).items() if target.startswith("sdqes_edge.cli")]
    assert not wrong, "\n".join(wrong)


def test_export_imports_neither_the_command_line_nor_benchmarks_nor_the_demo():
    wrong = [f"{where(name, line)} imports {target}" for name in MODULES if name.startswith("sdqes_edge.export")
             for target, line in dependencies(name).items()
             if target.startswith(("sdqes_edge.cli", "sdqes_edge.benchmarks", "sdqes_edge.demo"))]
    assert not wrong, "\n".join(wrong)


def test_an_import_that_leaves_its_folder_is_absolute():
    wrong = sorted({f"{where(name, imp.line)}: write `from {imp.module.rpartition('.')[0] or imp.module} import ...`"
                    for name, module in MODULES.items() for imp in module.imports() if imp.relative_level > 1})
    assert not wrong, "\n".join(wrong)


def test_no_two_modules_import_each_other_through_any_chain():
    graph = {name: set(dependencies(name)) for name in MODULES}
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert not cycles, f"import cycles: {cycles}"


def test_no_function_is_longer_than_60_lines_and_no_module_longer_than_400():
    too_long = []
    for path in python_sources():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(REPO)}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "\n".join(too_long)


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)], capture_output=True,
                          text=True)
    if "No module named ruff" in done.stderr:
        pytest.fail("ruff is not installed: scripts/setup.sh --dev installs it (the dev extra)")
    assert done.returncode == 0, done.stdout[-4000:]
