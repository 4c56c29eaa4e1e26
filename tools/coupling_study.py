"""Coupled sampling (keyed noise, token-match verification) against rejection sampling: acceptance,
tokens per round and speed, with target-only sampling beside both.

    python tools/coupling_study.py --engines engines/default --workload configs/workloads/chat.jsonl \
        --tokens 128 --prompts 8 --out bench/coupling.json

One pipeline (one slot, the bundle's fixed k), per prompt and setting the three arms interleaved
with the order rotating, every arm warmed up once. Settings: T = 0.7 / 1.0, top-p 1.0 / 0.95. Per
arm: median ms per token after the first, acceptance rate, tokens per round; per setting: each
speculative arm's speedup over target-only of the same run.
"""

from __future__ import annotations

import argparse
import json
from itertools import product
from pathlib import Path

import numpy as np

import specrt
from specrt.runtime.engine import Stats
from specrt.runtime.sampling.draws import Draws

ARMS = ("target", "coupled", "rejection")


def run(pipe, ids, arm: str, seed: int, tokens: int, temperature: float, top_p: float) -> Stats:
    st = Stats()
    r = pipe.request(ids, max_new_tokens=tokens, temperature=temperature, top_p=top_p, seed=seed, stats=st,
                     ignore_eos=True, draft="none" if arm == "target" else "model")
    if arm == "rejection":
        r.coupled = False
        r.rng = Draws(r.seed, len(r.prompt), coupled=False)
    for _ in pipe.submit(r):
        pass
    return st


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="engines/default")
    ap.add_argument("--workload", default="configs/workloads/chat.jsonl")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    pipe = specrt.load(a.engines, max_batch=1, adaptive=False)
    prompts = [json.loads(line)["prompt"] for line in Path(a.workload).read_text().splitlines() if line.strip()]
    prompts = prompts[: a.prompts]
    settings = list(product((0.7, 1.0), (1.0, 0.95)))
    ids0 = pipe.tokenizer.encode(prompts[0], chat=True)
    for arm in ARMS:  # warm-up
        run(pipe, ids0, arm, 0, 16, 1.0, 1.0)
    rows: dict = {}
    for (i, p), (temp, top_p) in product(enumerate(prompts), settings):
        ids = pipe.tokenizer.encode(p, chat=True)
        order = ARMS[i % 3:] + ARMS[: i % 3]
        for arm in order:
            st = run(pipe, ids, arm, 1000 + i, a.tokens, temp, top_p)
            rows.setdefault((temp, top_p, arm), []).append(st)
    pipe.close()
    table = []
    for (temp, top_p) in settings:
        base = np.median([s.tpot_ms for s in rows[(temp, top_p, "target")]])
        for arm in ARMS:
            sts = rows[(temp, top_p, arm)]
            tpot = float(np.median([s.tpot_ms for s in sts]))
            drafted = sum(s.draft_tokens for s in sts)
            table.append(dict(temperature=temp, top_p=top_p, arm=arm, tpot_ms=tpot, speedup=float(base / tpot),
                              acceptance=sum(s.accepted_tokens for s in sts) / drafted if drafted else None,
                              tokens_per_round=float(np.mean([s.mean_accepted_per_round for s in sts]))
                              if arm != "target" else 1.0))
    print(f"{'T':>4} {'top_p':>5} {'arm':>10} {'ms/tok':>7} {'speedup':>7} {'accept':>6} {'tok/round':>9}")
    for t in table:
        acc = "-" if t["acceptance"] is None else f"{t['acceptance']:.3f}"
        print(f"{t['temperature']:>4} {t['top_p']:>5} {t['arm']:>10} {t['tpot_ms']:>7.2f} {t['speedup']:>7.2f} "
              f"{acc:>6} {t['tokens_per_round']:>9.2f}")
    out = {"engines": a.engines, "workload": a.workload, "tokens": a.tokens, "prompts": len(prompts), "rows": table}
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
