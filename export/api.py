"""`export_bundle`: target (+ draft) -> validated bundle folder, by the steps of export/steps.py in
order (what runs when is about memory: docs/design.md, "Export memory"); its argument checks; the
tokenizer and manifest writing. The CLI is a shell over this."""

from __future__ import annotations

import datetime as _dt
import gc
import time
from collections.abc import Callable
from pathlib import Path

from specrt.runtime.bundle import genai
from specrt.runtime.bundle.manifest import (
    SELF_DRAFT_PRECISION,
    Manifest,
    ModelEntry,
    TokenizerInfo,
    load_manifest,
)
from specrt.runtime.bundle.tokenizer import end_of_generation, find_fim_tokens

from . import packed, tokcheck
from .bundle import staging
from .eagle import load_head
from .emitter import kv_buffer_dtype
from .errors import SourceError
from .gguf_stream import forget_readers
from .nbits import WEIGHT_ONLY
from .sources import peek_source, resolve_source
from .steps import (
    LoadedModel,
    Probe,
    Settings,
    check_target,
    eagle_entry,
    measure_draft,
    model_draft_entry,
    require_parity,
    self_draft_entry,
    subset_draft,
    target_entry,
)
from .tokcheck import VocabularyMismatch, check_same_vocabulary  # noqa: F401 (API: export.api.VocabularyMismatch)
from .version import __version__
from .weights_once import drop_bundle, recipe

LOWERINGS = ("ort", "standard")
PRECISIONS = ("fp32", "fp16", "int4", "int8", "gguf")  # int4/int8: RTN, gguf: the file's own blocks
DRAFT_PRECISIONS = ("int8", "int4")  # a separate draft's weight-only quantization (the self-drafts' recipe)
# draft tokens per round written to the manifest when the caller names none: the best fixed k
# measured for each self-draft on chat (docs/benchmarks.md §2c, §4); others: the runtime's default
RECOMMENDED_K = {"self-int8": 5, "self-int4": 2}
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "</s>", "<eos>")


class Progress:
    def __init__(self, total: int, echo: Callable[[str], None] | None):
        self.total, self.n, self.echo, self.t0 = total, 0, echo, time.perf_counter()

    def __call__(self, msg: str):
        self.n += 1
        if self.echo:
            self.echo(f"[{self.n}/{self.total}] {msg}  (+{time.perf_counter() - self.t0:.0f}s)")


def export_bundle(
    target: str,
    out: str | Path,
    draft: str = "self-int8",
    *,
    k: int | None = None,
    max_seq_len: int = 2048,
    max_draft_tokens: int = 16,
    precision: str = "fp32",
    lowering: str = "ort",
    greedy_steps: int = 32,
    accuracy_level: int = 4,
    lm_head_precision: str = "",
    kv_dtype: str = "auto",
    trt: bool = False,
    draft_precision: str | None = None,
    draft_vocab: int = 0,
    portable: bool = True,
    echo: Callable[[str], None] | None = print,
) -> Manifest:
    """Export `target` (and a draft) into the bundle folder `out`, validated against transformers.

    draft: "self-int4" / "self-int8" (int4 / int8 MatMulNBits copy of the target, ort lowering),
    "eagle:<head file>" (a one-layer EAGLE head trained for this target, see export/eagle.py),
    "none", or another model source (same vocabulary required).
    k: draft tokens per round recorded as the draft's `default_k` (None: RECOMMENDED_K for self
    drafts, else unset). precision: "fp32" | "fp16" | "int4" / "int8" (weight-only RTN, any
    source) | "gguf" (the GGUF file's own blocks, export/gguf_import.py); accuracy_level and
    lm_head_precision apply to the weight-only ones (docs/design.md). draft_precision: "int8" /
    "int4" quantizes a separate draft model's weights with the self-drafts' recipe (None: the
    target's precision). kv_dtype: "auto" (KV buffers in the activations' dtype) | "fp16" (float16
    KV in every graph of the bundle, ort lowering; parity then held to fp16's tolerance).
    draft_vocab: > 0 cuts a separate draft model's LM head to that many most frequent tokens
    (export/vocab_subset.py; exact: the draft only proposes). portable: False stores a model that has
    kernel graphs (export/kernel_graph.py) as those only, its weights once (export/weights_once.py;
    `python -m specrt.export.portable` adds the portable graphs later). Returns the written manifest. Models are loaded one at a time and
    dropped before onnxruntime loads their graphs (a quantized target's parity check keeps its
    model until the check is done).
    """
    args = dict(draft=draft, k=k, max_seq_len=max_seq_len, max_draft_tokens=max_draft_tokens, precision=precision,
                lowering=lowering, greedy_steps=greedy_steps, accuracy_level=accuracy_level,
                lm_head_precision=lm_head_precision, kv_dtype=kv_dtype, trt=trt, draft_precision=draft_precision,
                draft_vocab=draft_vocab, portable=portable)
    cfg = Settings(max_seq_len, max_draft_tokens, precision, lowering, greedy_steps, accuracy_level, lm_head_precision,
                   kv_dtype, portable)
    kind = draft_kind(draft)
    _check_settings(cfg, kind, draft, k, trt, portable)
    _check_draft_precision(cfg, kind, draft_precision)
    _check_draft_vocab(kind, draft_vocab)
    out = Path(out)
    forget_readers()  # nothing parsed by an earlier export (one that failed, or a file rewritten since)
    tokcheck.read_gguf_tokens.cache_clear()
    step = Progress(4 + (kind != "none") + (kind == "model") + bool(draft_vocab) + trt, echo)

    step(f"loading target {target}")
    # a GGUF target is read tensor by tensor (no fp32 copy) unless its checks need the whole
    # torch model: an EAGLE head's (features), an RTN target's (its fake-quantized weights)
    tgt = LoadedModel(target, max_seq_len, echo, stream=kind != "eagle" and precision not in ("int4", "int8"))
    head_w = _read_before_graphs(tgt, kind, draft, echo)

    with staging(out) as tmp:
        ref = tgt.reference(cfg)
        step(f"building target graph ({lowering}, {precision})")
        t_entry = target_entry(tmp, tgt, cfg, features=kind == "eagle", echo=echo)
        if packed.packable(t_entry):  # its packed and kernel graphs first: the check observes what a load runs
            packed.pack_entry(tmp, t_entry, gguf=tgt.src.path if tgt.src.gguf_file else None)
        d_entry = None
        if kind == "self":  # from the same weights, before the target's check releases them
            step(f"building draft graph ({draft})")
            d_entry = self_draft_entry(tmp, tgt, cfg, draft)
        target_dec = check_target(tmp, t_entry, tgt, cfg, ref, keep_features=kind == "eagle")
        # the target's greedy continuation (a lazy reference's: the checked graph's own tokens)
        probe = Probe(ref.prompt, ref.greedy_tokens)
        if kind == "self":
            measure_draft(tmp, d_entry, ref, cfg, probe)
        elif kind == "eagle":
            step(f"building draft graph ({draft})")
            d_entry = eagle_entry(tmp, tgt, target_dec, draft[len("eagle:"):], head_w, cfg, probe)
            tgt.release()
        del target_dec, ref
        if kind == "model":
            d_entry = model_draft_entry(tmp, draft, cfg, probe, draft_precision, step, echo)
        if d_entry is not None:
            require_parity(d_entry, kind)
        if draft_vocab:
            step(f"cutting the draft's LM head to {draft_vocab} tokens")
            subset_draft(tmp, d_entry, tgt.tok.backend_tokenizer, draft_vocab, probe)
        if d_entry is not None:
            d_entry.default_k = k or RECOMMENDED_K.get(draft, 0)

        if trt:
            step("building TensorRT plans")
            trt_plans(tmp, [e for e in (t_entry, d_entry) if e is not None])

        step("writing tokenizer and manifest")
        man = _write(tmp, out.name, t_entry, d_entry, tgt, recipe({"target": target, **args}), echo)
        forget_readers()  # the files' parsed metadata, kept for this export only
        tokcheck.read_gguf_tokens.cache_clear()
        gc.collect()
    step(f"bundle ready: {out}")
    return man


def _write(tmp: Path, name: str, t_entry, d_entry, tgt, args: dict, echo) -> Manifest:
    """The bundle's tokenizer and manifest; without portable graphs (args' `portable`), each
    model with kernel graphs then keeps only those (export/weights_once.py)."""
    man = write_bundle(tmp, name, t_entry, d_entry, tgt, args)
    if args.get("portable", True):
        return man
    drop_bundle(tmp, man, echo)
    return load_manifest(tmp)


def draft_kind(draft: str) -> str:
    """"none" | "self" (a quantized copy of the target) | "eagle" (a head file) | "model"."""
    if draft == "none":
        return "none"
    if draft in SELF_DRAFT_PRECISION:
        return "self"
    return "eagle" if draft.startswith("eagle:") else "model"


def _read_before_graphs(tgt: LoadedModel, kind: str, draft: str, echo) -> dict | None:
    """What fails fast, before any graph is built: an EAGLE head file read against the target
    (-> its weights), a separate draft's tokenizer and config against the target's vocabulary
    (its model loads after the target's graphs are checked and dropped)."""
    if kind == "eagle":
        return load_head(draft[len("eagle:"):], tgt.arch, tgt.src.describe().get("sha256"))
    if kind == "model":
        d_tok, d_config = peek_source(resolve_source(draft, echo=echo))
        check_same_vocabulary(tgt.tok, d_tok, tgt.config, d_config)
    return None


def _check_settings(cfg: Settings, kind: str, draft: str, k: int | None, trt: bool, portable: bool = True) -> None:
    if cfg.lowering not in LOWERINGS:
        raise ValueError(f"lowering must be one of {LOWERINGS}, got {cfg.lowering!r}")
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {cfg.precision!r}")
    if cfg.precision in WEIGHT_ONLY and cfg.lowering != "ort":
        raise ValueError(f"precision {cfg.precision} uses MatMulNBits, which only the 'ort' lowering has")
    kv_buffer_dtype(cfg.graph())  # refuses a kv_dtype it does not know, or fp16 KV off the ort lowering
    if cfg.accuracy_level not in (0, 4) or cfg.lm_head_precision not in ("", "fp32", "int4", "int8"):
        raise ValueError("accuracy_level must be 0 or 4 and lm_head_precision one of fp32, int4, int8")
    if cfg.max_draft_tokens < 1 or cfg.max_seq_len < cfg.max_draft_tokens + 32:
        raise ValueError("need max_draft_tokens >= 1 and max_seq_len >= max_draft_tokens + 32")
    if k is not None and not 1 <= k <= cfg.max_draft_tokens:
        raise ValueError(f"k must be between 1 and max_draft_tokens ({cfg.max_draft_tokens}), got {k}")
    if not portable and cfg.lowering != "ort":
        raise ValueError("portable = false keeps only the kernel graphs, which the 'ort' lowering has")
    if trt and cfg.lowering != "standard":
        raise ValueError("TensorRT plans are built from the standard lowering: add --lowering standard")
    if kind == "self" and cfg.lowering != "ort":
        raise ValueError(f"the {draft} draft uses MatMulNBits, which only the 'ort' lowering has; "
                         "pass --draft none or a separate draft model with --lowering standard")


def _check_draft_precision(cfg: Settings, kind: str, draft_precision: str | None) -> None:
    if draft_precision is None:
        return
    if draft_precision not in DRAFT_PRECISIONS:
        raise ValueError(f"draft precision must be one of {DRAFT_PRECISIONS}, got {draft_precision!r}")
    if kind != "model":
        raise ValueError("a draft precision applies to a separate draft model; the self drafts name "
                         "theirs (self-int8, self-int4)")
    if cfg.lowering != "ort":
        raise ValueError(f"an {draft_precision} draft uses MatMulNBits, which only the 'ort' lowering has")


def _check_draft_vocab(kind: str, draft_vocab: int) -> None:
    if not draft_vocab:
        return
    if kind != "model":
        raise ValueError("a draft vocabulary subset applies to a separate draft model (a self-draft's or "
                         "EAGLE head's step is mostly not its LM head)")
    if draft_vocab < 0:
        raise ValueError(f"a draft vocabulary subset must be a positive number of tokens, got {draft_vocab}")


def trt_plans(tmp: Path, entries: list[ModelEntry]) -> None:
    """Standard-lowering graphs -> TensorRT plans for this GPU, recorded on their entries."""
    from .trt import save_engine

    for entry in entries:
        entry.trt_plans.append(save_engine(tmp, entry.graph.split("/")[0], entry))


def write_bundle(tmp: Path, name: str, t_entry: ModelEntry, d_entry: ModelEntry | None, tgt: LoadedModel,
                 export: dict | None = None) -> Manifest:
    """Entries + the target's tokenizer -> specrt.json (and genai_config.json), read back by the
    runtime's own check before the staging folder is swapped in."""
    tok_info = _save_tokenizer(tgt.tok, tgt.config, tmp)
    if tgt.src.gguf_file:  # the rebuilt tokenizer against the GGUF's own special tokens and template
        gguf = tokcheck.read_gguf_tokens(tgt.src.path)
        tok_info.eog_token_ids = end_of_generation(tok_info.eos_token_ids, tok_info.fim, gguf.ends.values())
        t_entry.parity["tokenizer_vs_gguf"] = tokcheck.check(gguf, tmp / tok_info.file, tok_info)
    man = Manifest(
        name=name,
        exporter_version=__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        target=t_entry,
        draft=d_entry,
        tokenizer=tok_info,
        export=export or {},
    )
    man.save(tmp)
    genai.write(tmp, man)  # onnxruntime-genai reads the same graphs (runtime/bundle/genai.py)
    if packed.packable(t_entry):  # one call for many sequences (export/packed.py)
        packed.pack_bundle(tmp, gguf=tgt.src.path if tgt.src.gguf_file else None, skip_packed=True)
    return load_manifest(tmp)


def _save_tokenizer(tok, config, tmp: Path) -> TokenizerInfo:
    tok.save_pretrained(str(tmp))
    if not (tmp / "tokenizer.json").is_file():
        raise SourceError("the model's tokenizer has no fast (tokenizers) version; cannot bundle it")
    vocab = tok.get_vocab()
    eos = set()
    for cand in (tok.eos_token_id, getattr(config, "eos_token_id", None)):
        eos.update(cand if isinstance(cand, list) else [cand] if cand is not None else [])
    specials = set(tok.all_special_tokens) | set(getattr(tok, "added_tokens_encoder", {}) or {})
    eos.update(vocab[s] for s in END_OF_TURN if s in vocab and s in specials)
    fim = find_fim_tokens(vocab)
    return TokenizerInfo(
        file="tokenizer.json",
        config="tokenizer_config.json",
        chat_template=tok.chat_template if isinstance(tok.chat_template, str) else None,
        bos_token_id=tok.bos_token_id,
        eos_token_ids=sorted(int(e) for e in eos),
        pad_token_id=tok.pad_token_id,
        fim=fim,
        eog_token_ids=end_of_generation(eos, fim),
    )

