"""Call costs of a bundle's packed target graph against its bundle graph (issue 39's curve):
one call of N tokens spread over R rows (packed), against what the bundle graph needs for the
same work (one call per drafting row; rows of one token batched), and what a row's attention
adds at longer contexts. Median of --reps calls, interleaved round-robin; prints markdown.

    python tools/packed_costs.py engines/coder [--lanes 8] [--reps 7] [--max-seq-len 4608]

Where the bundle has the packed graphs on specrt's own kernels (export/kernel_graph.py) and the
library is built, their calls are timed too (the "kernels" column, and the attention rows run on
them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from call_times import interleaved_medians

from specrt.runtime import kernels
from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.backends.ort import OrtModel
from specrt.runtime.backends.packed import PackedModel
from specrt.runtime.bundle.manifest import load_manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=None,
                    help="rows per lane (default the bundle's S_max: 8 lanes of the coder's 32k are 15 GB)")
    a = ap.parse_args()
    e = load_manifest(a.bundle).target
    pool = KVPool(e.kv, a.lanes, "cpu", max_seq_len=a.max_seq_len)
    pm = PackedModel(a.bundle / e.packed.file(a.lanes), e, pool, lanes=a.lanes, track="p", threads=a.threads)
    om = OrtModel(a.bundle / e.graph, e, pool, track="o", threads=a.threads)
    km = None
    if e.packed.kernels and kernels.available():
        km = PackedModel(a.bundle / e.packed.kernel_file(a.lanes), e, pool, lanes=a.lanes, track="k",
                         threads=a.threads, kernels=True)
    ids = np.arange(5, 5 + 256, dtype=np.int64)
    ctx = a.context
    shapes = {}
    for rows in (1, 2, 4, 8):
        for n in (1, 2, 4, 8, 16, 32, 64):
            if rows > a.lanes or n < rows or n // rows > pm.max_prefill_t:
                continue
            per = [n // rows + (i < n % rows) for i in range(rows)]
            seqs = [(s, ids[:t], ctx, None) for s, t in enumerate(per)]
            shapes[("packed", rows, n)] = lambda seqs=seqs: pm.run_packed(seqs)
            if km is not None:
                shapes[("kernels", rows, n)] = lambda seqs=seqs: km.run_packed(seqs)
            if rows == 1:  # what the engine runs: a min_t = 2 target widens a lone token
                shapes[("bundle", 1, n)] = lambda n=max(n, om.min_t): om.run(0, ids[:n], ctx)
            elif n == rows and om.min_t == 1:  # one-token rows batch in one call
                shapes[("bundle", rows, n)] = lambda rows=rows: om.run_rows(0, ids[:rows], np.full(rows, ctx))
            else:  # one call per row of more than one token (and per row on a min_t = 2 target)
                per = [max(t, om.min_t) for t in per]
                shapes[("bundle", rows, n)] = lambda per=per: [om.run(s, ids[:t], ctx) for s, t in enumerate(per)]
    far = [c for c in (128, 512, 2048, 4096) if c + 4 <= pool.capacity]
    for c in far:
        shapes[("attention", 1, c)] = lambda c=c: (km or pm).run_packed([(0, ids[:2], c, None)])
    med = interleaved_medians(shapes, a.reps)
    print(f"{a.bundle} ({e.precision}), {a.lanes} lanes, context {ctx}, median of {a.reps} (ms)\n")
    own = " kernels |" if km else ""
    print(f"| rows | tokens |{own} packed call | bundle graph | bundle / packed |" + (" packed / kernels |" if km else ""))
    print("| --- | --- |" + " --- |" * (5 if km else 3))
    for (kind, rows, n), v in med.items():
        if kind == "packed":
            b = med.get(("bundle", rows, n))
            k = med.get(("kernels", rows, n))
            cells = ([f"{k:.1f}"] if km else []) + [f"{v:.1f}", f"{b:.1f}" if b else "", f"{b / v:.2f}x" if b else ""]
            cells += [f"{v / k:.2f}x"] if km else []
            print(f"| {rows} | {n} | " + " | ".join(cells) + " |")
    print(f"\n| context | one row, 2 tokens ({'kernels' if km else 'packed'}) | per 1,000 positions |")
    print("| --- | --- | --- |")
    base = med[("attention", 1, far[0])]
    for c in far:
        v = med[("attention", 1, c)]
        print(f"| {c} | {v:.1f} | {1000 * (v - base) / max(c - far[0], 1):.2f} |" if c != far[0] else f"| {c} | {v:.1f} | |")


if __name__ == "__main__":
    main()
