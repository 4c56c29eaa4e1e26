"""PackedAttention (native/attention*.cc): its numbers against a float64 reference, its K/V
writes, a query row's bits in any call, and clear errors for inputs that do not fit.

Real onnxruntime sessions over the built library. A row's output must be the same bits alone and
beside other lanes of other lengths, at any width, with 1 or 2 threads, across the softmax's
chunk boundaries, and in the portable form and each fast one (AVX2, AVX-512; NEON on ARM64).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from checks import FAST_FORMS, isa_forms, kernel_model
from checks import kernel_session as session
from specrt.runtime import kernels

FORMS = ("ref", *FAST_FORMS)  # AMX hosts run the VNNI form of attention
BEST = "vnni" if kernels.isa() == "amx" else kernels.isa()
H, G, D, S, P = 6, 2, 64, 700, 1024  # heads, KV heads, head size, buffer rows, rotary positions


def graph(lanes: int, heads=H, kv_heads=G, scale=0.0) -> bytes:
    past = [f"past_{k}_{r}" for r in range(lanes) for k in "kv"]
    node = helper.make_node("PackedAttention", ["qkv", "cos", "sin", "seqlens", "tokens", "widths", "unpack", *past],
                            ["out"] + [p.replace("past", "present") for p in past], domain=kernels.DOMAIN,
                            num_heads=heads, kv_num_heads=kv_heads, scale=scale)
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("qkv", f, None), helper.make_tensor_value_info("cos", f, None),
           helper.make_tensor_value_info("sin", f, None),
           helper.make_tensor_value_info("seqlens", TensorProto.INT32, None)]
    ins += [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in ("tokens", "widths", "unpack")]
    ins += [helper.make_tensor_value_info(p, f, None) for p in past]
    outs = [helper.make_tensor_value_info(o, f, None) for o in node.output]
    return kernel_model(helper.make_graph([node], "a", ins, outs))


def tables():
    inv = 1.0 / (10000 ** (np.arange(0, D, 2) / D))
    ang = np.arange(P)[:, None] * inv[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class Call:
    """A packed call: lanes of (past K/V, tokens' qkv, filler?) -> the op's feeds."""

    def __init__(self, rng, lanes: list[tuple[int, int]], fill: bool = True):
        """lanes: (context, tokens) per lane; fill: a lone token gets a filler entry (as the
        runtime's exact calls do)."""
        self.lanes = lanes
        self.pasts = []
        qkv, tokens, widths, unpack, seqlens = [], [], [], [], []
        row = 0
        for ctx, T in lanes:
            k = rng.standard_normal((1, G, S, D)).astype(np.float32)
            v = rng.standard_normal((1, G, S, D)).astype(np.float32)
            self.pasts += [k, v]
            first = len(qkv)
            qkv += list(rng.standard_normal((T, (H + 2 * G) * D)).astype(np.float32))
            idx = list(range(first, first + T)) + ([first + T - 1] if fill and T == 1 else [])
            tokens += idx
            widths.append(len(idx))
            seqlens.append(ctx + len(idx) - 1)
            unpack += list(range(row, row + T))
            row += len(idx)
        self.qkv = np.stack(qkv)[None]
        self.tokens, self.widths = np.array(tokens, np.int64), np.array(widths, np.int64)
        self.unpack, self.seqlens = np.array(unpack, np.int64), np.array(seqlens, np.int32)

    def feeds(self, lanes_only=None) -> dict:
        cos, sin = tables()
        f = dict(qkv=self.qkv, cos=cos, sin=sin, seqlens=self.seqlens, tokens=self.tokens, widths=self.widths,
                 unpack=self.unpack)
        for r in range(len(self.lanes)):
            f[f"past_k_{r}"], f[f"past_v_{r}"] = self.pasts[2 * r], self.pasts[2 * r + 1]
        return f

    def run(self, sess) -> tuple[np.ndarray, list[np.ndarray]]:
        out = sess.run(None, self.feeds())
        return out[0][0], out[1:]


def rotate(x, c, s):
    h = x.shape[-1] // 2
    return np.concatenate([x[..., :h] * c - x[..., h:] * s, x[..., h:] * c + x[..., :h] * s], -1)


def reference(call: Call) -> np.ndarray:
    """float64 attention of every packed token over its lane's rows (new rows written first)."""
    cos, sin = (t.astype(np.float64) for t in tables())
    qkv = call.qkv[0].astype(np.float64)
    out = np.zeros((qkv.shape[0], H * D))
    o = 0
    for r, (ctx, T) in enumerate(call.lanes):
        K, V = (call.pasts[2 * r + j][0].astype(np.float64).copy() for j in (0, 1))
        w = call.widths[r]
        idx = call.tokens[o : o + w]
        for e, t in enumerate(idx):
            p = ctx + e
            kk = qkv[t, H * D : (H + G) * D].reshape(G, D)
            K[:, p] = rotate(kk, cos[p], sin[p])
            V[:, p] = qkv[t, (H + G) * D :].reshape(G, D)
        for e in range(T):
            t, p = idx[e], ctx + e
            q = rotate(qkv[t, : H * D].reshape(H, D), cos[p], sin[p])
            for h in range(H):
                g = h // (H // G)
                sc = K[g, : p + 1] @ q[h] / np.sqrt(D)
                pr = np.exp(sc - sc.max())
                out[t, h * D : (h + 1) * D] = pr @ V[g, : p + 1] / pr.sum()
        o += w
    return out


@pytest.mark.parametrize("form", isa_forms(FORMS))
def test_numbers_and_kv_rows(form, monkeypatch):
    rng = np.random.default_rng(0)
    call = Call(rng, [(0, 3), (63, 1), (130, 17), (511, 2)])
    out, pres = call.run(session(graph(4), form, monkeypatch))
    ref = reference(call)
    assert np.abs(out - ref).max() < 2e-5 * np.abs(ref).max()
    cos, sin = tables()
    k_new = rotate(call.qkv[0, 3, H * D : (H + G) * D].reshape(G, D), cos[63], sin[63])
    np.testing.assert_allclose(pres[2][0, :, 63], k_new, rtol=1e-6, atol=1e-6)  # lane 1's token at 63
    np.testing.assert_array_equal(pres[3][0, :, 63], call.qkv[0, 3, (H + G) * D :].reshape(G, D))
    np.testing.assert_array_equal(pres[2][0, :, :63], call.pasts[2][0, :, :63])  # rows before: untouched


@pytest.mark.parametrize("form", isa_forms(FORMS))
def test_a_rows_bits_do_not_depend_on_the_call(form, monkeypatch):
    """Lane 0's rows alone (and each of its tokens alone, at its own position), against the same
    rows beside 1..7 other lanes of other lengths, with 1 and 2 threads, in this form and the
    portable one (the definition)."""
    forms = tuple(dict.fromkeys(("ref", form)))
    rng = np.random.default_rng(1)
    checked = 0
    for ctx in (0, 1, 62, 63, 64, 65, 127, 300, 640):
        T = 5
        base = Call(rng, [(ctx, T)])
        seqs = {}
        for f in forms:
            for threads in (1, 2):
                for others in (0, 1, 3, 7):
                    lanes = [(ctx, T)] + [((ctx * 7 + 31 * i) % 650, 1 + (i * 5) % 9) for i in range(others)]
                    call = Call(np.random.default_rng(ctx + others), lanes)
                    call.qkv[0, :T], call.pasts[0], call.pasts[1] = base.qkv[0], base.pasts[0], base.pasts[1]
                    out, pres = call.run(session(graph(len(lanes)), f, monkeypatch, threads))
                    seqs[f, threads, others] = out[:T], pres[0][0, :, ctx : ctx + T]
        first = next(iter(seqs.values()))
        for key, (o, k) in seqs.items():
            assert np.array_equal(o, first[0]), f"context {ctx}: {key}"
            assert np.array_equal(k, first[1]), f"context {ctx}: {key}"
            checked += 1
        # each token alone at its position, after the ones before it: the same bits as in the wide call
        for e in range(T):
            one = Call(rng, [(ctx + e, 1)])
            one.qkv[0, 0] = base.qkv[0, e]
            one.pasts = [p.copy() for p in base.pasts]
            for j in range(e):  # the rows the wide call wrote before token e
                one.pasts[0][0, :, ctx + j], one.pasts[1][0, :, ctx + j] = seqs["ref", 1, 0][1][:, j], \
                    base.qkv[0, j, (H + G) * D :].reshape(G, D)
            o, _ = one.run(session(graph(1), form, monkeypatch))
            assert np.array_equal(o[0], first[0][e]), f"context {ctx}: token {e} alone"
    assert checked == 9 * len(forms) * 2 * 4


def test_bad_inputs_are_clear_errors(monkeypatch):
    rng = np.random.default_rng(2)
    sess = session(graph(2), BEST, monkeypatch)
    call = Call(rng, [(10, 2), (20, 1)])
    bad = call.feeds()
    bad["unpack"] = np.array([0, 4, 2], np.int64)
    with pytest.raises(Exception, match="unpack_index must name a lane entry"):
        sess.run(None, bad)
    bad = call.feeds()
    bad["seqlens"] = np.array([10, S + 5], np.int32)
    with pytest.raises(Exception, match="lane 1's entries do not fit"):
        sess.run(None, bad)
    bad = call.feeds()
    bad["widths"] = np.array([2, 1], np.int64)
    with pytest.raises(Exception, match="add up to lane_tokens"):
        sess.run(None, bad)
    bad = call.feeds()
    bad["tokens"] = np.array([0, 1, 9, 2], np.int64)
    with pytest.raises(Exception, match="lane_tokens must index"):
        sess.run(None, bad)
    sess.run(None, call.feeds())  # the session still runs
    with pytest.raises(Exception, match="multiple of kv_num_heads"):
        session(graph(1, heads=5, kv_heads=2), BEST, monkeypatch)
