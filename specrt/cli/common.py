"""What the commands share: the error exit, the bundle folder option, the flags of the load
options (declared once here from `LoadOptions`, runtime/options.py), and the one progress
printer."""

from __future__ import annotations

import os
import sys
from dataclasses import fields, replace

import click

from specrt.runtime.options import DEVICES, DRAFTS, LoadOptions

DEFAULT_ENGINES = "engines/default"


def engines_default() -> str:
    return os.environ.get("SPECRT_ENGINES", DEFAULT_ENGINES)


def fail(msg: str, code: int = 2):
    click.echo(f"specrt: error: {msg}", err=True)
    sys.exit(code)


def progress(i: int, n: int, what: str) -> None:
    """`[i/n] what` on one terminal line, rewritten in place (stderr)."""
    click.echo(f"\r[{i + 1}/{n}] {what:<60}", nl=False, err=True)


engines_option = click.option("--engines", default=None, help="bundle folder (default engines/default or $SPECRT_ENGINES)")


class CountOr(click.ParamType):
    """A positive integer, or one word that means something else (`word` -> `means`)."""

    def __init__(self, word: str, means):
        self.word, self.means, self.name = word, means, f"N|{word}"

    def convert(self, value, param, ctx):
        if value is None or value == self.means or isinstance(value, int) and value >= 1:
            return value
        if value == self.word:
            return self.means
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            self.fail(f"{value!r} is neither a positive integer nor {self.word!r}", param, ctx)
        return n


Slots = CountOr("auto", "auto")  # --max-batch: KV slots, or as many as fit in memory
Window = CountOr("none", None)  # --draft-window: tokens a separate draft reads, or all of them


# LoadOptions field -> (its flag, click's settings); the default is the command's (`load_flags`)
LOAD_FLAGS = {
    "draft": ("--draft", dict(type=click.Choice(DRAFTS), help=(
        "model: the bundle's draft; none; ngram: prompt lookup; auto: n-gram when it matches, else the model "
        "(default: model if the bundle has a draft, else none)"))),
    "k": ("--k", dict(type=int, help="draft tokens per round, the most with adaptive k (default: the bundle's "
                                      "`default_k`, else 4)")),
    "adaptive": ("--adaptive/--fixed-k", dict(help="choose k per round from measured costs and acceptance, capped "
                                                   "by the batch plan (drafts only where it pays under load)")),
    "device": ("--device", dict(type=click.Choice(DEVICES), help="cpu / cuda: onnxruntime execution provider; "
                                                                 "trt: the bundle's TensorRT plans")),
    "threads": ("--threads", dict(type=int, help="intra-op threads (default: all cores)")),
    "max_batch": ("--max-batch", dict(type=Slots, help="KV slots: requests decoded at once; auto: as many as fit "
                                                         "in memory (at most 64)")),
    "max_seq_len": ("--max-seq-len", dict(type=int, help="context per slot (default: the bundle's S_max): shorter "
                                                         "slots, more of them")),
    "memory_fraction": ("--memory-fraction", dict(type=float, help="share of the available memory that --max-batch "
                                                                   "auto fills (default 0.9; docs/design.md)")),
    "draft_window": ("--draft-window", dict(type=Window, help="committed tokens a separate draft model reads to "
                                                                "catch up on a long prompt; none: all of them")),
    "max_queue": ("--max-queue", dict(type=int, help="requests waiting for a slot before 503")),
    "hugepages": ("--hugepages/--no-hugepages", dict(help="2 MiB pages for the sessions' memory: faster steps for a "
                                                          "longer load (pays on long runs; docs/benchmarks.md §1)")),
    "packed": ("--packed/--no-packed", dict(help="run the target's packed graph: one call per step for every request "
                                                 "(docs/design.md \"Packed calls\"); --no-packed: the bundle graph")),
    "kernels": ("--kernels/--no-kernels", dict(help="run the packed graph's 4-bit projections on specrt's own operator "
                                                   "where the bundle has it and `make kernels` built it (docs/design.md "
                                                   "\"Our own kernel\"); --no-kernels: onnxruntime's MatMulNBits")),
    "prefix_cache": ("--prefix-cache/--no-prefix-cache", dict(help="reuse the KV rows of prompt prefixes held by "
                                                                   "finished or running requests (chat turns, "
                                                                   "system prompts)")),
}
_LOAD_FIELDS = {f.name for f in fields(LoadOptions)}


def load_flags(base: LoadOptions, *names: str, **defaults):
    """The flags of these LoadOptions fields, defaulting to `base`'s values (or `defaults`',
    where a command must tell "not given" apart). The command receives them by field name;
    `loading` turns them into its LoadOptions."""

    def add(f):
        for name in reversed(names):
            flag, kw = LOAD_FLAGS[name]
            default = defaults[name] if name in defaults else getattr(base, name)
            f = click.option(flag, name, default=default, show_default=default is not None, **kw)(f)
        return f

    return add


def loading(base: LoadOptions, kw: dict) -> LoadOptions:
    """`base` with the load flags in `kw` (removed from it) replaced; a refused value exits 2."""
    given = {k: kw.pop(k) for k in list(kw) if k in _LOAD_FIELDS}
    try:
        return replace(base, **given)
    except ValueError as e:
        fail(str(e))
