"""The install locks (locks/*.txt): exact versions with every file's sha256, so a fresh machine
installs what CI tested, today and next month (docs/design.md "Installs from a lock").

    python3 tools/lock.py lock     # resolve today's newest compatible versions, rewrite locks/
    python3 tools/lock.py drift    # the same newest versions, unlocked, then the fast unit suite

Both resolve in scratch virtual environments under .cache/lock/ with the machine's pip, the way a
user's `pip install 'specrt[...]'` would: torch first at the version the export extra pins (on
these machines its CPU build lies in pip's find-links), then the project with its extras. `lock`
writes what got installed; hashes come from PyPI's JSON simple API (PEP 691) for every file of
that release, so the lock holds for any platform PyPI serves, or from the file pip chose where
PyPI has no such release (torch's local `+cpu` build).

Two locks: `dev.txt` (what `make setup` installs: every extra) and `runtime.txt` (the runtime's own
dependencies only, for `make runtime-only`), resolved inside `dev.txt`'s versions. Standard
library only, run with any Python >= 3.10.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "locks"
SCRATCH = ROOT / ".cache" / "lock"
TORCH = "torch==2.13.0"  # the CPU build (pyproject's export extra); unpinned pulls a CUDA build
EXTRAS = "export,dev,bench,serve,ray"  # what `make setup` installs
TOOLS = ("pip", "setuptools")  # installed from the lock too: the project builds with --no-build-isolation
PYPI = "https://pypi.org/simple/{}/"


def run(*cmd, **kw) -> str:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, text=True, stdout=subprocess.PIPE, **kw).stdout


def venv(path: Path, python: str = sys.executable) -> Path:
    """A new virtual environment at `path` with today's pip and setuptools; returns its python."""
    shutil.rmtree(path, ignore_errors=True)
    run(python, "-m", "venv", path)
    py = path / "bin" / "python"
    run(py, "-m", "pip", "install", "-q", "--upgrade", *TOOLS)
    return py


def freeze(py: Path) -> dict[str, str]:
    """{canonical name: version} of everything installed, the project itself left out."""
    out = run(py, "-m", "pip", "list", "--format=json", "--exclude-editable")
    pins = {canonical(d["name"]): d["version"] for d in json.loads(out)}
    pins.pop("specrt", None)
    return dict(sorted(pins.items()))


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_newest(path: Path) -> Path:
    """Today's newest versions of everything `make setup` installs, as a user's pip would pick them."""
    py = venv(path)
    run(py, "-m", "pip", "install", "-q", TORCH)
    run(py, "-m", "pip", "install", "-q", f"{ROOT}[{EXTRAS}]")
    run(py, "-m", "pip", "check")
    return py


def release_hashes(name: str, version: str) -> list[str]:
    """sha256 of every file PyPI holds for name==version (wheels for all platforms and the sdist)."""
    req = urllib.request.Request(PYPI.format(name), headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.load(resp)["files"]
    return sorted({f["hashes"]["sha256"] for f in files if file_version(f["filename"], name) == version})


def file_version(filename: str, name: str) -> str | None:
    """The version a wheel or sdist file name carries (normalised name prefix), else None."""
    stem = re.sub(r"\.(whl|tar\.gz|zip|tar\.bz2)$", "", filename)
    if stem == filename:
        return None
    head = canonical(stem).replace("-", "_")
    prefix = canonical(name).replace("-", "_") + "_"
    if not head.startswith(prefix):
        return None
    return stem[len(prefix):].split("-")[0]


def local_hash(py: Path, name: str, version: str) -> list[str]:
    """sha256 of the file pip itself picks for name==version (a build PyPI does not serve)."""
    with tempfile.TemporaryDirectory() as tmp:
        run(py, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, f"{name}=={version}")
        return [hashlib.sha256(f.read_bytes()).hexdigest() for f in Path(tmp).iterdir()]


def lock_lines(py: Path, pins: dict[str, str]) -> list[str]:
    lines = []
    for name, version in pins.items():
        hashes = release_hashes(name, version) or local_hash(py, name, version)
        if not hashes:
            sys.exit(f"no file found for {name}=={version}: cannot lock it")
        lines.append(f"{name}=={version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hashes))
    return lines


def write_lock(path: Path, what: str, py: Path, pins: dict[str, str]) -> None:
    head = [f"# {what}", f"# Written by `make lock` (python3 tools/lock.py lock) with Python "
            f"{run(py, '-c', 'import platform; print(platform.python_version())').strip()}; "
            "install with: pip install --require-hashes --no-deps -r " + path.relative_to(ROOT).as_posix(),
            "# then the project itself with --no-deps --no-build-isolation (docs/design.md \"Installs from a lock\")."]
    path.write_text("\n".join(head + lock_lines(py, pins)) + "\n")
    print(f"wrote {path} ({len(pins)} packages)")


def lock() -> None:
    dev = install_newest(SCRATCH / "dev")
    pins = freeze(dev)
    LOCKS.mkdir(exist_ok=True)
    constraints = SCRATCH / "dev-constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
    rt = venv(SCRATCH / "runtime")
    run(rt, "-m", "pip", "install", "-q", "-c", constraints, *TOOLS)
    run(rt, "-m", "pip", "install", "-q", "-c", constraints, ROOT)
    write_lock(LOCKS / "dev.txt", "Everything `make setup` installs (the runtime and every extra).", dev, pins)
    write_lock(LOCKS / "runtime.txt", "The runtime's own dependencies (`make runtime-only`): no torch.", rt, freeze(rt))


def drift() -> int:
    """Today's newest unpinned versions and the fast unit suite: what next month's lock will meet."""
    py = install_newest(SCRATCH / "drift")
    locked = dict(re.findall(r"^(\S+)==(\S+) ", (LOCKS / "dev.txt").read_text(), re.M))
    moved = {n: (locked.get(n), v) for n, v in freeze(py).items() if locked.get(n) != v}
    print("moved since the lock:", ", ".join(f"{n} {a} -> {b}" for n, (a, b) in moved.items()) or "nothing")
    run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", ROOT)
    bin_ = py.parent
    return subprocess.run([bin_ / "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", "tests"],
                          cwd=ROOT).returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("lock", "drift"))
    args = ap.parse_args()
    if args.command == "lock":
        lock()
    else:
        sys.exit(drift())


if __name__ == "__main__":
    main()
