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
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .emitter import EMBED, GraphOptions, embedding_form
from .gguf_import import fallback_message, import_gguf
from .nbits import QUANTIZED, WEIGHT_ONLY, resolve
from .quantize import QuantWeight
from .validate import LazyReference, check_decoder, compare, observe, tolerance_key


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
        if (q := embedding_form(tgt.arch, tgt.weights, qw, opts)) is not None:
            mins = " + per-block mins" if q.mins is not None else ""
            report["embedding"] = f"GatherBlockQuantized over the file's {q.kind} blocks ({q.bits}-bit, block {q.block}{mins}; exact)"
        if echo and (msg := fallback_message(report)):
            echo(msg)
        return qw, report
    head = opts.lm_head_precision or opts.precision
    report = {"method": "rtn", "bits": QUANTIZED[opts.precision], "block_size": opts.int4_block_size,
              "accuracy_level": opts.int4_accuracy_level, "lm_head": head, "embedding": "fp32 Gather"}
    return {}, report


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


def level0_twin(folder: Path, entry) -> object:
    """The entry's graph with every MatMulNBits at accuracy_level 0 (fp32 compute), written next
    to it over the same weights file -> an entry pointing at it."""
    import onnx

    src = folder / entry.graph
    model = onnx.load(str(src), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = 0
    twin = src.with_name(src.stem + ".level0.onnx")
    onnx.save(model, str(twin))
    return dataclasses.replace(entry, graph=str(Path(entry.graph).with_name(twin.name)))


def parity(folder: Path, entry, make_dec: Callable[[], object], model, opts: GraphOptions, k: int, steps: int,
           decoder: Callable[[Path, object], object]) -> tuple[dict, object]:
    """The gate's numbers for a weight-only target (see the module docstring), and the graph's
    decoder (`make_dec()`), made once the twin's session is gone (one session at a time).
    model: the reference (a transformers model, or a Reference of one)."""
    exact_key = tolerance_key("fp32", entry.kv.dtype)  # fp32 compute; an fp16 KV cache's rounding
    if opts.int4_accuracy_level == 0:
        dec = make_dec()
        return check_decoder(dec, model, k=k, steps=steps, precision=exact_key).as_dict(), dec
    twin = level0_twin(folder, entry)
    try:
        if isinstance(model, LazyReference):  # the twin's session is gone before the reference runs
            exact = compare(observe(decoder(folder, twin), model), model, exact_key).as_dict()
        else:
            exact = check_decoder(decoder(folder, twin), model, k=k, steps=steps, precision=exact_key).as_dict()
    finally:
        (folder / twin.graph).unlink()
    dec = make_dec()
    own = check_decoder(dec, model, k=k, steps=steps, precision="int8-activations").as_dict()
    exact["accuracy_level_4"] = {key: own[key] for key in
                                 ("prefill_max_abs", "continuation_max_abs", "greedy_steps", "greedy_match")}
    exact["checked_at_accuracy_level"] = 0
    return exact, dec
