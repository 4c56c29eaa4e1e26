"""No name the tests put on the import path may shadow an installed module (issue 49).

pytest's default (prepend) import mode puts every test folder without an `__init__.py`, and the
first folder above a test package, at the front of `sys.path`; conftest.py adds `tools/`. A
module or regular package in one of those folders then wins over an installed distribution's
module of the same name: transformers 5.25 imports Hugging Face's `kernels`, and a test package
`tests/runtime/kernels/` once broke the whole suite that way. This test reads the real
`sys.path` of the running session (every test module is collected by then) and fails on any such
name, so a rename is needed before a dependency can be shadowed, not after.

Only modules, extension modules and regular packages count: a folder without `__init__.py` is a
namespace portion, which Python uses only when no regular module of that name exists anywhere on
the path, so it cannot hide an installed one.
"""

from __future__ import annotations

import importlib.machinery
import sys
from importlib import metadata
from pathlib import Path

from paths import ROOT

OWN = {"specrt"}  # this project's own distribution (editable): its names are ours


def importable_names(folder: Path) -> set[str]:
    """Top-level names a folder on sys.path provides as modules or regular packages."""
    suffixes = tuple(importlib.machinery.all_suffixes())
    names = set()
    for entry in folder.iterdir():
        if entry.is_dir() and (entry / "__init__.py").is_file():
            names.add(entry.name)
        elif entry.is_file() and entry.name.endswith(suffixes):
            names.add(entry.name.split(".")[0])
    return names


def repo_path_entries() -> list[Path]:
    """The sys.path entries inside the repository, the virtual environment excluded."""
    prefix = Path(sys.prefix).resolve()
    out = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.is_dir() and path.is_relative_to(ROOT) and not path.is_relative_to(prefix):
            out.append(path)
    return out


def installed_top_levels() -> dict[str, str]:
    """{top-level module name: distribution} for every installed distribution but this project."""
    names = {}
    for dist in metadata.distributions():
        dist_name = dist.metadata["Name"] or "?"
        if dist_name.lower() in OWN:
            continue
        for name in top_levels(dist):
            names.setdefault(name, dist_name)
    return names


def top_levels(dist: metadata.Distribution) -> set[str]:
    listed = dist.read_text("top_level.txt")
    if listed:
        return {line.strip() for line in listed.splitlines() if line.strip()}
    names = set()
    for file in dist.files or ():
        first = file.parts[0]
        if first in ("..", "__pycache__") or first.endswith((".dist-info", ".egg-info", ".data")):
            continue
        names.add(first.split(".")[0] if len(file.parts) == 1 else first)
    return names


def test_the_tests_import_path_shadows_no_installed_module():
    entries = repo_path_entries()
    assert any(p == ROOT / "tests" for p in entries), entries  # the check sees pytest's inserts
    installed = installed_top_levels()
    clashes = [f"{entry.relative_to(ROOT)}/{name} shadows {name!r} of {installed[name]}"
               for entry in entries for name in sorted(importable_names(entry) & installed.keys())]
    assert not clashes, "rename these test modules or folders:\n" + "\n".join(clashes)


def test_the_check_sees_a_clash(tmp_path):
    """A folder holding a package named like an installed module (the old tests/runtime/kernels)
    is reported."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "plain").mkdir()  # a namespace folder: not counted
    (tmp_path / "numpy.py").write_text("")
    names = importable_names(tmp_path)
    assert names == {"kernels", "numpy"}
    assert "numpy" in installed_top_levels()
