"""QMatMulGGML (a GGUF type's own blocks) against QMatMul4 / QMatMul8 over the same blocks, per call.

    python tools/qmatmul_bench.py --ggml [--shapes K:N:TYPE,...] [--rows 1,2,6,17] [--threads 1,2]
    python tools/qmatmul_bench.py --ggml --forms avx2,vnni [...]

Each shape's weight is random bytes of TYPE (every bit pattern is a block), in the two forms a
load can run: the kernel graphs' QMatMul4 / QMatMul8 (export/gguf_blocks.py's fp32 scales and
mins, packed by runtime/kernels/layout.py, as export/kernel_graph.py writes them) and
QMatMulGGML's records (export/kernel_blocks.py). Prints the median ms of each, their ratio and
the bytes each streams, per shape, row count and thread count, then the sums over the shapes (by
default one layer of the coder's Q4_K_M target and its LM head).

--forms A,B: QMatMulGGML alone in instruction-set forms A and B (SPECRT_KERNELS_ISA, e.g. avx2
against vnni), the sessions taking turns, with the ratio of the first form's time to the last's.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.export.gguf_blocks import FORMS as DECODERS
from specrt.export.gguf_blocks import import_blocks
from specrt.export.kernel_blocks import OP, TYPES, repack
from specrt.runtime import kernels
from specrt.runtime.kernels import layout

# Qwen2.5-Coder-1.5B Q4_K_M: q, k, v, o, gate, up, down (Q6_K in half the layers), the LM head
CODER = ("1536:1536:Q4_K,1536:256:Q4_K,1536:256:Q6_K,1536:1536:Q4_K,1536:8960:Q4_K,1536:8960:Q4_K,"
         "8960:1536:Q6_K,1536:151936:Q6_K")
F16 = {"Q4_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(type_name: str, n: int, k: int, rng) -> np.ndarray:
    per_block, type_size = TYPES[type_name]
    b = rng.integers(0, 256, size=(n * k // per_block, type_size), dtype=np.uint8)
    for off in F16[type_name]:
        b[:, off:off + 2] = (rng.random(len(b), dtype=np.float32) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return b.reshape(n, -1)


def _model(node, inits) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", None])
    m = helper.make_model(helper.make_graph([node], "g", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def today(raw, type_name: str, n: int, k: int) -> tuple[bytes, int]:
    """The kernel graphs' form: QMatMul4 / QMatMul8 with min = mins - scale * zero point."""
    qw = import_blocks(raw, type_name, n, k)
    zp = DECODERS[type_name][4]
    mins = (qw.mins if qw.mins is not None else 0) - qw.scales * np.float32(zp)
    packed, sc, mn = layout.pack(qw.codes().reshape(n, k), qw.scales, mins.astype(np.float32), qw.bits, qw.block)
    attrs = dict(block_size=qw.block) if qw.bits == 8 else {}
    node = helper.make_node(layout.FORMS[qw.bits, qw.block], ["x", "codes", "scale", "min"], ["y"],
                            domain=kernels.DOMAIN, K=k, N=n, **attrs)
    inits = [numpy_helper.from_array(a, name) for a, name in ((packed, "codes"), (sc, "scale"), (mn, "min"))]
    return _model(node, inits), packed.nbytes + sc.nbytes + mn.nbytes


def blocks_form(raw, type_name: str, n: int, k: int) -> tuple[bytes, int]:
    rec = repack(raw, type_name, n, k)
    node = helper.make_node(OP, ["x", "blocks"], ["y"], domain=kernels.DOMAIN, K=k, N=n, type=type_name)
    return _model(node, [numpy_helper.from_array(rec, "blocks")]), rec.nbytes


def timed(ss: dict, x, reps: int, stat=np.median) -> dict[str, float]:
    """ms of each session's call (`stat` over reps: median, or min on a host shared with other
    load), the sessions taking turns so that load falls on both alike."""
    for s in ss.values():
        for _ in range(3):
            s.run(None, {"x": x})
    ts: dict[str, list[float]] = {f: [] for f in ss}
    for _ in range(reps):
        for f, s in ss.items():
            t = time.perf_counter()
            s.run(None, {"x": x})
            ts[f].append(time.perf_counter() - t)
    return {f: float(stat(v)) * 1e3 for f, v in ts.items()}


def sessions(blobs: dict[str, bytes], threads: int) -> dict:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    kernels.register(so)
    return {f: ort.InferenceSession(b, so, providers=["CPUExecutionProvider"]) for f, b in blobs.items()}


def cpu() -> str:
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
        return f"{names[0]}, {len(names)} cores" if names else platform.processor()
    except OSError:
        return platform.processor()


def form_sessions(blob: bytes, forms: list[str], threads: int) -> dict:
    """One session over `blob` per instruction-set form (read when a session creates its kernels)."""
    old = os.environ.get("SPECRT_KERNELS_ISA")
    out = {}
    for f in forms:
        os.environ["SPECRT_KERNELS_ISA"] = f
        out[f] = sessions({f: blob}, threads)[f]
    if old is None:
        os.environ.pop("SPECRT_KERNELS_ISA")
    else:
        os.environ["SPECRT_KERNELS_ISA"] = old
    return out


def compare_forms(a, forms: list[str], rows: list[int], threads: list[int]) -> None:
    """QMatMulGGML in each form, per shape, rows and threads; the ratio of the first to the last."""
    rng = np.random.default_rng(0)
    first, last = forms[0], forms[-1]
    print(f"{cpu()}; QMatMulGGML in forms {', '.join(forms)} (this CPU's best: {kernels.isa()}); "
          f"{a.stat} ms of {a.reps}, the forms taking turns")
    print("| K x N (type) | threads | rows | " + " | ".join(forms) + f" | {first} / {last} |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in forms) + " | --- |")
    total: dict[tuple, float] = {}
    for shape in a.shapes.split(","):
        K, N, type_name = shape.split(":")
        K, N = int(K), int(N)
        blob, _ = blocks_form(random_blocks(type_name, N, K, rng), type_name, N, K)
        for th in threads:
            ss = form_sessions(blob, forms, th)
            for m in rows:
                ms = timed(ss, rng.standard_normal((m, K)).astype(np.float32), a.reps, getattr(np, a.stat))
                for f, v in ms.items():
                    total[f, th, m] = total.get((f, th, m), 0.0) + v
                print(f"| {K} x {N} ({type_name}) | {th} | {m} | " + " | ".join(f"{ms[f]:.3f}" for f in forms)
                      + f" | {ms[first] / ms[last]:.2f} |")
    print("\nThe shapes above, summed:")
    print("| threads | rows | " + " | ".join(forms) + f" | {first} / {last} |")
    print("| --- | --- | " + " | ".join("---" for _ in forms) + " | --- |")
    for th in threads:
        for m in rows:
            print(f"| {th} | {m} | " + " | ".join(f"{total[f, th, m]:.2f}" for f in forms)
                  + f" | {total[first, th, m] / total[last, th, m]:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=CODER)
    ap.add_argument("--rows", default="1,2,6,17")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="min: the fastest call, on a host whose other load preempts some")
    ap.add_argument("--forms", default=None, help="e.g. avx2,vnni: QMatMulGGML across instruction-set forms")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = [int(r) for r in a.rows.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    if a.forms:
        return compare_forms(a, a.forms.split(","), rows, threads)
    print(f"{cpu()}; kernels' form: {kernels.isa()} (SPECRT_KERNELS_ISA={os.environ.get('SPECRT_KERNELS_ISA', '')}); "
          f"{a.stat} ms of {a.reps}, the two forms taking turns")
    print("| K x N (type) | threads | rows | QMatMul4/8 | QMatMulGGML | GGML / today | MB today | MB GGML |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    total: dict[tuple, float] = {}
    for shape in a.shapes.split(","):
        K, N, type_name = shape.split(":")
        K, N = int(K), int(N)
        raw = random_blocks(type_name, N, K, rng)
        (old, old_b), (new, new_b) = today(raw, type_name, N, K), blocks_form(raw, type_name, N, K)
        del raw
        for th in threads:
            ss = sessions({"today": old, "ggml": new}, th)
            for m in rows:
                x = rng.standard_normal((m, K)).astype(np.float32)
                ms = timed(ss, x, a.reps, getattr(np, a.stat))
                for f, v in ms.items():
                    total[f, th, m] = total.get((f, th, m), 0.0) + v
                print(f"| {K} x {N} ({type_name}) | {th} | {m} | {ms['today']:.3f} | {ms['ggml']:.3f} | "
                      f"{ms['ggml'] / ms['today']:.2f} | {old_b / 1e6:.1f} | {new_b / 1e6:.1f} |")
    print("\nThe shapes above, summed:")
    print("| threads | rows | QMatMul4/8 | QMatMulGGML | GGML / today |")
    print("| --- | --- | --- | --- | --- |")
    for th in threads:
        for m in rows:
            o, n = total["today", th, m], total["ggml", th, m]
            print(f"| {th} | {m} | {o:.2f} | {n:.2f} | {n / o:.2f} |")


if __name__ == "__main__":
    main()
