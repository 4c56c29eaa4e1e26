"""The layout's own rules (issues 34, 53): modules small enough to read, functions simple enough
to follow, imports that flow one way (no cycle, and no runtime package importing one above it
in `LAYERS`), and features declared rather than probed. Checked over the source tree, not the
installed copy."""

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


def _imports(name: str, path: Path, typing: bool = False) -> set[str]:
    """Every specrt module `name` imports, at any depth of the file (a lazy import inside a
    function still ties the two modules together); `if TYPE_CHECKING:` blocks are left out
    unless `typing` (a name a module only annotates with is still a name it knows)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    skip = set() if typing else {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
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


# runtime's packages from the bottom up (docs/design.md "Runtime", "Layers"): a module imports
# from its own layer and the layers below, never from one above. A "package.module" entry puts
# that module apart from the rest of its package; "" is runtime/__init__.py, the public face.
LAYERS = [
    ["errors"],
    ["kernels"],
    ["bundle"],  # what a bundle is: manifest, tokenizer and its token pieces, memory sizing, 2 MiB pages
    ["backends"],  # one graph over a KV pool; the protocols the engine drives
    ["sampling"],  # logits -> tokens: draws, penalties, grammars, verification
    ["drafters"],
    ["policy"],  # how far to draft: costs, acceptance, the batch plan
    ["engine"],  # requests, slots, the step scheduler, the round
    ["text"],  # a request's output as text: detokenizing, stop strings, chat, tool calls, FIM
    ["options"],
    ["bundle.loader", "bundle.describe"],  # a load: models built from a bundle and options
    ["pipeline"],
    ["serve", "bench"],
    [""],
]


def _layer(module: str) -> int:
    """The layer of a runtime module (its own entry, else its package's)."""
    rel = module.removeprefix("specrt.runtime").removeprefix(".")
    where = {name: i for i, names in enumerate(LAYERS) for name in names}
    parts = rel.split(".") if rel else [""]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in where:
            return where[".".join(parts[:n])]
    raise AssertionError(f"{module} is in no layer of LAYERS: add it")


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() if m.startswith("specrt.runtime")
                  for d in deps if d.startswith("specrt.runtime") and _layer(d) > _layer(m))


def test_no_runtime_package_imports_one_above_it():
    graph = {m: _imports(m, p, typing=True) for m, p in MODULES.items() if m.startswith("specrt.runtime")}
    assert _upward(graph) == []


def test_the_layer_check_finds_an_upward_import():
    up = {"specrt.runtime.sampling.processing": {"specrt.runtime.engine.request", "specrt.runtime.bundle.manifest"},
          "specrt.runtime.bundle.loader": {"specrt.runtime.backends.ort"},
          "specrt.runtime.bundle.tokenizer": {"specrt.runtime.text.toolcalls"}}
    assert _upward(up) == ["specrt.runtime.bundle.tokenizer -> specrt.runtime.text.toolcalls",
                           "specrt.runtime.sampling.processing -> specrt.runtime.engine.request"]


# getattr(x, "name", default) and hasattr(x, "name") in runtime/: whatever the runtime reads of
# its own objects is declared on their protocols (runtime/backends/protocol.py,
# runtime/drafters/protocol.py, runtime/serve/shape.py), so a probe is left only for objects of
# other libraries, named here with the reason. A class reading its own lazily set members
# (`getattr(self, "_cache", None)`) is not a probe.
PROBES_ALLOWED = {
    ("runtime/backends/trt.py", "self.engine"): "TensorRT's engine: get_aliased_input_tensor is newer than some releases",
    ("runtime/bench/peer.py", "gen"): "onnxruntime-genai's Generator: speculative stats only in some releases",
    ("runtime/bench/serve_load.py", "usage"): "the openai client's usage: prompt_tokens_details only from some servers",
    ("runtime/pipeline.py", "self._local"): "a threading.local: a thread that has not generated has no `last`",
    ("runtime/serve/ray/router.py", "pending.args[0]"): "Ray's pending call: only engine calls carry prompt ids",
}


def _probes(path: Path) -> set[str]:
    """The objects a module probes (getattr with a default, hasattr), as written."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3)):
            found.add(ast.unparse(node.args[0]))
    return found - {"self"}


def test_no_getattr_probe_in_the_runtime_outside_its_list():
    probes = {(str(p.relative_to(ROOT)), obj) for p in sorted((ROOT / "runtime").rglob("*.py")) for obj in _probes(p)}
    assert probes - set(PROBES_ALLOWED) == set()
    assert set(PROBES_ALLOWED) - probes == set(), "an allowed probe is gone: drop it from the list"


def test_the_probe_check_finds_a_probe(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("a = getattr(model, 'packs', False)\nb = hasattr(r.drafter, 'lag')\nc = getattr(self, '_x', None)\n"
                 "d = getattr(entry, name)\n")
    assert _probes(f) == {"model", "r.drafter"}
