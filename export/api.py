"""`export_bundle`: target (+ draft) -> validated bundle folder. The CLI is a shell over this."""

from __future__ import annotations

import datetime as _dt
import gc
import time
from collections.abc import Callable
from pathlib import Path

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
from . import __version__
from .arch import Arch, arch_from_model, numpy_weights
from .bundle import save_graph, staging
from .eagle import draft_arch, draft_weights, load_head
from .graph import GraphOptions, build_graph, graph_io
from .sources import SourceError, load_source, resolve_source, sha256_file
from .validate import (
    TOLERANCE,
    ParityError,
    check_decoder,
    check_eagle,
    draft_agreement,
    probe_tokens,
    reference_greedy,
)

LOWERINGS = ("ort", "standard")
PRECISIONS = ("fp32", "fp16")
SELF_DRAFTS = SELF_DRAFT_PRECISION  # MatMulNBits copies of the target: recipe -> precision
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
    trt: bool = False,
    echo: Callable[[str], None] | None = print,
) -> Manifest:
    """Export `target` (and a draft) into the bundle folder `out`, validated against transformers.

    draft: "self-int4" / "self-int8" (int4 / int8 MatMulNBits copy of the target, ort lowering),
    "eagle:<head file>" (a one-layer EAGLE head trained for this target, see export/eagle.py),
    "none", or another model source (same vocabulary required).
    k: draft tokens per round recorded as the draft's `default_k` (None: RECOMMENDED_K for self
    drafts, else unset). Returns the written manifest.
    """
    if lowering not in LOWERINGS:
        raise ValueError(f"lowering must be one of {LOWERINGS}, got {lowering!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if max_draft_tokens < 1 or max_seq_len < max_draft_tokens + 32:
        raise ValueError("need max_draft_tokens >= 1 and max_seq_len >= max_draft_tokens + 32")
    if k is not None and not 1 <= k <= max_draft_tokens:
        raise ValueError(f"k must be between 1 and max_draft_tokens ({max_draft_tokens}), got {k}")
    if trt and lowering != "standard":
        raise ValueError("TensorRT plans are built from the standard lowering: add --lowering standard")
    if draft in SELF_DRAFTS and lowering != "ort":
        raise ValueError(f"the {draft} draft uses MatMulNBits, which only the 'ort' lowering has; "
                         "pass --draft none or a separate draft model with --lowering standard")
    eagle_head = draft[len("eagle:"):] if draft.startswith("eagle:") else None
    max_t = max_draft_tokens + 1
    out = Path(out)
    separate = draft not in (*SELF_DRAFTS, "none") and eagle_head is None
    n_steps = 4 + (draft != "none") + separate + trt
    step = Progress(n_steps, echo)

    step(f"loading target {target}")
    t_src = resolve_source(target)
    t_model, t_tok = load_source(t_src)
    t_arch = arch_from_model(t_model, max_seq_len)
    t_w = numpy_weights(t_model)

    d_model = d_tok = d_src = head_w = None
    if eagle_head is not None:
        head_w = load_head(eagle_head, t_arch, t_src.describe().get("sha256"))
    if separate:
        step(f"loading draft {draft}")
        d_src = resolve_source(draft)
        d_model, d_tok = load_source(d_src)
        check_same_vocabulary(t_tok, d_tok, t_model.config, d_model.config)

    with staging(out) as tmp:
        step(f"building target graph ({lowering}, {precision})")
        opts = GraphOptions(lowering=lowering, precision=precision, max_seq_len=max_seq_len,
                            hidden_out="hidden_states" if head_w is not None else "")
        t_entry = _write_model(tmp, "target", t_arch, t_w, opts, max_t, t_src.describe(), "export")
        target_dec = _decoder(tmp, t_entry, keep_hidden=head_w is not None)
        t_entry.parity = check_decoder(target_dec, t_model, k=max_draft_tokens, steps=greedy_steps, precision=precision).as_dict()
        if not t_entry.parity["passed"]:
            raise ParityError(f"target graph failed parity with transformers: {t_entry.parity}")

        d_entry = None
        if draft != "none":
            step(f"building draft graph ({draft})")
            if draft in SELF_DRAFTS:
                dopts = GraphOptions(lowering="ort", precision=SELF_DRAFTS[draft], max_seq_len=max_seq_len)
                d_entry = _write_model(tmp, "draft", t_arch, t_w, dopts, max_t, t_src.describe(), draft)
                ref_model = t_model
            elif head_w is not None:
                # int4 on onnxruntime (the head is tiny; its LM head is the big matrix), the
                # target's precision on the standard lowering (TensorRT)
                dopts = GraphOptions(lowering=lowering, precision="int4" if lowering == "ort" else precision,
                                     max_seq_len=max_seq_len, eagle=True, hidden_out="next_hidden_states")
                d_entry = _write_model(tmp, "draft", draft_arch(t_arch), draft_weights(t_w, head_w, eagle_head), dopts,
                                       max_t, {"kind": "eagle-head", "ref": eagle_head, "sha256": sha256_file(Path(eagle_head))},
                                       "eagle")
                ref_model = None
            else:
                d_arch, d_w = arch_from_model(d_model, max_seq_len), numpy_weights(d_model)
                d_entry = _write_model(tmp, "draft", d_arch, d_w, opts, max_t, d_src.describe(), "model")
                ref_model = d_model
            draft_dec = _decoder(tmp, d_entry)
            prompt = probe_tokens(t_arch.vocab, 12)
            tgt_tokens, _ = reference_greedy(t_model, prompt, greedy_steps)
            if ref_model is None:  # EAGLE head: checked against its torch module, then the target
                par = d_entry.parity = check_eagle(draft_dec, target_dec, t_model, head_w, prompt, tgt_tokens)
                tol = TOLERANCE[precision]
                if par["target_features_max_abs"] > tol:
                    raise ParityError(f"target feature output differs from transformers: {par}")
                # full precision: match the torch module; int4 (ort): a broken graph agrees ~1/V of
                # the time; quantization alone kept 0.86 on the default head, 0.47 on a random tiny one
                if (par["max_abs"] > tol) if lowering != "ort" else (par["argmax_match_torch"] < 0.2):
                    raise ParityError(f"EAGLE draft graph failed parity with its torch module: {par}")
            else:
                lossy = draft in SELF_DRAFTS
                par = check_decoder(draft_dec, ref_model, k=max_draft_tokens, steps=greedy_steps,
                                    precision=SELF_DRAFTS.get(draft, precision))
                d_entry.parity = par.as_dict()
                if not lossy and not par.passed:
                    raise ParityError(f"draft graph failed parity with transformers: {d_entry.parity}")
                d_entry.parity["greedy_agreement_with_target"] = draft_agreement(draft_dec, tgt_tokens, prompt)
            del draft_dec

        if trt:
            from .trt import save_engine

            step("building TensorRT plans")
            for role, entry in (("target", t_entry), ("draft", d_entry)):
                if entry is not None:
                    entry.trt_plans.append(save_engine(tmp, role, entry))

        step("writing tokenizer and manifest")
        if d_entry is not None:
            d_entry.default_k = k or RECOMMENDED_K.get(draft, 0)
        man = Manifest(
            name=out.name,
            exporter_version=__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            target=t_entry,
            draft=d_entry,
            tokenizer=_save_tokenizer(t_tok, t_model.config, tmp),
        )
        man.save(tmp)
        genai.write(tmp, man)  # onnxruntime-genai reads the same graphs (runtime/genai.py)
        load_manifest(tmp)  # the runtime's own check, before the swap
        del target_dec
        gc.collect()
    step(f"bundle ready: {out}")
    return man


def _write_model(tmp: Path, role: str, arch: Arch, w: dict, opts: GraphOptions, max_t: int,
                 source: dict, recipe: str) -> ModelEntry:
    graph = build_graph(arch, w, opts)
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

