"""specrt's QMatMul4 / QMatMul8 (runtime/kernels) against the MatMulNBits form the packed graphs
run, per call.

    python tools/qmatmul_bench.py [--shapes K:N[:bits:block],...] [--rows 1,2,4,...] [--threads 2]
    python tools/qmatmul_bench.py --ggml [--shapes K:N:TYPE,...] [--rows 1,2,6,17] [--threads 1,2]

Both graphs hold the same codes, scales and per-block mins: a Q4_K-like weight (4 bits, blocks
of 32: MatMulNBits at accuracy_level 4 plus the block-sum correction for the mins, as
export/nbits.py `emit` writes it) or a Q6_K-like one (8 bits, blocks of 16, zero point 32). Prints
the median ms of each and their ratio, per shape and row count, and the sum over the shapes
(by default one coder layer's, then its LM head; docs/benchmarks.md §26).

--ggml: QMatMulGGML over a GGUF type's own blocks (random bytes of that type) against the
QMatMul4 / QMatMul8 form the kernel graphs make of the same blocks (tools/ggml_bench.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.runtime import kernels
from specrt.runtime.kernels import layout

# Qwen2.5-Coder-1.5B Q4_K_M: q, k, v, o, gate, up (Q4_K), down (Q6_K in half the layers), the LM head (Q6_K)
CODER = "1536:1536,1536:256,1536:256,1536:1536,1536:8960,1536:8960,8960:1536:8:16,1536:151936:8:16"


def graphs(K: int, N: int, rng, bits: int = 4, block: int = 32) -> tuple[bytes, bytes]:
    nb = K // block
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid(kernels.DOMAIN, 1)]
    scale = (rng.random((N, nb), dtype=np.float32) * 0.02).astype(np.float32)
    if bits == 8:
        return _graphs8(K, N, block, rng, scale, x, y, opsets)
    codes = rng.integers(0, 16, (N, K), dtype=np.uint8)
    mins = -(rng.random((N, nb), dtype=np.float32) * 0.1).astype(np.float32)
    # today's: MatMulNBits bytes hold k, k+1 as low, high nibbles, per column and block
    pairs = codes.reshape(N, nb, 16, 2)
    blob = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    nodes = [helper.make_node("MatMulNBits", ["x", "q", "s"], ["mm"], domain="com.microsoft", K=K, N=N, bits=4,
                              block_size=32, accuracy_level=4),
             helper.make_node("Reshape", ["x", "shape"], ["blocks"]),
             helper.make_node("ReduceSum", ["blocks", "axis"], ["sums"], keepdims=0),
             helper.make_node("MatMul", ["sums", "minsT"], ["corr"]),
             helper.make_node("Add", ["mm", "corr"], ["y"])]
    inits = [numpy_helper.from_array(blob, "q"), numpy_helper.from_array(scale.reshape(-1), "s"),
             numpy_helper.from_array(np.array([0, nb, 32], np.int64), "shape"),
             numpy_helper.from_array(np.array([-1], np.int64), "axis"),
             numpy_helper.from_array(np.ascontiguousarray(mins.T), "minsT")]
    old = helper.make_model(helper.make_graph(nodes, "nbits", [x], [y], inits), opset_imports=opsets)
    packed, sc, mn = layout.pack(codes, scale, mins)
    node = helper.make_node("QMatMul4", ["x", "codes", "scale", "min"], ["y"], domain=kernels.DOMAIN, K=K, N=N)
    inits = [numpy_helper.from_array(packed, "codes"), numpy_helper.from_array(sc, "scale"),
             numpy_helper.from_array(mn, "min")]
    new = helper.make_model(helper.make_graph([node], "q4", [x], [y], inits), opset_imports=opsets)
    old.ir_version = new.ir_version = 10
    return old.SerializeToString(), new.SerializeToString()


def _graphs8(K, N, block, rng, scale, x, y, opsets) -> tuple[bytes, bytes]:
    """Q6_K-like: codes 0..63 with zero point 32, no mins."""
    nb = K // block
    codes = rng.integers(0, 64, (N, K), dtype=np.uint8)
    zp = np.full((N, nb), 32, np.uint8)
    node = helper.make_node("MatMulNBits", ["x", "q", "s", "zp"], ["y"], domain="com.microsoft", K=K, N=N, bits=8,
                            block_size=block, accuracy_level=4)
    inits = [numpy_helper.from_array(codes.reshape(N, nb, block), "q"), numpy_helper.from_array(scale.reshape(-1), "s"),
             numpy_helper.from_array(zp, "zp")]
    old = helper.make_model(helper.make_graph([node], "nbits", [x], [y], inits), opset_imports=opsets)
    packed, sc, mn = layout.pack(codes, scale, -32 * scale, 8, block)
    node = helper.make_node("QMatMul8", ["x", "codes", "scale", "min"], ["y"], domain=kernels.DOMAIN, K=K, N=N,
                            block_size=block)
    inits = [numpy_helper.from_array(packed, "codes"), numpy_helper.from_array(sc, "scale"),
             numpy_helper.from_array(mn, "min")]
    new = helper.make_model(helper.make_graph([node], "q8", [x], [y], inits), opset_imports=opsets)
    old.ir_version = new.ir_version = 10
    return old.SerializeToString(), new.SerializeToString()


def timed(sess, x, reps) -> float:
    for _ in range(3):
        sess.run(None, {"x": x})
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        sess.run(None, {"x": x})
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def main() -> None:
    if "--ggml" in sys.argv:
        import ggml_bench

        sys.argv.remove("--ggml")
        return ggml_bench.main()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=CODER)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--forms", default=None, help="QMatMul4 forms to time (default: this CPU's best, and vnni below amx)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    best = kernels.isa()
    forms = a.forms.split(",") if a.forms else ([best, "vnni"] if best == "amx" else [best])
    rows = [int(r) for r in a.rows.split(",")]
    shapes = [tuple(int(v) for v in s.split(":")) for s in a.shapes.split(",")]
    shapes = [(*sh, 4, 32) if len(sh) == 2 else sh for sh in shapes]
    total = {(f, m): 0.0 for f in ["nbits", *forms] for m in rows}
    print(f"QMatMul4 on this CPU: {best}; {a.threads} threads; median ms of {a.reps}")
    print("| K x N | rows | MatMulNBits | " + " | ".join(f"QMatMul4 {f}" for f in forms) + " | speedup |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in forms) + " | --- |")
    for K, N, bits, block in shapes:
        old, new = graphs(K, N, rng, bits, block)
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        kernels.register(so)
        sessions = {"nbits": ort.InferenceSession(old, so, providers=["CPUExecutionProvider"])}
        for f in forms:
            os.environ["SPECRT_KERNELS_ISA"] = f
            sessions[f] = ort.InferenceSession(new, so, providers=["CPUExecutionProvider"])
        for m in rows:
            x = rng.standard_normal((m, K)).astype(np.float32)
            ms = {f: timed(s, x, a.reps) for f, s in sessions.items()}
            for f, v in ms.items():
                total[f, m] += v
            print(f"| {K} x {N}{'' if bits == 4 else f' (8-bit/{block})'} | {m} | {ms['nbits']:.3f} | " + " | ".join(f"{ms[f]:.3f}" for f in forms)
                  + f" | {ms['nbits'] / ms[forms[0]]:.2f}x |")
    print("\nThe shapes above, summed:")
    print("| rows | MatMulNBits | " + " | ".join(f"QMatMul4 {f}" for f in forms) + " | speedup |")
    print("| --- | --- | " + " | ".join("---" for _ in forms) + " | --- |")
    for m in rows:
        print(f"| {m} | {total['nbits', m]:.2f} | " + " | ".join(f"{total[f, m]:.2f}" for f in forms)
              + f" | {total['nbits', m] / total[forms[0], m]:.2f}x |")


if __name__ == "__main__":
    main()
