// specrt.PackedAttention: one layer's attention over every lane of a packed call (attention.h;
// export/kernel_graph.py puts one in place of a layer's per-lane GroupQueryAttention nodes).
//   inputs:  qkv float [1, N, (heads + 2 kv_heads) * D]  every packed token's q, k, v
//            cos, sin float [positions, D / 2]           rotary tables (halves)
//            lane_seqlens int32 [R]                      per lane: its last entry's position
//            lane_tokens int64 [W]                       the lanes' entries, lane after lane:
//                                                        the packed token each one holds
//            lane_widths int64 [R]                       entries per lane (>= 1)
//            unpack_index int64 [N]                      token i's output: entry unpack[i]
//                                                        (two tokens may name one entry)
//            past K, past V float [1, kv_heads, S_r, D]  per lane (variadic, 2R)
//   attrs:   num_heads, kv_num_heads, scale (0: 1 / sqrt(D))
//   outputs: out float [1, N, heads * D]; present K, V per lane (variadic, 2R): the past
//            buffers when bound to the same memory (written in place), else copies.
// Entry e of lane r sits at position lane_seqlens[r] - width_r + 1 + e; entries no token's
// output names (a lone token's filler, an unused lane's two) write their K/V rows only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention.h"
#include "ort_glue.h"

namespace specrt {
namespace {

struct Kernel {
  int64_t heads, kv_heads;
  float scale;  // 0: 1 / sqrt(D)
  int isa;
};

OrtStatus* fail(const std::string& msg) { return specrt::fail("PackedAttention", msg); }

struct Unit {
  int64_t lane, g, e0, e1;
};

struct Job {
  const AttnCall* c;
  const std::vector<Unit>* units;
  int isa;
};

void run_unit(void* p, size_t i) {
  const Job& j = *static_cast<Job*>(p);
  const Unit& u = (*j.units)[i];
#if defined(__aarch64__)
  (j.isa >= kNeon ? attend_neon : attend_ref)(*j.c, u.lane, u.g, u.e0, u.e1);
#else
  // kAvxVnni: the AVX2 form (attention's dots are fp32 fmas: vpdpbusd has nothing to do)
  (j.isa >= kVnni ? attend_avx512 : j.isa >= kAvx2 ? attend_avx2 : attend_ref)(*j.c, u.lane, u.g, u.e0, u.e1);
#endif
}

// The index inputs, checked: per lane its first position and first entry; per entry the packed
// token it holds (lane_tokens) and the token whose output it is (or -1).
struct Lanes {
  const int64_t* token = nullptr;
  std::vector<int64_t> rows, first, offset, width, target;
  std::vector<std::pair<int64_t, int64_t>> copies;  // (token, token computed): entries named twice
  std::vector<float*> k, v;
};

OrtStatus* check_lanes(OrtKernelContext* ctx, int64_t N, int64_t G, int64_t D, int64_t positions, Lanes* L) {
  const OrtValue *seq_v, *tok_v, *wid_v, *unp_v;
  std::vector<int64_t> ds, dt, dw, du;
  SPECRT_TRY(input(ctx, 3, &seq_v, &ds));
  SPECRT_TRY(input(ctx, 4, &tok_v, &dt));
  SPECRT_TRY(input(ctx, 5, &wid_v, &dw));
  SPECRT_TRY(input(ctx, 6, &unp_v, &du));
  const int64_t R = count(dw), W = count(dt);
  size_t n_in = 0;
  SPECRT_TRY(g_api->KernelContext_GetInputCount(ctx, &n_in));
  if (count(ds) != R || static_cast<int64_t>(n_in) != 7 + 2 * R)
    return fail("lane_seqlens, lane_widths and the past K/V pairs must name the same lanes");
  if (count(du) != N) return fail("unpack_index must hold one entry per packed token");
  int32_t* seq;
  int64_t *tok, *wid, *unp;
  SPECRT_TRY(data(seq_v, &seq));
  SPECRT_TRY(data(tok_v, &tok));
  SPECRT_TRY(data(wid_v, &wid));
  SPECRT_TRY(data(unp_v, &unp));
  int64_t off = 0;
  for (int64_t r = 0; r < R; ++r) {
    const OrtValue* past[2];
    std::vector<int64_t> dk, dv;
    SPECRT_TRY(input(ctx, 7 + 2 * r, &past[0], &dk));
    SPECRT_TRY(input(ctx, 8 + 2 * r, &past[1], &dv));
    if (dk.size() != 4 || dk != dv || dk[0] != 1 || dk[1] != G || dk[3] != D)
      return fail("lane " + std::to_string(r) + "'s past K and V must be [1, kv_num_heads, S, head_size]");
    const int64_t first = seq[r] - wid[r] + 1;
    if (wid[r] < 1 || first < 0 || first + wid[r] > dk[2] || first + wid[r] > positions)
      return fail("lane " + std::to_string(r) + "'s entries do not fit its buffer or the rotary tables");
    L->rows.push_back(dk[2]);
    L->first.push_back(first);
    L->offset.push_back(off);
    L->width.push_back(wid[r]);
    off += wid[r];
  }
  if (off != W) return fail("lane_widths must add up to lane_tokens' length");
  for (int64_t e = 0; e < W; ++e)
    if (tok[e] < 0 || tok[e] >= N) return fail("lane_tokens must index the packed tokens");
  L->token = tok;
  L->target.assign(static_cast<size_t>(W), -1);
  for (int64_t i = 0; i < N; ++i) {
    if (unp[i] < 0 || unp[i] >= W) return fail("unpack_index must name a lane entry for every token");
    if (L->target[unp[i]] >= 0)
      L->copies.emplace_back(i, L->target[unp[i]]);  // a token sent twice (no M = 1 call): one output
    else
      L->target[unp[i]] = i;
  }
  return nullptr;
}

// Present K/V per lane: the past buffer itself when bound in place, else a copy of it.
OrtStatus* presents(OrtKernelContext* ctx, int64_t R, Lanes* L) {
  for (int64_t j = 0; j < 2 * R; ++j) {
    const OrtValue* past;
    std::vector<int64_t> d;
    SPECRT_TRY(input(ctx, 7 + j, &past, &d));
    OrtValue* pv = nullptr;
    SPECRT_TRY(g_api->KernelContext_GetOutput(ctx, 1 + j, d.data(), d.size(), &pv));
    float *src, *dst;
    SPECRT_TRY(data(past, &src));
    SPECRT_TRY(data(pv, &dst));
    if (dst != src) std::memcpy(dst, src, static_cast<size_t>(count(d)) * sizeof(float));
    (j % 2 ? L->v : L->k).push_back(dst);
  }
  return nullptr;
}

OrtStatus* compute(const Kernel& k, OrtKernelContext* ctx) {
  const OrtValue *qkv_v, *cos_v, *sin_v;
  std::vector<int64_t> dq, dc, dsn;
  SPECRT_TRY(input(ctx, 0, &qkv_v, &dq));
  SPECRT_TRY(input(ctx, 1, &cos_v, &dc));
  SPECRT_TRY(input(ctx, 2, &sin_v, &dsn));
  const int64_t H = k.heads, G = k.kv_heads;
  if (dq.empty() || dq.back() % (H + 2 * G)) return fail("qkv's last dimension must be (heads + 2 kv_heads) * head_size");
  const int64_t D = dq.back() / (H + 2 * G), N = count(dq) / dq.back();
  if (D % 16) return fail("head_size must be a multiple of 16");
  if (dc.size() != 2 || dc != dsn || dc[1] * 2 != D) return fail("cos and sin must be [positions, head_size / 2]");
  Lanes L;
  SPECRT_TRY(check_lanes(ctx, N, G, D, dc[0], &L));
  const int64_t R = static_cast<int64_t>(L.width.size());
  std::vector<int64_t> dout(dq);
  dout.back() = H * D;
  OrtValue* out_v = nullptr;
  SPECRT_TRY(g_api->KernelContext_GetOutput(ctx, 0, dout.data(), dout.size(), &out_v));
  SPECRT_TRY(presents(ctx, R, &L));
  float *qkv, *cosp, *sinp, *out;
  SPECRT_TRY(data(qkv_v, &qkv));
  SPECRT_TRY(data(cos_v, &cosp));
  SPECRT_TRY(data(sin_v, &sinp));
  SPECRT_TRY(data(out_v, &out));
  const AttnCall c{H, G, D, D / 2, k.scale > 0 ? k.scale : 1.f / std::sqrt(static_cast<float>(D)),
                   qkv, cosp, sinp, dc[0], out, R, L.k.data(), L.v.data(), L.rows.data(), L.first.data(),
                   L.offset.data(), L.width.data(), L.token, L.target.data()};
  for (int64_t r = 0; r < R; ++r) write_kv(c, r);
  std::vector<Unit> units;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t e0 = 0; e0 < L.width[r]; e0 += kQueryBlock) {
      const int64_t e1 = std::min(e0 + kQueryBlock, L.width[r]);
      bool any = false;
      for (int64_t e = e0; e < e1; ++e) any = any || L.target[L.offset[r] + e] >= 0;
      for (int64_t g = 0; any && g < G; ++g) units.push_back({r, g, e0, e1});
    }
  Job job{&c, &units, k.isa};
  if (!units.empty()) SPECRT_TRY(g_api->KernelContext_ParallelFor(ctx, run_unit, units.size(), 0, &job));
  for (const auto& [i, t] : L.copies) std::memcpy(out + i * H * D, out + t * H * D, static_cast<size_t>(H * D) * sizeof(float));
  return nullptr;
}

OrtStatus* ORT_API_CALL create(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** out) {
  int64_t H = 0, G = 0;
  float scale = 0.f;
  SPECRT_TRY(g_api->KernelInfoGetAttribute_int64(info, "num_heads", &H));
  SPECRT_TRY(g_api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &G));
  if (OrtStatus* st = g_api->KernelInfoGetAttribute_float(info, "scale", &scale)) g_api->ReleaseStatus(st), scale = 0.f;
  if (H <= 0 || G <= 0 || H % G) return fail("num_heads must be a positive multiple of kv_num_heads");
  *out = new Kernel{H, G, scale, best_isa()};
  return nullptr;
}

// the inputs and outputs of the header above (the lanes' K and V buffers variadic, at least 2)
CustomOp g_op = custom_op<Kernel, compute>(
    {"PackedAttention", 8, 2, {kF32, kF32, kF32, kI32, kI64, kI64, kI64, kF32}, {kF32, kF32},
     {kRequired, kRequired, kRequired, kRequired, kRequired, kRequired, kRequired, kVariadic},
     {kRequired, kVariadic}, 2},
    create);  // outlives every session

}  // namespace

OrtCustomOp* packed_attention_op() { return &g_op.op; }

}  // namespace specrt
