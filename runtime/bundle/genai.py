"""onnxruntime-genai's `genai_config.json` for an `ort` bundle: the same graph files, read by
genai's C / C++ / C# / Java / Python API as they are (docs/bundle.md, "onnxruntime-genai").

Our `ort` graphs use genai's IO names and attention_mask convention, and bind past and present
to one buffer (`past_present_share_buffer`). The bundle carries two files:
  genai_config.json        the target alone (any batch size)
  genai_speculative.json   an overlay (`og.Config(bundle).overlay(...)`) adding the draft model
                           and `speculative.max_draft_tokens` (plain drafts only: genai runs no
                           EAGLE head; genai's speculative decoding is batch 1 only)
"""

from __future__ import annotations

import json
from pathlib import Path

from .manifest import Manifest, ModelEntry

CONFIG, SPECULATIVE = "genai_config.json", "genai_speculative.json"
GENAI_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def section(entry: ModelEntry, filename: str, threads: int | None = None) -> dict:
    """genai's description of one graph (a `model.decoder` or `model.draft` section)."""
    io = entry.io
    so = {"log_id": "onnxruntime-genai", "provider_options": []}
    if threads:
        so["intra_op_num_threads"] = threads
    return {
        "session_options": so,
        "filename": filename,
        "head_size": entry.kv.head_dim,
        "hidden_size": entry.hidden_size,
        "num_attention_heads": entry.num_heads,
        "num_hidden_layers": entry.kv.layers,
        "num_key_value_heads": entry.kv.kv_heads,
        "inputs": {"input_ids": io.input_ids, "attention_mask": io.attention_mask,
                   "past_key_names": io.past_key.replace("{i}", "%d"),
                   "past_value_names": io.past_value.replace("{i}", "%d")},
        "outputs": {"logits": io.logits, "present_key_names": io.present_key.replace("{i}", "%d"),
                    "present_value_names": io.present_value.replace("{i}", "%d")},
    }


def config(man: Manifest, threads: int | None = None) -> dict:
    t, tok = man.target, man.tokenizer
    return {
        "model": {
            "bos_token_id": tok.bos_token_id if tok.bos_token_id is not None else 0,
            "context_length": t.kv.max_seq_len,
            "eos_token_id": tok.eos_token_ids if tok.eog_token_ids is None else tok.eog_token_ids,
            "pad_token_id": tok.pad_token_id if tok.pad_token_id is not None else 0,
            "type": t.model_type if t.model_type in GENAI_TYPES else "llama",
            "vocab_size": t.vocab_size,
            "decoder": section(t, t.graph, threads),
        },
        "search": {"past_present_share_buffer": True, "max_length": t.kv.max_seq_len, "num_beams": 1,
                   "do_sample": False, "top_k": 50, "top_p": 1.0, "temperature": 1.0, "min_length": 0,
                   "num_return_sequences": 1, "repetition_penalty": 1.0, "length_penalty": 1.0,
                   "early_stopping": True, "no_repeat_ngram_size": 0, "diversity_penalty": 0.0},
    }


def speculative_overlay(draft: ModelEntry, max_draft_tokens: int, threads: int | None = None,
                        filename: str | None = None) -> dict:
    return {"model": {"draft": section(draft, filename or draft.graph, threads)},
            "speculative": {"max_draft_tokens": int(max_draft_tokens)}}


def usable(man: Manifest) -> bool:
    """genai runs the `ort` lowering of the families it knows, from the portable graphs."""
    return man.target.lowering == "ort" and not man.target.io.hidden_out and not man.target.portable_missing


def write(folder: Path, man: Manifest) -> list[str]:
    """Write the bundle's genai files; returns their names ([] where genai cannot run it)."""
    if not usable(man):
        return []
    folder = Path(folder)
    (folder / CONFIG).write_text(json.dumps(config(man), indent=2))
    names = [CONFIG]
    d = man.draft
    if d is not None and d.lowering == "ort" and not d.io.hidden_in and not d.portable_missing:
        k = d.default_k or 4
        (folder / SPECULATIVE).write_text(json.dumps(speculative_overlay(d, k), indent=2))
        names.append(SPECULATIVE)
    return names
