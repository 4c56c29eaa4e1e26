"""The layout's own rules (issue 34): modules small enough to read, functions simple enough to
follow, and imports that flow one way. Checked over the source tree, not the installed copy."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"specrt": "specrt", "specrt.export": "export", "specrt.runtime": "runtime"}
MAX_LINES = {"runtime": 400, "export": 400, "specrt": 250}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((pkg, *parts))
            mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


@pytest.mark.parametrize("folder", sorted(MAX_LINES))
def test_no_module_over_its_length(folder):
    limit = MAX_LINES[folder]
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > limit}
    assert not long, f"modules over {limit} lines: {long}"


def test_no_function_over_complexity_10():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the dev extra"
    out = subprocess.run([ruff, "check", "--no-cache", "--select", "C901", "--config",
                          "lint.mccabe.max-complexity=10", "runtime", "export"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _imports(name: str, path: Path) -> set[str]:
    """Every specrt module `name` imports, at any depth of the file (a lazy import inside a
    function still ties the two modules together); `if TYPE_CHECKING:` blocks are left out."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
    return {m for m in found if m in MODULES and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _graph() -> dict[str, set[str]]:
    # `python -m package` runs package/__main__.py, which imports its package by design
    g = {m: _imports(m, p) for m, p in MODULES.items()}
    return {m: {d for d in deps if not (m.endswith(".__main__") and m.startswith(d + "."))} for m, deps in g.items()}


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_runtime_never_imports_the_exporter():
    leaks = {m: sorted(d for d in deps if d.startswith("specrt.export"))
             for m, deps in _graph().items() if m.startswith("specrt.runtime")}
    assert not {m: d for m, d in leaks.items() if d}
