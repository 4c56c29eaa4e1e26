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

from ..runtime import genai
from ..runtime.backends.ort import OrtBackend
from ..runtime.decoder import Decoder
from ..runtime.manifest import (
    KV_DTYPE,
    SELF_DRAFT_PRECISION,
    KVLayout,
    Manifest,
    ModelEntry,
    TokenizerInfo,
    load_manifest,
)
from . import __version__, quant_target
from .arch import Arch, arch_from_model, numpy_weights
from .bundle import save_graph, staging
from .eagle import draft_arch, draft_weights, load_head
from .graph import EAGLE_FEATURES_OUT, FEATURES, GraphOptions, build_graph, graph_io
from .nbits import WEIGHT_ONLY
from .sources import SourceError, load_source, resolve_source, sha256_file
from .validate import (
    ParityError,
    check_decoder,
    check_eagle,
    draft_agreement,
    probe_tokens,
    reference_greedy,
)

LOWERINGS = ("ort", "standard")
PRECISIONS = ("fp32", "fp16", "int4", "int8", "gguf")  # int4/int8: RTN, gguf: the file's own blocks
# draft tokens per round written to the manifest when the caller names none: the best fixed k
# measured for each self-draft on chat (docs/benchmarks.md §2c, §4); others: the runtime's default
RECOMMENDED_K = {"self-int8": 5, "self-int4": 2}
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "</s>", "<eos>")


class VocabularyMismatch(ValueError):
    pass


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
    NumPy `weights`) is made when a step first reads it."""

    def __init__(self, ref: str, max_seq_len: int):
        self.src = resolve_source(ref)
        self.model, self.tok = load_source(self.src)
        self.max_seq_len = max_seq_len

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
    echo: Callable[[str], None] | None = print,
) -> Manifest:
    """Export `target` (and a draft) into the bundle folder `out`, validated against transformers.

    draft: "self-int4" / "self-int8" (int4 / int8 MatMulNBits copy of the target, ort lowering),
    "eagle:<head file>" (a one-layer EAGLE head trained for this target, see export/eagle.py),
    "none", or another model source (same vocabulary required).
    k: draft tokens per round recorded as the draft's `default_k` (None: RECOMMENDED_K for self
    drafts, else unset). precision: "fp32" | "fp16" | "int4" / "int8" (weight-only RTN, any
    source) | "gguf" (the GGUF file's own blocks, export/gguf_import.py); accuracy_level and
    lm_head_precision apply to the weight-only ones (docs/design.md). Returns the written manifest.
    """
    cfg = Settings(max_seq_len, max_draft_tokens, precision, lowering, greedy_steps, accuracy_level, lm_head_precision)
    kind = draft_kind(draft)
    _check_settings(cfg, kind, draft, k, trt)
    out = Path(out)
    step = Progress(4 + (kind != "none") + (kind == "model") + trt, echo)

    step(f"loading target {target}")
    tgt = Source(target, max_seq_len)
    head = head_w = None
    if kind == "eagle":  # read before any graph is built: a wrong head file fails fast
        head = draft[len("eagle:"):]
        head_w = load_head(head, tgt.arch, tgt.src.describe().get("sha256"))
    separate = None
    if kind == "model":
        step(f"loading draft {draft}")
        separate = Source(draft, max_seq_len)
        check_same_vocabulary(tgt.tok, separate.tok, tgt.model.config, separate.model.config)

    with staging(out) as tmp:
        step(f"building target graph ({lowering}, {precision})")
        t_entry, target_dec = target_entry(tmp, tgt, cfg, features=kind == "eagle", echo=echo)
        require_parity(t_entry, "target")

        d_entry = None
        if kind != "none":
            step(f"building draft graph ({draft})")
            probe = Probe.of(tgt, cfg)
            if kind == "self":
                d_entry = self_draft_entry(tmp, tgt, draft, cfg, probe)
            elif kind == "eagle":
                d_entry = eagle_entry(tmp, tgt, target_dec, head, head_w, cfg, probe)
            else:
                d_entry = model_draft_entry(tmp, separate, cfg, probe)
            require_parity(d_entry, kind)
            d_entry.default_k = k or RECOMMENDED_K.get(draft, 0)
        del target_dec

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

    @classmethod
    def of(cls, tgt: Source, cfg: Settings) -> Probe:
        prompt = probe_tokens(tgt.arch.vocab, 12)
        return cls(prompt, reference_greedy(tgt.model, prompt, cfg.greedy_steps)[0])


def target_entry(tmp: Path, tgt: Source, cfg: Settings, features: bool,
                 echo: Callable[[str], None] | None = None) -> tuple[ModelEntry, Decoder]:
    """The target -> its graph, its entry with parity numbers against transformers, and a decoder
    over it (the EAGLE check reads its features). features: also output the final-norm hidden
    states (an EAGLE draft reads them)."""
    opts = cfg.graph(hidden_out=FEATURES if features else "")
    qw, entry_quant = quant_target.prepare(tgt, opts, echo)
    entry = _write_model(tmp, "target", tgt.arch, tgt.weights, opts, cfg.max_t, tgt.src.describe(), "export", qw)
    del qw
    entry.quantization = entry_quant
    dec = _decoder(tmp, entry, keep_hidden=features)
    if not entry_quant:
        entry.parity = check_decoder(dec, tgt.model, k=cfg.max_draft_tokens, steps=cfg.greedy_steps,
                                     precision=cfg.precision).as_dict()
        return entry, dec
    if entry_quant["method"] == "rtn":
        quant_target.fake_quantize(tgt.model, tgt.weights, opts)
    entry.parity = quant_target.parity(tmp, entry, dec, tgt.model, opts, cfg.max_draft_tokens, cfg.greedy_steps, _decoder)
    return entry, dec


def self_draft_entry(tmp: Path, tgt: Source, recipe: str, cfg: Settings, probe: Probe) -> ModelEntry:
    """The target's weights, quantized (MatMulNBits) -> the draft entry with its numbers against the
    full-precision model. Lossy by design (verification keeps the output exact), so logit parity
    has no tolerance; agreement with the target's greedy tokens says how good a draft it is."""
    precision = SELF_DRAFT_PRECISION[recipe]
    opts = GraphOptions(lowering="ort", precision=precision, max_seq_len=cfg.max_seq_len)
    entry = _write_model(tmp, "draft", tgt.arch, tgt.weights, opts, cfg.max_t, tgt.src.describe(), recipe)
    return _draft_parity(tmp, entry, tgt.model, cfg, probe, precision)


def model_draft_entry(tmp: Path, draft: Source, cfg: Settings, probe: Probe) -> ModelEntry:
    """A separate draft model -> its entry, held to the same parity as the target."""
    entry = _write_model(tmp, "draft", draft.arch, draft.weights, cfg.graph(), cfg.max_t, draft.src.describe(), "model")
    return _draft_parity(tmp, entry, draft.model, cfg, probe, cfg.precision)


def _draft_parity(tmp, entry, ref_model, cfg: Settings, probe: Probe, precision: str) -> ModelEntry:
    dec = _decoder(tmp, entry)
    entry.parity = check_decoder(dec, ref_model, k=cfg.max_draft_tokens, steps=cfg.greedy_steps,
                                 precision=precision).as_dict()
    entry.parity["greedy_agreement_with_target"] = draft_agreement(dec, probe.target_tokens, probe.prompt)
    return entry


def eagle_entry(tmp: Path, tgt: Source, target_dec: Decoder, head: str, head_w: dict, cfg: Settings,
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
    man = Manifest(
        name=name,
        exporter_version=__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        target=t_entry,
        draft=d_entry,
        tokenizer=_save_tokenizer(tgt.tok, tgt.model.config, tmp),
    )
    man.save(tmp)
    genai.write(tmp, man)  # onnxruntime-genai reads the same graphs (runtime/genai.py)
    load_manifest(tmp)
    return man


def _write_model(tmp: Path, role: str, arch: Arch, w: dict, opts: GraphOptions, max_t: int,
                 source: dict, recipe: str, qw: dict | None = None) -> ModelEntry:
    graph = build_graph(arch, w, opts, qw) if qw else build_graph(arch, w, opts)
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


def _decoder(folder: Path, entry: ModelEntry, keep_hidden: bool = False) -> Decoder:
    return Decoder(OrtBackend(folder / entry.graph, entry), entry.graph.split("/")[0], keep_hidden)


def check_same_vocabulary(t_tok, d_tok, t_cfg, d_cfg) -> None:
    """Refuse a draft whose token ids do not mean the same strings as the target's."""
    problems = []
    tv, dv = t_tok.get_vocab(), d_tok.get_vocab()
    if tv != dv:
        only_t = sorted(set(tv) - set(dv))[:5]
        only_d = sorted(set(dv) - set(tv))[:5]
        moved = [s for s in set(tv) & set(dv) if tv[s] != dv[s]][:5]
        problems.append(
            f"tokenizer vocabularies differ (target {len(tv)} tokens, draft {len(dv)}; "
            f"only in target: {only_t}, only in draft: {only_d}, different ids: {moved})"
        )
    tcfg = getattr(t_cfg, "text_config", None) or t_cfg
    dcfg = getattr(d_cfg, "text_config", None) or d_cfg
    if tcfg.vocab_size != dcfg.vocab_size:
        problems.append(f"logit widths differ (target vocab_size {tcfg.vocab_size}, draft {dcfg.vocab_size})")
    if t_tok.eos_token_id != d_tok.eos_token_id:
        problems.append(f"EOS differs (target {t_tok.eos_token!r}, draft {d_tok.eos_token!r})")
    if problems:
        raise VocabularyMismatch("draft cannot verify against this target: " + "; ".join(problems))


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
    )

