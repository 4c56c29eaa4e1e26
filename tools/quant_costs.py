"""Call-cost curves of several bundles' targets, interleaved call by call (docs/benchmarks.md §15).

For each bundle: one verification-shaped call of T tokens (B = 1) for T in --widths, and one
batched decode call of B rows x 1 token for B in --rows, all at past length --past, through the
runtime's own pool models (IO binding, KV in place). Every shape of every bundle runs once per
round, round after round, so load from other processes hits all arms alike. Prints one JSON
object: bundle -> {"T": {T: median ms}, "B": {B: median ms}}.

    python tools/quant_costs.py engines/default /tmp/int4 --rounds 15
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import specrt


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--widths", default="1,2,3,4,5,6,7,9,13,17")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--past", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args(argv)
    widths = [int(x) for x in a.widths.split(",")]
    rows = [int(x) for x in a.rows.split(",")]
    pipes = {b: specrt.load(b, draft="none", adaptive=False, cost_cache=False, max_batch=max(rows),
                            prefix_cache=False, global_pool=True) for b in a.bundles}
    shapes = [("T", t) for t in widths] + [("B", b) for b in rows if b > 1]
    times = {b: {sh: [] for sh in shapes} for b in pipes}
    for r in range(a.rounds + 1):  # round 0 warms up
        for b, pipe in pipes.items():
            model = pipe.parts.target
            for kind, n in shapes:
                ids = (np.arange(n) % 1000 + 5).astype(np.int64)
                t0 = time.perf_counter()
                if kind == "T":
                    model.run(0, ids, a.past)
                else:
                    model.run_rows(0, ids, np.full(n, a.past))
                if r:
                    times[b][(kind, n)].append(1000 * (time.perf_counter() - t0))
    out = {}
    for b in pipes:
        med = {sh: float(np.median(v)) for sh, v in times[b].items()}
        out[b] = {"T": {t: round(med[("T", t)], 2) for t in widths},
                  "B": {1: round(med[("T", 1)], 2), **{n: round(med[("B", n)], 2) for n in rows if n > 1}}}
    for pipe in pipes.values():
        pipe.close()
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
