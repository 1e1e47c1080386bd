"""The package's own source, read as a structure tool reads it: module names, the imports each makes.

The top-level layer folders map to one import namespace (pyproject's package-dir): ``runtime/x.py`` is
``sdqes_edge.runtime.x``. Imports are taken from the syntax tree, those inside functions included (a lazy
import is still a dependency), relative ones resolved.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYER_FOLDERS = {"sdqes_edge": "sdqes_edge", "export": "sdqes_edge.export", "runtime": "sdqes_edge.runtime",
                 "benchmarks": "sdqes_edge.benchmarks"}


@dataclass(frozen=True)
class Import:
    module: str  # the imported module, resolved (``from a.b import c`` -> "a.b")
    line: int
    relative_level: int  # 0 for an absolute import


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]

    def imports(self) -> list[Import]:
        found = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                found += [Import(alias.name, node.lineno, 0) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = self.package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.append(Import(target, node.lineno, node.level))
                # ``from package import submodule`` imports the submodule too.
                found += [Import(f"{target}.{alias.name}", node.lineno, node.level) for alias in node.names]
        return found


def package_modules() -> dict[str, Module]:
    modules = {}
    for folder, namespace in LAYER_FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO / folder).with_suffix("")
            if folder == "sdqes_edge" and relative.parts[0] in ("export", "runtime", "benchmarks"):
                continue
            parts = [p for p in relative.parts if p != "__init__"]
            name = ".".join([namespace, *parts])
            modules[name] = Module(name, path, ast.parse(path.read_text(), filename=str(path)))
    return modules


def python_sources() -> list[Path]:
    """Every Python file of the project: the package, its scripts and its tests."""
    folders = [*LAYER_FOLDERS, "scripts", "tests"]
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))
