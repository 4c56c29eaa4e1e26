"""onnxruntime-genai as a peer, on the bundle's own ONNX files (same graphs, other runtime).

Our `ort` graphs use genai's IO names and attention_mask convention, so a generated
genai_config.json (past_present_share_buffer) is all it needs. Its speculative decoding takes a
`model.draft` section and `speculative.max_draft_tokens`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from ..manifest import Manifest, ModelEntry


def available() -> bool:
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return False
    return True


def _section(entry: ModelEntry, filename: str, hidden: int, heads: int) -> dict:
    io = entry.io
    return {
        # The same thread count as our sessions: genai's default picked fewer threads on this
        # 2-core container (48 ms/token vs 28 with 2 threads, its own fp32 graph).
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": [],
                            "intra_op_num_threads": os.cpu_count() or 1},
        "filename": filename,
        "head_size": entry.kv.head_dim,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_hidden_layers": entry.kv.layers,
        "num_key_value_heads": entry.kv.kv_heads,
        "inputs": {"input_ids": io.input_ids, "attention_mask": io.attention_mask,
                   "past_key_names": io.past_key.replace("{i}", "%d"),
                   "past_value_names": io.past_value.replace("{i}", "%d")},
        "outputs": {"logits": io.logits, "present_key_names": io.present_key.replace("{i}", "%d"),
                    "present_value_names": io.present_value.replace("{i}", "%d")},
    }


def write_config(bundle: Path, man: Manifest, out: Path, *, hidden: int, heads: int, max_draft_tokens: int | None,
                 ngram_size: int = 0, draft_bundle: Path | None = None) -> Path:
    """A genai model folder: genai_config.json + links to the bundle's graph folders.
    draft_bundle: take the draft model from this bundle instead (same target vocabulary); genai
    runs plain draft models only, not an EAGLE head."""
    out.mkdir(parents=True, exist_ok=True)
    draft_entry = man.draft
    if draft_bundle is not None:
        from ..manifest import load_manifest

        draft_entry = load_manifest(draft_bundle).draft
        if draft_entry is None or draft_entry.vocab_size != man.target.vocab_size:
            raise ValueError(f"{draft_bundle} has no draft model for this target's vocabulary")
    if max_draft_tokens and not ngram_size and draft_entry is not None and draft_entry.io.hidden_in:
        raise ValueError("onnxruntime-genai cannot run an EAGLE draft; pass --peer-draft BUNDLE "
                         "(a bundle with a plain draft model, e.g. configs/self_int4.toml)")
    for role, src in (("target", bundle), ("draft", draft_bundle or bundle)):
        link = out / role
        if not link.exists() and (src / role).is_dir():
            os.symlink((src / role).resolve(), link)
    tok = man.tokenizer
    cfg = {
        "model": {
            "bos_token_id": tok.bos_token_id if tok.bos_token_id is not None else 0,
            "context_length": man.target.kv.max_seq_len,
            "eos_token_id": tok.eos_token_ids,
            "pad_token_id": tok.pad_token_id if tok.pad_token_id is not None else 0,
            "type": man.target.model_type if man.target.model_type in ("llama", "mistral", "qwen2", "qwen3") else "llama",
            "vocab_size": man.target.vocab_size,
            "decoder": _section(man.target, man.target.graph, hidden, heads),
        },
        "search": {"past_present_share_buffer": True, "max_length": man.target.kv.max_seq_len, "num_beams": 1,
                   "do_sample": False, "top_k": 50, "top_p": 1.0, "temperature": 1.0, "min_length": 0,
                   "num_return_sequences": 1, "repetition_penalty": 1.0, "length_penalty": 1.0,
                   "early_stopping": True, "no_repeat_ngram_size": 0, "diversity_penalty": 0.0},
    }
    if max_draft_tokens and ngram_size:  # genai's prompt-lookup decoding (no draft model)
        cfg["speculative"] = {"max_draft_tokens": int(max_draft_tokens), "ngram_size": int(ngram_size)}
    elif max_draft_tokens and draft_entry is not None:
        cfg["model"]["draft"] = _section(draft_entry, draft_entry.graph, hidden, heads)
        cfg["speculative"] = {"max_draft_tokens": int(max_draft_tokens)}
    (out / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    return out


class GenaiRunner:
    def __init__(self, folder: Path):
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(str(folder))
        self.speculative = "speculative" in json.loads((folder / "genai_config.json").read_text())

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0) -> dict:
        og = self.og
        params = og.GeneratorParams(self.model)
        opts = dict(max_length=len(prompt_ids) + max_new_tokens, batch_size=1)
        if temperature > 0:
            opts.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0, random_seed=seed)
        else:
            opts.update(do_sample=False)
        params.set_search_options(**opts)
        gen = og.Generator(self.model, params)
        t0 = time.perf_counter()
        gen.append_tokens(np.asarray([prompt_ids], dtype=np.int32))
        if not gen.is_done():
            gen.generate_next_token()
        t1 = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        t2 = time.perf_counter()
        seq = [int(t) for t in gen.get_sequence(0)][len(prompt_ids):]
        res = {"token_ids": seq, "ttft_ms": 1000 * (t1 - t0), "decode_ms": 1000 * (t2 - t1)}
        n = len(seq)
        res["tpot_ms"] = res["decode_ms"] / (n - 1) if n > 1 else float("nan")
        if self.speculative and hasattr(gen, "get_speculative_stats"):
            try:
                res["speculative_stats"] = dict(gen.get_speculative_stats())
            except Exception:  # stats are informational only
                pass
        return res
