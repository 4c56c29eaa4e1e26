"""Greedy agreement of quantized targets with a reference target, on chat prompts
(docs/benchmarks.md §15).

The reference bundle's target decodes N greedy tokens per prompt; every other bundle's target is
fed that same sequence (teacher forcing) and scored on how often its argmax is the reference's
token (the fraction of positions where it would have chosen the same), and on its own free-running
greedy continuation: the leading tokens equal to the reference's.

    python tools/quant_agreement.py engines/default /tmp/gguf4 --prompts configs/workloads/chat.jsonl
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import specrt


def _greedy(model, ids: list[int], n: int) -> list[int]:
    row = model.run(0, np.array(ids, dtype=np.int64), 0)[-1]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(row)))
        row = model.run(0, np.array(out[-1:], dtype=np.int64), len(ids) + len(out) - 1)[-1]
    return out


def _forced(model, ids: list[int], ref: list[int]) -> np.ndarray:
    seq = np.array(ids + ref[:-1], dtype=np.int64)
    logits = np.concatenate([model.run(0, seq[s:s + 16], s).copy() for s in range(0, len(seq), 16)])  # run reuses its buffer
    return logits[len(ids) - 1:].argmax(-1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("reference")
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--prompts", default="configs/workloads/chat.jsonl")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args(argv)
    prompts = [json.loads(line)["prompt"] for line in open(a.prompts) if line.strip()][: a.limit]
    load = dict(draft="none", adaptive=False, cost_cache=False, max_batch=1, prefix_cache=False)
    ref_pipe = specrt.load(a.reference, **load)
    tok = ref_pipe.tokenizer
    items = []
    for p in prompts:
        ids = tok.encode(p)  # the chat template applied
        items.append((ids, _greedy(ref_pipe.parts.target, ids, a.tokens)))
    ref_pipe.close()
    out = {}
    for b in a.bundles:
        pipe = specrt.load(b, **load)
        hits, lead = [], []
        for ids, ref in items:
            hits.append(float((_forced(pipe.parts.target, ids, ref) == np.array(ref)).mean()))
            own = _greedy(pipe.parts.target, ids, a.tokens)
            lead.append(next((i for i, (x, y) in enumerate(zip(own, ref, strict=True)) if x != y), a.tokens))
        pipe.close()
        out[b] = {"teacher_forced_agreement": round(float(np.mean(hits)), 4),
                  "free_running_leading_match": float(np.median(lead)), "prompts": len(items), "tokens": a.tokens}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
