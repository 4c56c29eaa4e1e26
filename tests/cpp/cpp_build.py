"""What the C API tests share: `make cpp` run once per session, specrt-cpp run on a bundle, and
programs compiled against cpp/include/specrt.h as a user would (docs/cpp.md)."""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path

from paths import ROOT

BUILD = ROOT / ".cache" / "cpp"
INCLUDE = ROOT / "cpp" / "include"
EXAMPLES = ROOT / "cpp" / "examples"


@cache
def build() -> Path:
    """`make cpp` (nothing to do when built) -> the build folder."""
    r = subprocess.run(["make", "-s", "cpp"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"make cpp failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return BUILD


def run_cpp(bundle, prompt: list[int] | None, *flags: str, timeout: float = 600, env: dict | None = None) -> tuple[int, dict]:
    """specrt-cpp BUNDLE --prompt-ids ... FLAGS -> (exit status, its JSON object). env: variables
    added to the environment."""
    args = [str(build() / "specrt-cpp"), str(bundle), *flags]
    if prompt is not None:
        args += ["--prompt-ids", ",".join(map(str, prompt))]
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert r.stdout.strip(), f"specrt-cpp printed nothing (exit {r.returncode}):\n{r.stderr[-3000:]}"
    return r.returncode, json.loads(r.stdout)


def compile_program(source: Path, out: Path) -> Path:
    """A C (.c, C99) or C++ (.cc, C++17) program against specrt.h and libspecrt, warnings as
    errors -> the executable."""
    lib = build()
    compiler = ["gcc", "-std=c99", "-pedantic"] if source.suffix == ".c" else ["g++", "-std=c++17"]
    cmd = [*compiler, "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", str(source), "-o", str(out),
           f"-L{lib}", "-lspecrt", f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}"
    return out
