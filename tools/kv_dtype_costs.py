"""Two bundles' packed target calls side by side (issue 38: an fp16 KV cache against the
activations' dtype): the same call shapes on each, interleaved round-robin in one process so
both see the same machine; median ms of --reps calls per shape, and the KV bytes per token.

    python tools/kv_dtype_costs.py engines/default /tmp/fp16-default --reps 5

Shapes: R rows of N tokens in all at context --context (a plain row is 1 token + its filler, a
drafting row k + 1), and one row of 2 tokens at longer contexts (what a row's attention adds).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from call_times import interleaved_medians

from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.backends.packed import PackedModel
from specrt.runtime.bundle.manifest import load_manifest

SHAPES = [(1, 1), (1, 6), (4, 4), (4, 24), (8, 8), (8, 48)]  # (rows, tokens): plain rows, k = 5 rounds
CONTEXTS = (128, 512, 1024, 2000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", type=Path, nargs=2)
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--context", type=int, default=128)
    a = ap.parse_args()
    ids = np.arange(5, 5 + 256, dtype=np.int64)
    models, calls = [], {}
    for b in a.bundles:
        e = load_manifest(b).target
        pool = KVPool(e.kv, a.lanes, "cpu")
        pm = PackedModel(b / e.packed.file(a.lanes), e, pool, lanes=a.lanes, threads=a.threads)
        models.append((b, e))
        for rows, n in SHAPES:
            per = [n // rows + (i < n % rows) for i in range(rows)]
            calls[(b, "step", rows, n)] = lambda pm=pm, per=per: pm.run_packed(
                [(s, ids[:t], a.context, None) for s, t in enumerate(per)])
        for c in CONTEXTS:
            if c + 4 <= pool.capacity:
                calls[(b, "context", 1, c)] = lambda pm=pm, c=c: pm.run_packed([(0, ids[:2], c, None)])
    med = interleaved_medians(calls, a.reps)
    (ba, ea), (bb, eb) = models
    print(f"A = {ba} (KV {ea.kv.dtype}, {ea.kv.bytes_per_token()} B/token), B = {bb} (KV {eb.kv.dtype}, "
          f"{eb.kv.bytes_per_token()} B/token); {a.lanes} lanes, median of {a.reps} (ms)\n")
    print("| call | A | B | B / A |")
    print("| --- | --- | --- | --- |")
    for (b, kind, rows, x), v in med.items():
        if b != ba:
            continue
        w = med[(bb, kind, rows, x)]
        what = f"{rows} rows, {x} tokens, context {a.context}" if kind == "step" else f"1 row, 2 tokens, context {x}"
        print(f"| {what} | {v:.1f} | {w:.1f} | {w / v:.2f}x |")


if __name__ == "__main__":
    main()
