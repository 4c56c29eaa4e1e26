"""The steps `export_bundle` (export/api.py) runs: a model source loaded once (`LoadedModel`),
and each model -> its graph in the staging folder and its manifest entry, with the parity
numbers that gate it.

  target_entry       the target's graph and entry (a quantized target's record on it)
  self_draft_entry   a self-draft's graph and entry, from the target's weights before they go
  check_target       the target graph's parity with transformers, through the gate
  measure_draft      a draft's numbers: parity and greedy agreement with the target
  model_draft_entry  a separate draft model, loaded once the target's check is done
  eagle_entry        an EAGLE head, checked on the target graph's features
  subset_draft       a draft's LM head cut to a frequency-ranked subset of the vocabulary

Memory (docs/design.md, "Export memory"): a model's fp32 weights are in memory once while its
graphs are built, and not at all while onnxruntime loads them; one session at a time. A GGUF
source is streamed: one tensor's weights at a time, never the whole model.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt.runtime.backends.harness import SequenceHarness
from specrt.runtime.backends.ort import OrtBackend
from specrt.runtime.bundle.manifest import SELF_DRAFT_PRECISION, KVLayout, ModelEntry

from . import quant_target, tokcheck, vocab_subset
from .arch import Arch, arch_from_model, numpy_weights
from .bundle import ExternalData, save_graph
from .eagle import draft_arch, draft_weights
from .emitter import kv_buffer_dtype
from .gguf_stream import GGUFWeights, drop_metadata, give_back, streamed_logits
from .graph import EAGLE_FEATURES_OUT, FEATURES, GraphOptions, build_graph, graph_io
from .sources import load_source, resolve_source, sha256_file
from .validate import (
    LazyReference,
    ParityError,
    Reference,
    check_decoder,
    check_eagle,
    compare,
    draft_agreement,
    observe,
    tolerance_key,
)


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
    kv_dtype: str = "auto"  # every graph's KV buffers: "auto" (the activations') | "fp16"
    portable: bool = True  # the bundle keeps its portable graphs (export/portable.py): their checks run

    @property
    def max_t(self) -> int:  # widest call: a verification of max_draft_tokens + the target's token
        return self.max_draft_tokens + 1

    def graph(self, **kw) -> GraphOptions:
        return GraphOptions(**{"lowering": self.lowering, "precision": self.precision,
                               "max_seq_len": self.max_seq_len, "int4_accuracy_level": self.accuracy_level,
                               "lm_head_precision": self.lm_head_precision, "kv_dtype": self.kv_dtype, **kw})

    def target_graph(self, features: bool) -> GraphOptions:
        """The target's options; features: it also outputs its final-norm hidden states (an
        EAGLE draft's input)."""
        return self.graph(hidden_out=FEATURES if features else "")


class LoadedModel:
    """A model source loaded: transformers model + tokenizer; its graph-ready form (`arch`,
    NumPy `weights`, views of the model's own tensors) is made when a step first reads it.
    `release()` drops the model once its graphs are written and its `reference` is taken, so a
    model's fp32 weights are in memory once while its graphs are built and not at all while
    onnxruntime loads them. `stream` (a GGUF source): no fp32 model at all: `model` is a skeleton
    with meta weights, `weights` reads the file tensor by tensor and `reference` is computed
    layer by layer when a check asks (export/gguf_stream.py)."""

    def __init__(self, ref: str, max_seq_len: int, echo: Callable[[str], None] | None = None, stream: bool = False):
        self.src = resolve_source(ref, echo=echo)
        # streamed: a GGUF's weights read tensor by tensor, never a whole fp32 model (export/gguf_stream.py)
        self.streamed = bool(stream and self.src.gguf_file)
        self.model, self.tok = load_source(self.src, stream=self.streamed)
        self.config = self.model.config
        self.max_seq_len = max_seq_len
        if self.streamed:  # what reads the vocabulary has read it (the check's tokens are kept)
            tokcheck.read_gguf_tokens(self.src.path)
            drop_metadata(self.src.path)

    def reference(self, cfg: Settings) -> Reference | LazyReference:
        if self.streamed:  # computed when a check asks, layer by layer
            return LazyReference(functools.partial(streamed_logits, self.model, self.weights), self.arch.vocab,
                                 k=cfg.max_draft_tokens, steps=cfg.greedy_steps)
        return Reference.of(self.model, self.arch.vocab, k=cfg.max_draft_tokens, steps=cfg.greedy_steps)

    def release(self) -> None:
        if self.streamed:  # nothing held: the skeleton and the file map stay for the lazy reference
            return
        self.arch  # noqa: B018 (made while the model is there)
        self.__dict__.pop("weights", None)
        self.model = None
        gc.collect()

    @functools.cached_property
    def arch(self) -> Arch:
        return arch_from_model(self.model, self.max_seq_len)

    @functools.cached_property
    def weights(self) -> Mapping:
        return GGUFWeights(self.src.path, self.model) if self.streamed else numpy_weights(self.model)


@dataclass
class Probe:
    """A prompt and the target's own greedy continuation (transformers): what draft agreement is
    measured on."""

    prompt: np.ndarray
    target_tokens: np.ndarray


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


def target_entry(tmp: Path, tgt: LoadedModel, cfg: Settings, features: bool, echo=None) -> ModelEntry:
    """The target -> its graph and entry, not yet checked. A weight-only quantized target's
    imported (GGUF) or RTN weights are made here and its record kept on the entry
    (export/quant_target.py)."""
    opts = cfg.target_graph(features)
    qw, quantization = quant_target.prepare(tgt, opts, echo)
    entry = write_model(tmp, "target", tgt.arch, tgt.weights, opts, cfg.max_t, tgt.src.describe(), "export", qw)
    entry.quantization = quantization
    return entry


def self_draft_entry(tmp: Path, tgt: LoadedModel, cfg: Settings, draft: str) -> ModelEntry:
    """A self-draft (`self-int8` / `self-int4`): the target's weights, weight-only quantized ->
    its graph and entry. Built before the target's check releases the weights; measured after
    it (`measure_draft`)."""
    opts = GraphOptions(lowering="ort", precision=SELF_DRAFT_PRECISION[draft], max_seq_len=cfg.max_seq_len,
                        kv_dtype=cfg.kv_dtype)  # the target's KV layout: it works in the target's buffers
    return write_model(tmp, "draft", tgt.arch, tgt.weights, opts, cfg.max_t, tgt.src.describe(), draft,
                       quant_target.embedding_blocks(tgt, opts))


def check_target(tmp: Path, entry: ModelEntry, tgt: LoadedModel, cfg: Settings, ref: Reference,
                 keep_features: bool) -> SequenceHarness | None:
    """The target graph's parity with transformers -> `entry.parity`, through the gate. The torch
    model is released before the session exists, except for an EAGLE draft's target
    (`keep_features`: its check runs the model) and a quantized target, whose parity is checked
    against the same (GGUF-dequantized or fake-quantized) weights in transformers
    (export/quant_target.py). -> the decoder when keep_features (the EAGLE check reads its
    features), else None (its session gone)."""
    quantized = bool(entry.quantization)
    if not keep_features and not quantized:
        tgt.release()
    if not quantized and isinstance(ref, LazyReference) and not keep_features:  # session gone before the reference
        entry.parity = compare(observe(decoder(tmp, entry), ref), ref,
                               tolerance_key(cfg.precision, entry.kv.dtype)).as_dict()
        dec = None
    elif not quantized:
        dec = decoder(tmp, entry, keep_hidden=keep_features)
        entry.parity = check_decoder(dec, ref, k=cfg.max_draft_tokens, steps=cfg.greedy_steps,
                                     precision=tolerance_key(cfg.precision, entry.kv.dtype)).as_dict()
    else:
        opts = cfg.target_graph(keep_features)
        if entry.quantization["method"] == "rtn":
            quant_target.fake_quantize(tgt.model, tgt.weights, opts)
        # a streamed model's reference is `ref` (lazy, the same weights); an RTN target's, its
        # fake-quantized model
        against = ref if tgt.streamed else tgt.model
        kernel_dec = functools.partial(kernel_decoder, tmp, entry) if tgt.streamed and runs_kernels(entry) else None
        entry.parity, dec = quant_target.parity(tmp, entry, functools.partial(decoder, tmp, entry, keep_features),
                                                against, opts, cfg.max_draft_tokens, cfg.greedy_steps, decoder,
                                                kernel_dec, cfg.portable)
        if not keep_features:
            tgt.release()
    require_parity(entry, "target")
    return dec if keep_features else None


def measure_draft(tmp: Path, entry: ModelEntry, reference: Reference, cfg: Settings, probe: Probe) -> ModelEntry:
    """A draft graph's parity with its own transformers model (`reference`) and its greedy
    agreement with the target's tokens -> `entry.parity`. A quantized draft is lossy by design
    (verification keeps the output exact), so its logits have no tolerance; the agreement says
    how good a draft it is."""
    dec = decoder(tmp, entry)
    precision = tolerance_key(entry.precision, entry.kv.dtype)
    if isinstance(reference, LazyReference):  # the session is gone before the reference's forward runs
        got = observe(dec, reference)
        agreement = draft_agreement(dec, probe.target_tokens, probe.prompt)
        del dec
        give_back()
        entry.parity = compare(got, reference, precision).as_dict()
    else:
        entry.parity = check_decoder(dec, reference, k=cfg.max_draft_tokens, steps=cfg.greedy_steps,
                                     precision=precision).as_dict()
        agreement = draft_agreement(dec, probe.target_tokens, probe.prompt)
    entry.parity["greedy_agreement_with_target"] = agreement
    return entry


def model_draft_entry(tmp: Path, ref: str, cfg: Settings, probe: Probe, draft_precision: str | None,
                      step: Callable[[str], None], echo) -> ModelEntry:
    """A separate draft model -> its entry: at the target's precision held to the same parity as
    the target; weight-quantized (draft_precision) measured like a self-draft."""
    step(f"loading draft {ref}")
    d = LoadedModel(ref, cfg.max_seq_len, echo, stream=True)
    reference = d.reference(cfg)
    step(f"building draft graph ({ref}{', ' + draft_precision if draft_precision else ''})")
    if draft_precision:
        opts = GraphOptions(lowering="ort", precision=draft_precision, max_seq_len=cfg.max_seq_len, kv_dtype=cfg.kv_dtype)
        recipe = f"model-{draft_precision}"
    else:
        opts, recipe = cfg.graph(), "model"
    # an int4 / int8 draft from a GGUF gathers its embedding from the file's blocks (exact)
    entry = write_model(tmp, "draft", d.arch, d.weights, opts, cfg.max_t, d.src.describe(), recipe,
                        quant_target.embedding_blocks(d, opts))
    d.release()
    return measure_draft(tmp, entry, reference, cfg, probe)


def subset_draft(tmp: Path, entry: ModelEntry, tokenizer, size: int, probe: Probe) -> ModelEntry:
    """The draft graph's LM head cut to the `size` most frequent tokens (export/vocab_subset.py),
    in place. Records the subset on the entry, whether the kept rows' logits are the full head's
    bit for bit (`rows_equal`), and the agreement with the target again: it is the runtime's
    acceptance prior, and tokens outside the subset are now never proposed."""
    ids, info = vocab_subset.choose(tokenizer, entry.vocab_size, size)
    full = decoder(tmp, entry).prefill(probe.prompt)
    vocab_subset.rewrite(tmp, entry.graph, entry.io.logits, ids, entry.vocab_size)
    dec = decoder(tmp, entry)
    cut = dec.prefill(probe.prompt)
    outside = np.ones(entry.vocab_size, dtype=bool)
    outside[ids] = False
    info["rows_equal"] = bool(np.array_equal(cut[ids], full[ids]) and np.isneginf(cut[outside]).all())
    info["agreement_full_head"] = entry.parity.get("greedy_agreement_with_target")
    entry.parity["greedy_agreement_with_target"] = draft_agreement(dec, probe.target_tokens, probe.prompt)
    entry.vocab_subset = info
    return entry


def eagle_entry(tmp: Path, tgt: LoadedModel, target_dec: SequenceHarness, head: str, head_w: dict, cfg: Settings,
                probe: Probe) -> ModelEntry:
    """An EAGLE head file -> the draft entry, checked against its torch module on the target
    graph's features. int4 on onnxruntime (the head is tiny; its LM head is the big matrix), the
    target's precision on the standard lowering (TensorRT)."""
    quantized = cfg.lowering == "ort"
    opts = cfg.graph(precision="int4" if quantized else cfg.precision, eagle=True, hidden_out=EAGLE_FEATURES_OUT)
    source = {"kind": "eagle-head", "ref": head, "sha256": sha256_file(Path(head))}
    entry = write_model(tmp, "draft", draft_arch(tgt.arch), draft_weights(tgt.weights, head_w, head), opts,
                        cfg.max_t, source, "eagle")
    entry.parity = check_eagle(decoder(tmp, entry), target_dec, tgt.model, head_w, probe.prompt,
                               probe.target_tokens, precision=tolerance_key(cfg.precision, entry.kv.dtype),
                               quantized=quantized)
    return entry


def write_model(tmp: Path, role: str, arch: Arch, w: dict, opts: GraphOptions, max_t: int,
                source: dict, recipe: str, qw: Mapping | None = None) -> ModelEntry:
    """Weights -> tmp/<role>/ graph + weights file, and its manifest entry (no parity yet). qw: HF
    name -> imported GGUF form (a gguf graph's weights; an int4 / int8 graph's embedding)."""
    sink = ExternalData(tmp / role)
    try:
        graph = build_graph(arch, w, opts, qw or None, sink=sink)
    finally:
        sink.close()
    name, data = save_graph(graph, tmp / role)
    del graph
    give_back()
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
        kv=KVLayout(arch.layers, arch.kv_heads, arch.head_dim, kv_buffer_dtype(opts).name, opts.max_seq_len),
        source=source,
        recipe=recipe,
    )


def decoder(folder: Path, entry: ModelEntry, keep_hidden: bool = False) -> SequenceHarness:
    """A written entry -> one-sequence decoder over its graph, for the checks."""
    # float graphs unpacked: the checks run tens of calls, and a prepacking session peaks at twice
    # the weights while it is built (runtime/bundle/memory.py); MatMulNBits graphs are packed regardless
    # and a slot of CHECK_ROWS, not S_max: a 32k bundle's slot is 1.8 GB of KV the checks never touch
    rows = min(entry.kv.max_seq_len, CHECK_ROWS)
    return SequenceHarness(OrtBackend(folder / entry.graph, entry, prepack=False, max_seq_len=rows),
                           entry.graph.split("/")[0], keep_hidden)


CHECK_ROWS = 2048  # the export's checks run prompts of tens of tokens


def runs_kernels(entry: ModelEntry) -> bool:
    """Whether `entry` has kernel graphs this process runs in a fast form (runtime/kernels)."""
    from specrt.runtime import kernels

    return bool(entry.packed.kernels) and kernels.form_for(True)[0] != "none"


class _SlotZero:
    """A packed model's slot 0 as the backend of a `SequenceHarness` (one sequence, one lane)."""

    takes_hidden = has_hidden_out = False
    hidden = None
    hidden_size = 0

    def __init__(self, model):
        self.model = model
        self.max_seq_len, self.max_t, self.max_prefill_t, self.vocab = (model.max_seq_len, model.max_t,
                                                                        model.max_prefill_t, model.vocab)

    def run(self, tokens, past_len: int, hidden=None, keep: int | None = None) -> np.ndarray:
        return self.model.run(0, tokens, past_len, hidden, keep)


def kernel_decoder(folder: Path, entry: ModelEntry) -> SequenceHarness:
    """A written entry's kernel graph of one lane (export/kernel_graph.py: what a CPU load runs)
    -> one-sequence decoder for the checks. Its operators read their initializers as they are:
    the session holds the kernel data's bytes, ~1.0x the GGUF for a gguf target."""
    from specrt.runtime.backends.kvpool import KVPool
    from specrt.runtime.backends.packed import PackedModel

    pool = KVPool(entry.kv, 1, "cpu", max_seq_len=min(entry.kv.max_seq_len, CHECK_ROWS))
    model = PackedModel(folder / entry.packed.kernel_file(1), entry, pool, lanes=1, track="check", kernels=True)
    return SequenceHarness(_SlotZero(model), entry.graph.split("/")[0])
