"""PackedAttention against per-lane GroupQueryAttention, per call (docs/benchmarks.md §27):
the bundle's 8-lane kernel graph against the same graph without the attention fusion (written
beside it for the run, then removed), so only the attention differs. Median of --reps calls,
interleaved; prints markdown.

    python tools/attention_costs.py engines/coder [--max-seq-len 4608] [--reps 5]
    python tools/attention_costs.py engines/coder --forms avx2,vnni

--forms A,B: the kernel graph (PackedAttention and the projections' operators) in
instruction-set forms A and B (SPECRT_KERNELS_ISA), interleaved, in place of the GQA comparison.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import onnx
from call_times import interleaved_medians

import specrt.export.kernel_graph as kg
from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.backends.packed import PackedModel
from specrt.runtime.bundle.manifest import load_manifest

LANES = 8


def without_fusion(folder: Path, entry) -> Path:
    """The entry's kernel graph as session 18 wrote it (per-lane GQA), beside the real one."""
    base = (folder / entry.packed.graph).parent
    arrays: dict = {}
    m = kg.rewrite(onnx.load(str(folder / entry.packed.file(LANES)), load_external_data=False), base, arrays)
    kg.place(m, kg.data_layout(arrays))  # the offsets of kernels.onnx.data
    path = base / f"packed{LANES}.gqa-tmp.onnx"
    onnx.save(m, str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--forms", default=None, help="e.g. avx2,vnni: the kernel graph in these forms instead of GQA vs op")
    a = ap.parse_args()
    e = load_manifest(a.bundle).target
    pool = KVPool(e.kv, LANES, "cpu", max_seq_len=a.max_seq_len)
    forms = a.forms.split(",") if a.forms else None
    old_path = None if forms else without_fusion(a.bundle, e)
    try:
        if forms:
            arms = []
            for f in forms:
                os.environ["SPECRT_KERNELS_ISA"] = f  # read as each session creates its kernels
                arms.append((f, PackedModel(a.bundle / e.packed.kernel_file(LANES), e, pool, lanes=LANES, track=f,
                                            kernels=True)))
        else:
            arms = [("gqa", PackedModel(old_path, e, pool, lanes=LANES, track="o", kernels=True)),
                    ("op", PackedModel(a.bundle / e.packed.kernel_file(LANES), e, pool, lanes=LANES, track="n",
                                       kernels=True))]
        ids = np.arange(5, 5 + 600, dtype=np.int64)
        pt = arms[-1][1].max_prefill_t
        cases = [(1, 1, 512), (8, 1, 512), (8, 4, 512), (1, 1, 2000), (8, 1, 2000), (8, 4, 2000),
                 (1, pt, 0), (1, pt, 512), (1, pt, 1536)]
        if a.max_seq_len >= 4200:
            cases += [(1, pt, 3584), (8, 1, 4000)]
        cases = [c for c in cases if c[2] + max(c[1], 2) <= a.max_seq_len]  # a small bundle: what fits
        shapes = {}
        for rows, T, ctx in cases:
            seqs = [(s, ids[:T], ctx, 1 if T > 16 else None) for s in range(rows)]
            for name, m in arms:
                shapes[(name, rows, T, ctx)] = lambda m=m, seqs=seqs: m.run_packed(seqs)
        med = interleaved_medians(shapes, a.reps)
    finally:
        if old_path:
            old_path.unlink()
    (g_name, _), (p_name, _) = arms[0], arms[-1]
    heads = [f"kernel graph, {f}" for f, _ in arms] if forms else ["per-lane GQA", "PackedAttention"]
    print(f"{a.bundle}: ms per call, median of {a.reps}\n")
    print(f"| rows x tokens | context | {heads[0]} | {heads[-1]} | ratio |\n| --- | --- | --- | --- | --- |")
    for rows, T, ctx in cases:
        g, p = med[(g_name, rows, T, ctx)], med[(p_name, rows, T, ctx)]
        print(f"| {rows} x {T} | {ctx} | {g:.1f} | {p:.1f} | {g / p:.2f}x |")


if __name__ == "__main__":
    main()
