"""onnxruntime-genai as a peer, on the bundle's own ONNX files (same graphs, other runtime).

Our `ort` graphs use genai's IO names and attention_mask convention; every `ort` bundle carries
its genai_config.json (runtime/bundle/genai.py), which the bench loads as a service would, with an
overlay for the arm (threads, draft, k). A draft from another bundle (`--peer-draft`) gets a
generated folder instead.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from ..bundle import genai
from ..bundle.manifest import Manifest


def available() -> bool:
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return False
    return True


def write_config(bundle: Path, man: Manifest, out: Path, *, max_draft_tokens: int | None,
                 ngram_size: int = 0, draft_bundle: Path | None = None) -> Path:
    """A genai model folder: genai_config.json + links to the bundle's graph folders.
    draft_bundle: take the draft model from this bundle instead (same target vocabulary); genai
    runs plain draft models only, not an EAGLE head."""
    out.mkdir(parents=True, exist_ok=True)
    draft_entry = man.draft
    if draft_bundle is not None:
        from ..bundle.manifest import load_manifest

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
    threads = os.cpu_count() or 1
    cfg = genai.config(man, threads)
    _merge(cfg, _speculative(draft_entry, max_draft_tokens, ngram_size, threads))
    (out / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    return out


def _speculative(draft_entry, max_draft_tokens: int | None, ngram_size: int, threads: int) -> dict:
    """The config additions of a speculative arm: genai's prompt lookup (no draft model), or
    the draft model with this k; {} for target-only."""
    if max_draft_tokens and ngram_size:
        return {"speculative": {"max_draft_tokens": int(max_draft_tokens), "ngram_size": int(ngram_size)}}
    if max_draft_tokens and draft_entry is not None:
        return genai.speculative_overlay(draft_entry, max_draft_tokens, threads)
    return {}


def _merge(cfg: dict, extra: dict) -> None:
    cfg["model"].update(extra.get("model", {}))
    if "speculative" in extra:
        cfg["speculative"] = extra["speculative"]


def bundle_overlay(man: Manifest, max_draft_tokens: int | None, ngram_size: int = 0) -> dict:
    """What the bench adds to the bundle's own genai_config.json: our thread count (genai's
    default picked fewer threads than cores on this container, a much slower step) and, for a
    speculative arm, the draft (the bundle's genai_speculative.json with this k) or prompt
    lookup."""
    threads = os.cpu_count() or 1
    over = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}
    _merge(over, _speculative(man.draft, max_draft_tokens, ngram_size, threads))
    return over


class GenaiRunner:
    def __init__(self, folder: Path, overlay: dict | None = None):
        """folder: a bundle (its genai_config.json, as services load it) or a generated folder;
        overlay: merged over that config (og.Config.overlay)."""
        import onnxruntime_genai as og

        self.og = og
        cfg = og.Config(str(folder))
        if overlay:
            cfg.overlay(json.dumps(overlay))
        self.model = og.Model(cfg)
        self.speculative = "speculative" in (overlay or {}) or \
            "speculative" in json.loads((Path(folder) / "genai_config.json").read_text())

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
