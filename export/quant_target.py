"""A weight-only quantized target (precision int4 / int8 / gguf): its weights, its reference
model, and its parity gate.

The reference is transformers on the *same* weights: for gguf, the model transformers loaded
from the file (its dequantized blocks are what the graph holds); for RTN, the model with every
projection replaced by its fake-quantized value. At accuracy_level 0 (fp32 compute) the graph
must match it to fp32 rounding. At level 4 onnxruntime quantizes activations to int8 per block,
which no transformers model reproduces: the gate runs on a level-0 twin of the same graph file
(same weights file, one attribute changed), and the level-4 graph's own numbers against the
reference are recorded beside it (`parity["accuracy_level_4"]`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from .emitter import EMBED, GraphOptions, embedding_form
from .gguf_import import fallback_message, import_embedding, import_gguf
from .gguf_stream import give_back
from .nbits import QUANTIZED, WEIGHT_ONLY, resolve
from .quantize import QuantWeight
from .twin_pieces import observe_forced_in_pieces
from .validate import LazyReference, check_decoder, compare, observe, prefetch, tolerance_key


def prepare(tgt, opts: GraphOptions, echo: Callable[[str], None] | None) -> tuple[dict[str, QuantWeight], dict]:
    """-> (imported weights for build_graph's `qw`, the manifest's quantization record); ({}, {})
    for a float target. RTN targets get their torch reference fake-quantized in place, after the
    fp32 NumPy weights the graph is built from have been read."""
    if opts.precision not in WEIGHT_ONLY:
        return {}, {}
    if opts.precision == "gguf":
        if tgt.src.gguf_file is None:
            raise ValueError(f"precision gguf imports a GGUF file's blocks; {tgt.src.ref} is not a GGUF source "
                             "(use int4 or int8 for RTN from any source)")
        qw, report = import_gguf(tgt.src.path, tgt.model, tgt.weights, opts.int4_accuracy_level)
        report["embedding"] = describe_embedding(tgt.arch, tgt.weights, qw, opts) or report["embedding"]
        if echo and (msg := fallback_message(report)):
            echo(msg)
        return qw, report
    head = opts.lm_head_precision or opts.precision
    qw = embedding_blocks(tgt, opts)
    report = {"method": "rtn", "bits": QUANTIZED[opts.precision], "block_size": opts.int4_block_size,
              "accuracy_level": opts.int4_accuracy_level, "lm_head": head,
              "embedding": describe_embedding(tgt.arch, tgt.weights, qw, opts) or "fp32 Gather"}
    return qw, report


def embedding_blocks(m, opts: GraphOptions) -> Mapping[str, QuantWeight]:
    """An RTN graph's (int4 / int8) embedding as its GGUF source's own blocks, {EMBED: blocks}
    ({} for another source or precision): `embedding_form` decides whether the graph gathers
    from them; its rows are the fp32 table's bit for bit (docs/design.md, "Quantized targets").
    m: a LoadedModel (export/steps.py) whose model and weights are still there."""
    if m.src.gguf_file is None or opts.precision not in QUANTIZED:
        return {}
    return import_embedding(m.src.path, m.model, m.weights)


def describe_embedding(arch, weights, qw, opts: GraphOptions) -> str:
    """The manifest's words for a gathered embedding ("" where the graph gathers the fp32 table)."""
    if (q := embedding_form(arch, weights, qw, opts)) is None:
        return ""
    mins = " + per-block mins" if q.mins is not None else ""
    return f"GatherBlockQuantized over the file's {q.kind} blocks ({q.bits}-bit, block {q.block}{mins}; exact)"


def fake_quantize(model, weights: dict[str, np.ndarray], opts: GraphOptions) -> None:
    """Replace each projection of the torch `model` by the value its graph form computes with
    (RTN targets; 8-bit at level 0 is the same value as float). The LM head of a tied model is
    untied first: the embedding stays fp32 (the graph's Gather reads fp32)."""
    import torch

    cfg = getattr(model.config, "text_config", None) or model.config
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    for key, w in weights.items():
        if w.ndim != 2 or key == EMBED or (key == "lm_head.weight" and tied):
            continue
        model.get_submodule(key.rsplit(".", 1)[0]).weight.data = torch.from_numpy(_fake(w, opts, opts.precision))
    head_src = weights[EMBED] if tied or "lm_head.weight" not in weights else weights["lm_head.weight"]
    head = _fake(head_src, opts, opts.lm_head_precision or opts.precision)
    model.lm_head.weight = torch.nn.Parameter(torch.from_numpy(head), requires_grad=False)


def _fake(w: np.ndarray, opts: GraphOptions, precision: str) -> np.ndarray:
    form = resolve(w, precision, opts.int4_block_size, opts.int4_accuracy_level)
    return np.ascontiguousarray(form.dequantize()[:, : w.shape[1]] if isinstance(form, QuantWeight) else form)


TWIN_CHUNK_BYTES = 128 << 20  # the most fp32 B a twin's 8-bit MatMulNBits dequantizes in one call


def _row_chunk(t, name: str, r0: int, r1: int, rows: int):
    """Rows [r0, r1) of initializer `t` (rows outermost, in the weights file) -> a TensorProto
    over the same bytes of the file (no copy), or None where `t` is not external."""
    from onnx import TensorProto

    ext = {e.key: e.value for e in t.external_data}
    if t.data_location != TensorProto.EXTERNAL or "offset" not in ext:
        return None
    row = int(ext["length"]) // rows
    out = TensorProto(name=name, dims=[r1 - r0, *t.dims[1:]] if len(t.dims) > 1 else [(r1 - r0) * t.dims[0] // rows],
                      data_type=t.data_type, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", ext["location"]), ("offset", str(int(ext["offset"]) + r0 * row)),
                       ("length", str((r1 - r0) * row))):
        out.external_data.add(key=key, value=value)
    return out


def _split_rows(model, node, chunk_bytes: int) -> list | None:
    """An 8-bit MatMulNBits whose B dequantizes to more than `chunk_bytes` of fp32 -> MatMulNBits
    over row ranges of the same initializers (views of the weights file) + one Concat, the same
    values per output column; None where it is small or its inputs are not all external."""
    from onnx import helper

    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    n, k = a["N"], a["K"]
    if a.get("bits") != 8 or n * k * 4 <= chunk_bytes:
        return None
    inits = {t.name: t for t in model.graph.initializer}
    ins = list(node.input)
    if any(i and i not in inits for i in ins[1:]):
        return None
    step = max(16, chunk_bytes // (k * 4) // 16 * 16)
    nodes, outs, new_inits = [], [], []
    for j, r0 in enumerate(range(0, n, step)):
        r1 = min(n, r0 + step)
        cins = [ins[0]]
        for i in ins[1:]:
            if not i:
                cins.append("")
                continue
            c = _row_chunk(inits[i], f"{i}_rows{j}", r0, r1, n)
            if c is None:
                return None
            new_inits.append(c)
            cins.append(c.name)
        outs.append(f"{node.output[0]}_rows{j}")
        nodes.append(helper.make_node("MatMulNBits", cins, [outs[-1]], name=f"{node.name}_rows{j}", domain=node.domain,
                                      **{**a, "N": r1 - r0}))
    nodes.append(helper.make_node("Concat", outs, [node.output[0]], name=f"{node.name}_concat", axis=-1))
    return nodes, new_inits


def level0_twin(folder: Path, entry) -> object:
    """The entry's graph with every MatMulNBits at accuracy_level 0 (fp32 compute), written next
    to it over the same weights file -> an entry pointing at it. An 8-bit one computes at level 0
    by dequantizing all of B on each call (export/nbits.py): a large one (a Q6_K LM head, 933 MB
    of fp32 for the coder's) runs as row ranges of its initializers, so the check's peak holds
    TWIN_CHUNK_BYTES of it at a time."""
    import onnx

    src = folder / entry.graph
    model = onnx.load(str(src), load_external_data=False)
    nodes = []
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = 0
            split = _split_rows(model, node, TWIN_CHUNK_BYTES)
            if split is not None:
                nodes += split[0]
                model.graph.initializer.extend(split[1])
                continue
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input}
    kept = [t for t in model.graph.initializer if t.name in used or t.name in {i.name for i in model.graph.input}]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    twin = src.with_name(src.stem + ".level0.onnx")
    onnx.save(model, str(twin))
    return dataclasses.replace(entry, graph=str(Path(entry.graph).with_name(twin.name)))


def _observe_all(folder: Path, twin, model, make_dec, make_kernel_dec, portable: bool) -> tuple:
    """A streamed target's graphs observed one session at a time -> (twin, level-4 portable graph
    or None, kernel graph or None). The level-4 graphs step their own greedy tokens (the kernel
    graph's are the drafts' probe); the twin is teacher-forced on them (`observe_forced`: 6 wide
    calls, not 34 one-token ones), in pieces (export/twin_pieces.py; docs/design.md "The export's
    time and peak, session 23")."""
    got_own = observe(make_dec(), model) if portable or make_kernel_dec is None else None
    give_back()  # each session's memory back to the system before the next is built
    got_kernels = observe(make_kernel_dec(), model) if make_kernel_dec is not None else None
    give_back()
    lead = got_kernels if got_kernels is not None else got_own
    # in pieces of the graph, one session at a time: the twin's weights are never held at once
    return observe_forced_in_pieces(folder, twin, model, lead.tokens), got_own, got_kernels


def parity(folder: Path, entry, make_dec: Callable[[], object], model, opts: GraphOptions, k: int, steps: int,
           decoder: Callable[[Path, object], object], make_kernel_dec: Callable[[], object] | None = None,
           portable: bool = True) -> tuple[dict, object]:
    """The gate's numbers for a weight-only target (see the module docstring), and the graph's
    decoder (`make_dec()`), made once the twin's session is gone (one session at a time); None
    for a `LazyReference` (a streamed model: each session is dropped before the reference runs).
    model: the reference (a transformers model, a Reference of one, or a LazyReference).
    make_kernel_dec: the entry's kernel graph (what a CPU load runs), observed too where given; its
    numbers are then `accuracy_level_4` and its greedy tokens the drafts' probe, and the level-4
    portable graph is observed only if the bundle keeps it (`portable`)."""
    exact_key = tolerance_key("fp32", entry.kv.dtype)  # fp32 compute; an fp16 KV cache's rounding
    if opts.int4_accuracy_level == 0:
        if isinstance(model, LazyReference):  # the session is gone before the reference runs
            return compare(observe(make_dec(), model), model, exact_key).as_dict(), None
        dec = make_dec()
        return check_decoder(dec, model, k=k, steps=steps, precision=exact_key).as_dict(), dec
    twin = level0_twin(folder, entry)
    lazy = isinstance(model, LazyReference)
    try:
        if lazy:  # every graph observed, one session at a time, then one reference forward for all
            got_twin, got_own, got_kernels = _observe_all(folder, twin, model, make_dec, make_kernel_dec, portable)
        else:
            exact = check_decoder(decoder(folder, twin), model, k=k, steps=steps, precision=exact_key).as_dict()
    finally:
        (folder / twin.graph).unlink()
    portable_own = None
    if lazy:
        prefetch(model, [g for g in (got_twin, got_own, got_kernels) if g is not None])
        exact = compare(got_twin, model, exact_key).as_dict()
        # the last compared graph's greedy tokens are the probe's: the kernel graph's where it ran
        own = compare(got_own, model, "int8-activations").as_dict() if got_own is not None else None
        if got_kernels is not None:
            portable_own, own = own, compare(got_kernels, model, "int8-activations").as_dict()
        dec = None  # a streamed target's decoder is not kept (no EAGLE check reads it)
    else:
        dec = make_dec()
        own = check_decoder(dec, model, k=k, steps=steps, precision="int8-activations").as_dict()
    keys = ("prefill_max_abs", "continuation_max_abs", "greedy_steps", "greedy_match")
    exact["accuracy_level_4"] = {key: own[key] for key in keys}
    if lazy and make_kernel_dec is not None:  # which level-4 graph those are; the portable one's beside them
        exact["accuracy_level_4"]["graph"] = "kernels"
        if portable_own is not None:
            exact["portable_accuracy_level_4"] = {key: portable_own[key] for key in keys}
    exact["checked_at_accuracy_level"] = 0
    return exact, dec
