"""What a bundle holds, as the lines `specrt inspect` prints: from its manifest (models, IO, KV,
limits, parity, TensorRT plans, tokenizer) and its predicted memory (memory.py), with what
`--max-batch auto` would take on this machine now.
"""

from __future__ import annotations

from pathlib import Path

from .. import kernels
from ..options import DEFAULT_DRAFT_WINDOW
from ..text.toolcalls import template_has_tools
from . import memory
from .loader import memory_plan
from .manifest import ADD_PORTABLE, Manifest, ModelEntry


def describe(folder: Path, man: Manifest) -> list[str]:
    lines = [f"bundle {folder}  (schema {man.schema_version}, specrt {man.exporter_version}, {man.created})"]
    for role, e in (("target", man.target), ("draft", man.draft)):
        lines += _model_lines(folder, role, e) if e is not None else [f"  {role}: none"]
    t = man.tokenizer
    tools = "yes (<tool_call>)" if template_has_tools(t.chat_template) else "no"
    lines.append(f"  tokenizer: {t.file}, chat template: {'yes' if t.chat_template else 'no'}, tool calls: {tools}, "
                 f"eos ids {t.eos_token_ids}, end-of-generation ids "
                 f"{t.eog_token_ids if t.eog_token_ids is not None else '(derived at load)'}")
    return lines + [kernel_line(man)] + memory_lines(folder, man)


def kernel_line(man: Manifest) -> str:
    """Which form of specrt's own operators a CPU load of this bundle runs here (runtime/kernels)."""
    form, why = kernels.form_for(bool(man.target.packed.graph and man.target.packed.kernels))
    return f"  kernels: {form}" + (f" ({why})" if why else " (specrt's own operators in the packed target graphs)")


def _model_lines(folder: Path, role: str, e: ModelEntry) -> list[str]:
    files = [e.data, e.packed.kernel_data] if e.portable_missing else [e.graph, e.data]
    size = sum((folder / f).stat().st_size for f in filter(None, files))
    kvb = e.kv.bytes_per_token()
    lines = [f"  {role}: {e.family}/{e.model_type}  lowering={e.lowering}  precision={e.precision}  "
             f"recipe={e.recipe}  files={size / 2**20:.1f} MiB" + (f"  default k={e.default_k}" if e.default_k else "")]
    if q := e.quantization:  # weight-only: the form each GGUF tensor type took
        kinds = ", ".join(f"{k} x{v['tensors']}" for k, v in q.get("types", {}).items())
        lines.append(f"    weights: {q['method']}, accuracy_level {q['accuracy_level']}" + (f"; {kinds}" if kinds else "")
                     + (f"; no exact form (float): {', '.join(q['fallback'])}" if q.get("fallback") else ""))
    feat_in = f"{e.io.hidden_in} [B,T,{e.hidden_size}], " if e.io.hidden_in else ""
    feat_out = f", {e.io.hidden_out} [B,T,{e.hidden_size}]" if e.io.hidden_out else ""
    keep = f", {e.io.logits_to_keep} [1] (optional)" if e.io.logits_to_keep else ""
    where = (f"kernel graphs only ({e.packed.kernels}; portable graphs: "
             f"{ADD_PORTABLE.format(folder=folder)})") if e.portable_missing else f"graph {e.graph}"
    lines.append(f"    {where}; inputs {e.io.input_ids} [B,T<={e.max_tokens_per_call}], {feat_in}"
                 f"{e.io.attention_mask} [B,P+T], {e.io.past_key.format(i='i')}/{e.io.past_value.format(i='i')}{keep}; "
                 f"outputs {e.io.logits} [B,{'n' if keep else 'T'},{e.vocab_size}]{feat_out}, "
                 f"{e.io.present_key.format(i='i')}/..")
    lines.append(f"    KV: {e.kv.layers} layers x {e.kv.kv_heads} heads x {e.kv.head_dim} dim, {e.kv.dtype}, "
                 f"S_max={e.kv.max_seq_len}: {kvb / 1024:.1f} KiB/token, {kvb * e.kv.max_seq_len / 2**20:.0f} MiB allocated")
    lines += _parity_lines(e)
    return lines + [f"    TensorRT plan {plan.file} ({plan.gpu}, TRT {plan.trt_version})" for plan in e.trt_plans]


def _parity_lines(e: ModelEntry) -> list[str]:
    p = e.parity
    if not p:
        return []
    if e.recipe == "eagle":
        return [f"    parity: target features vs transformers max|d|={p.get('target_features_max_abs', 0):.2e}; "
                f"graph vs torch head max|dlogit|={p.get('max_abs', 0):.2e}, argmax match "
                f"{p.get('argmax_match_torch', 0):.2f}; agreement with target greedy "
                f"{p.get('greedy_agreement_with_target', 0):.2f} (step 1, teacher-forced)"]
    line = (f"    parity vs transformers: prefill max|dlogit|={p.get('prefill_max_abs', 0):.2e}, "
            f"T={p.get('continuation_tokens')} continuation {p.get('continuation_max_abs', 0):.2e}, "
            f"greedy {p.get('greedy_match')}/{p.get('greedy_steps')}")
    if "greedy_agreement_with_target" in p:
        line += f", agreement with target greedy {p['greedy_agreement_with_target']:.2f}"
    return [line]


def memory_lines(folder: Path, man: Manifest) -> list[str]:
    """What a CPU load of this bundle holds (memory.py), and what `auto` would take now."""
    plan = memory_plan(folder, man, want_draft=man.draft is not None, draft_window=DEFAULT_DRAFT_WINDOW)
    s_max = man.target.kv.max_seq_len
    weights = ", ".join(f"{m.name} {m.weights / 1e9:.2f} GB" for m in plan.models)
    lines = [f"  memory (CPU, predicted): weights {weights} (+ onnxruntime {plan.runtime / 1e9:.2f} GB); "
             f"KV {plan.kv_per_slot(s_max) / 2**20:.1f} MiB per slot at S_max {s_max} (every pool)"]
    available = memory.available_bytes("cpu")
    if available is None:
        return lines
    try:
        auto = memory.size(plan, memory.AUTO, s_max, available)
        fits = (f"--max-batch auto takes {auto.slots} slots: {auto.kv_bytes / 1e9:.2f} GB of KV, "
                f"{plan.steady(auto.slots, s_max) / 1e9:.2f} GB in all")
    except memory.InsufficientMemory:
        fits = "not even one slot fits"
    return lines + [f"    now {available / 1e9:.2f} GB available: {fits}"]
