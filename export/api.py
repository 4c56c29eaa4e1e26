"""`export_bundle`: target (+ draft) -> validated bundle folder. The CLI is a shell over this."""

from __future__ import annotations

import datetime as _dt
import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt.runtime.backends.harness import SequenceHarness
from specrt.runtime.backends.ort import OrtBackend
from specrt.runtime.bundle import genai
from specrt.runtime.bundle.manifest import (
    KV_DTYPE,
    SELF_DRAFT_PRECISION,
    KVLayout,
    Manifest,
    ModelEntry,
    TokenizerInfo,
    load_manifest,
)
from specrt.runtime.bundle.tokenizer import find_fim_tokens

from . import __version__, quant_target, tokcheck
from .arch import Arch, arch_from_model, numpy_weights
from .bundle import ExternalData, save_graph, staging
from .eagle import draft_arch, draft_weights, load_head
from .graph import EAGLE_FEATURES_OUT, FEATURES, GraphOptions, build_graph, graph_io
from .nbits import WEIGHT_ONLY
from .sources import SourceError, load_source, peek_source, resolve_source, sha256_file
from .tokcheck import VocabularyMismatch, check_same_vocabulary  # noqa: F401 (API: export.api.VocabularyMismatch)
from .validate import ParityError, Reference, check_decoder, check_eagle, draft_agreement

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


@dataclass(frozen=True)
class Settings:
    """What every export step reads."""

    max_seq_len: int
    max_draft_tokens: int
    precision: str  # the target's (and a separate draft's) graph precision
    lowering: str
    greedy_steps: int  # greedy tokens compared with transformers at each parity check
    accuracy_level: int = 4  # weight-only precisions: MatMulNBits compute (4: int8 activations, 0: fp32)
    lm_head_precision: str = ""  # weight-only precisions: the LM head's own ("": the target's)

    @property
    def max_t(self) -> int:  # widest call: a verification of max_draft_tokens + the target's token
        return self.max_draft_tokens + 1

    def graph(self, **kw) -> GraphOptions:
        return GraphOptions(**{"lowering": self.lowering, "precision": self.precision,
                               "max_seq_len": self.max_seq_len, "int4_accuracy_level": self.accuracy_level,
                               "lm_head_precision": self.lm_head_precision, **kw})


class Source:
    """A loaded model source: transformers model + tokenizer; its graph-ready form (`arch`,
    NumPy `weights`, views of the model's own tensors) is made when a step first reads it.
    `release()` drops the model once its graphs are written and its `reference` is taken, so a
    model's fp32 weights are in memory once while its graphs are built and not at all while
    onnxruntime loads them (docs/design.md, "Export memory")."""

    def __init__(self, ref: str, max_seq_len: int, echo: Callable[[str], None] | None = None):
        self.src = resolve_source(ref, echo=echo)
        self.model, self.tok = load_source(self.src)
        self.config = self.model.config
        self.max_seq_len = max_seq_len

    def reference(self, cfg: Settings) -> Reference:
        return Reference.of(self.model, self.arch.vocab, k=cfg.max_draft_tokens, steps=cfg.greedy_steps)

    def release(self) -> None:
        self.arch  # noqa: B018 (made while the model is there)
        self.__dict__.pop("weights", None)
        self.model = None
        gc.collect()

    @functools.cached_property
    def arch(self) -> Arch:
        return arch_from_model(self.model, self.max_seq_len)

    @functools.cached_property
    def weights(self) -> dict:
        return numpy_weights(self.model)


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
    trt: bool = False,
    draft_precision: str | None = None,
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
    target's precision). Returns the written manifest. Models are loaded one at a time and
    dropped before onnxruntime loads their graphs (a quantized target's parity check keeps its
    model until the check is done).
    """
    cfg = Settings(max_seq_len, max_draft_tokens, precision, lowering, greedy_steps, accuracy_level, lm_head_precision)
    kind = draft_kind(draft)
    _check_settings(cfg, kind, draft, k, trt)
    _check_draft_precision(cfg, kind, draft_precision)
    out = Path(out)
    step = Progress(4 + (kind != "none") + (kind == "model") + trt, echo)

    step(f"loading target {target}")
    tgt = Source(target, max_seq_len, echo)
    head = head_w = None
    if kind == "eagle":  # read before any graph is built: a wrong head file fails fast
        head = draft[len("eagle:"):]
        head_w = load_head(head, tgt.arch, tgt.src.describe().get("sha256"))
    if kind == "model":  # its tokenizer and config only: the model itself loads after the target's graphs
        d_tok, d_config = peek_source(resolve_source(draft, echo=echo))
        check_same_vocabulary(tgt.tok, d_tok, tgt.config, d_config)

    with staging(out) as tmp:
        step(f"building target graph ({lowering}, {precision})")
        t_entry, target_dec, probe, d_entry = target_entries(tmp, tgt, cfg, kind, draft, step, echo)
        if kind == "eagle":
            step(f"building draft graph ({draft})")
            d_entry = eagle_entry(tmp, tgt, target_dec, head, head_w, cfg, probe)
            tgt.release()
        del target_dec
        if kind == "model":
            d_entry = model_draft_entry(tmp, draft, cfg, probe, draft_precision, step, echo)
        if d_entry is not None:
            require_parity(d_entry, kind)
            d_entry.default_k = k or RECOMMENDED_K.get(draft, 0)

        if trt:
            step("building TensorRT plans")
            trt_plans(tmp, [e for e in (t_entry, d_entry) if e is not None])

        step("writing tokenizer and manifest")
        man = write_bundle(tmp, out.name, t_entry, d_entry, tgt)
        gc.collect()
    step(f"bundle ready: {out}")
    return man


def draft_kind(draft: str) -> str:
    """"none" | "self" (a quantized copy of the target) | "eagle" (a head file) | "model"."""
    if draft == "none":
        return "none"
    if draft in SELF_DRAFT_PRECISION:
        return "self"
    return "eagle" if draft.startswith("eagle:") else "model"


def _check_settings(cfg: Settings, kind: str, draft: str, k: int | None, trt: bool) -> None:
    if cfg.lowering not in LOWERINGS:
        raise ValueError(f"lowering must be one of {LOWERINGS}, got {cfg.lowering!r}")
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {cfg.precision!r}")
    if cfg.precision in WEIGHT_ONLY and cfg.lowering != "ort":
        raise ValueError(f"precision {cfg.precision} uses MatMulNBits, which only the 'ort' lowering has")
    if cfg.accuracy_level not in (0, 4) or cfg.lm_head_precision not in ("", "fp32", "int4", "int8"):
        raise ValueError("accuracy_level must be 0 or 4 and lm_head_precision one of fp32, int4, int8")
    if cfg.max_draft_tokens < 1 or cfg.max_seq_len < cfg.max_draft_tokens + 32:
        raise ValueError("need max_draft_tokens >= 1 and max_seq_len >= max_draft_tokens + 32")
    if k is not None and not 1 <= k <= cfg.max_draft_tokens:
        raise ValueError(f"k must be between 1 and max_draft_tokens ({cfg.max_draft_tokens}), got {k}")
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


# what each entry's parity compares against, for the gate's message
REFERENCE = {
    "target": "target graph failed parity with transformers",
    "model": "draft graph failed parity with transformers",
    "eagle": "EAGLE draft failed parity (target feature output vs transformers, draft graph vs its torch module)",
    "self": "self-draft graph failed its check",  # never: quantized drafts have no logit tolerance
}


def require_parity(entry: ModelEntry, kind: str) -> None:
    """The one parity gate: an entry whose export-time numbers did not pass never gets written.
    kind: "target", or the draft's kind."""
    if not entry.parity.get("passed"):
        raise ParityError(f"{REFERENCE[kind]}: {entry.parity}")


@dataclass
class Probe:
    """A prompt and the target's own greedy continuation (transformers): what draft agreement is
    measured on."""

    prompt: np.ndarray
    target_tokens: np.ndarray


def target_entries(tmp: Path, tgt: Source, cfg: Settings, kind: str, draft: str, step: Progress, echo=None
                   ) -> tuple[ModelEntry, SequenceHarness, Probe, ModelEntry | None]:
    """The target -> its graph, its entry with parity numbers against transformers, a decoder over
    it (the EAGLE check reads its features), the probe, and a self-draft's entry when `kind` is
    "self" (made from the same weights before the model is dropped). The torch model is released
    before any session exists, except for an EAGLE draft, whose check runs it, and a quantized
    target, whose parity is checked against the same (GGUF-dequantized or fake-quantized) weights
    in transformers (export/quant_target.py)."""
    ref = tgt.reference(cfg)
    probe = Probe(ref.prompt, ref.greedy_tokens)
    features = kind == "eagle"
    opts = cfg.graph(hidden_out=FEATURES if features else "")
    qw, quantization = quant_target.prepare(tgt, opts, echo)
    entry = _write_model(tmp, "target", tgt.arch, tgt.weights, opts, cfg.max_t, tgt.src.describe(), "export", qw)
    del qw
    entry.quantization = quantization
    self_entry = None
    if kind == "self":
        step(f"building draft graph ({draft})")
        q_opts = GraphOptions(lowering="ort", precision=SELF_DRAFT_PRECISION[draft], max_seq_len=cfg.max_seq_len)
        self_entry = _write_model(tmp, "draft", tgt.arch, tgt.weights, q_opts, cfg.max_t, tgt.src.describe(), draft)
    if not features and not quantization:
        tgt.release()
    dec = _decoder(tmp, entry, keep_hidden=features)
    if not quantization:
        entry.parity = check_decoder(dec, ref, k=cfg.max_draft_tokens, steps=cfg.greedy_steps,
                                     precision=cfg.precision).as_dict()
    else:
        if quantization["method"] == "rtn":
            quant_target.fake_quantize(tgt.model, tgt.weights, opts)
        entry.parity = quant_target.parity(tmp, entry, dec, tgt.model, opts, cfg.max_draft_tokens, cfg.greedy_steps,
                                           _decoder)
        if not features:
            tgt.release()
    require_parity(entry, "target")
    if self_entry is not None:
        del dec  # one session at a time
        dec = None
        # lossy by design (verification keeps the output exact), so logit parity has no
        # tolerance; agreement with the target's greedy tokens says how good a draft it is
        _draft_parity(tmp, self_entry, ref, cfg, probe, self_entry.precision)
    return entry, dec, probe, self_entry


def model_draft_entry(tmp: Path, ref: str, cfg: Settings, probe: Probe, draft_precision: str | None,
                      step: Progress, echo) -> ModelEntry:
    """A separate draft model -> its entry: at the target's precision held to the same parity as
    the target; weight-quantized (draft_precision) measured like a self-draft."""
    step(f"loading draft {ref}")
    d = Source(ref, cfg.max_seq_len, echo)
    reference = d.reference(cfg)
    step(f"building draft graph ({ref}{', ' + draft_precision if draft_precision else ''})")
    if draft_precision:
        opts, recipe = GraphOptions(lowering="ort", precision=draft_precision, max_seq_len=cfg.max_seq_len), f"model-{draft_precision}"
    else:
        opts, recipe = cfg.graph(), "model"
    entry = _write_model(tmp, "draft", d.arch, d.weights, opts, cfg.max_t, d.src.describe(), recipe)
    d.release()
    return _draft_parity(tmp, entry, reference, cfg, probe, opts.precision)


def _draft_parity(tmp, entry, reference: Reference, cfg: Settings, probe: Probe, precision: str) -> ModelEntry:
    dec = _decoder(tmp, entry)
    entry.parity = check_decoder(dec, reference, k=cfg.max_draft_tokens, steps=cfg.greedy_steps,
                                 precision=precision).as_dict()
    entry.parity["greedy_agreement_with_target"] = draft_agreement(dec, probe.target_tokens, probe.prompt)
    return entry


def eagle_entry(tmp: Path, tgt: Source, target_dec: SequenceHarness, head: str, head_w: dict, cfg: Settings,
                probe: Probe) -> ModelEntry:
    """An EAGLE head file -> the draft entry, checked against its torch module on the target
    graph's features. int4 on onnxruntime (the head is tiny; its LM head is the big matrix), the
    target's precision on the standard lowering (TensorRT)."""
    quantized = cfg.lowering == "ort"
    opts = cfg.graph(precision="int4" if quantized else cfg.precision, eagle=True, hidden_out=EAGLE_FEATURES_OUT)
    source = {"kind": "eagle-head", "ref": head, "sha256": sha256_file(Path(head))}
    entry = _write_model(tmp, "draft", draft_arch(tgt.arch), draft_weights(tgt.weights, head_w, head), opts,
                         cfg.max_t, source, "eagle")
    entry.parity = check_eagle(_decoder(tmp, entry), target_dec, tgt.model, head_w, probe.prompt,
                               probe.target_tokens, precision=cfg.precision, quantized=quantized)
    return entry


def trt_plans(tmp: Path, entries: list[ModelEntry]) -> None:
    """Standard-lowering graphs -> TensorRT plans for this GPU, recorded on their entries."""
    from .trt import save_engine

    for entry in entries:
        entry.trt_plans.append(save_engine(tmp, entry.graph.split("/")[0], entry))


def write_bundle(tmp: Path, name: str, t_entry: ModelEntry, d_entry: ModelEntry | None, tgt: Source) -> Manifest:
    """Entries + the target's tokenizer -> specrt.json (and genai_config.json), read back by the
    runtime's own check before the staging folder is swapped in."""
    tok_info = _save_tokenizer(tgt.tok, tgt.config, tmp)
    if tgt.src.gguf_file:  # the rebuilt tokenizer against the GGUF's own special tokens and template
        t_entry.parity["tokenizer_vs_gguf"] = tokcheck.check(tokcheck.read_gguf_tokens(tgt.src.path),
                                                             tmp / tok_info.file, tok_info)
    man = Manifest(
        name=name,
        exporter_version=__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        target=t_entry,
        draft=d_entry,
        tokenizer=tok_info,
    )
    man.save(tmp)
    genai.write(tmp, man)  # onnxruntime-genai reads the same graphs (runtime/bundle/genai.py)
    load_manifest(tmp)
    return man


def _write_model(tmp: Path, role: str, arch: Arch, w: dict, opts: GraphOptions, max_t: int,
                 source: dict, recipe: str, qw: dict | None = None) -> ModelEntry:
    sink = ExternalData(tmp / role)
    try:
        graph = build_graph(arch, w, opts, qw or None, sink=sink)
    finally:
        sink.close()
    name, data = save_graph(graph, tmp / role)
    del graph
    return ModelEntry(
        graph=f"{role}/{name}",
        data=f"{role}/{data}",
        lowering=opts.lowering,
        precision=opts.precision,
        family=arch.family.name,
        model_type=arch.model_type,
        vocab_size=arch.vocab,
        hidden_size=arch.hidden,
        num_heads=arch.heads,
        max_tokens_per_call=max_t,
        io=graph_io(opts),
        kv=KVLayout(arch.layers, arch.kv_heads, arch.head_dim, KV_DTYPE[opts.precision], opts.max_seq_len),
        source=source,
        recipe=recipe,
    )


def _decoder(folder: Path, entry: ModelEntry, keep_hidden: bool = False) -> SequenceHarness:
    # float graphs unpacked: the checks run tens of calls, and a prepacking session peaks at twice
    # the weights while it is built (runtime/bundle/memory.py); MatMulNBits graphs are packed regardless
    return SequenceHarness(OrtBackend(folder / entry.graph, entry, prepack=False), entry.graph.split("/")[0], keep_hidden)


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
    return TokenizerInfo(
        file="tokenizer.json",
        config="tokenizer_config.json",
        chat_template=tok.chat_template if isinstance(tok.chat_template, str) else None,
        bos_token_id=tok.bos_token_id,
        eos_token_ids=sorted(int(e) for e in eos),
        pad_token_id=tok.pad_token_id,
        fim=find_fim_tokens(vocab),
    )

