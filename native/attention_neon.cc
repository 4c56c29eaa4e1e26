// The ARM64 NEON form of attention_ref.cc's attend_ref: the same bits. attention_x86.cc's
// structure (each 64-key chunk transposed once per work unit, blocks of queries of one position
// scored against it, V weighed several queries x vectors at a time) on 4-lane vectors; a 16-lane
// sum of the definition is four of them. Floating point only: one form for NEON with or without
// the dot-product extension.
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "attention.h"
#include "attention_walk.h"

namespace specrt {
namespace {

// exp_def, 4 at a time (multiply, round to nearest even, two fma reductions, the Horner fmas,
// times 2^n; 0 below -80). Where it is called x <= 0 (a score minus a max at least as large), so
// for x >= -80: n in [-116, 0] and p in [0.7, 1.5], p * 2^n is a normal float and adding n to
// p's exponent field is ldexp's exact result.
inline float32x4_t exp4(float32x4_t x) {
  const uint32x4_t ok = vcgeq_f32(x, vdupq_n_f32(-80.f));
  const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-0.693359375f));
  r = vfmaq_f32(r, n, vdupq_n_f32(2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  const int32x4_t scaled = vaddq_s32(vreinterpretq_s32_f32(p), vshlq_n_s32(vcvtq_s32_f32(n), 23));
  return vreinterpretq_f32_u32(vandq_u32(ok, vreinterpretq_u32_s32(scaled)));
}

// 16 lanes (s[i]: lanes 4i .. 4i + 3) summed in tree16's order: l + 8, + 4, + 2, + 1.
inline float tree(const float32x4_t* s) {
  const float32x4_t y0 = vaddq_f32(s[0], s[2]), y1 = vaddq_f32(s[1], s[3]);  // y[l], y[l + 4]
  const float32x4_t z = vaddq_f32(y0, y1);
  const float32x2_t w = vadd_f32(vget_low_f32(z), vget_high_f32(z));
  return vget_lane_f32(w, 0) + vget_lane_f32(w, 1);
}

inline void transpose4(const float32x4_t* r, float32x4_t* out) {
  const float32x4x2_t a = vtrnq_f32(r[0], r[1]), b = vtrnq_f32(r[2], r[3]);
  out[0] = vcombine_f32(vget_low_f32(a.val[0]), vget_low_f32(b.val[0]));
  out[1] = vcombine_f32(vget_low_f32(a.val[1]), vget_low_f32(b.val[1]));
  out[2] = vcombine_f32(vget_high_f32(a.val[0]), vget_high_f32(b.val[0]));
  out[3] = vcombine_f32(vget_high_f32(a.val[1]), vget_high_f32(b.val[1]));
}

// K rows [c0, c0 + kChunk) -> kt[d][kChunk] (rows past `last` as zeros; blocks of 4 wholly past
// it are left unwritten and never read).
template <int DV>
void transpose_chunk(const float* K, int64_t c0, int64_t last, const float* zeros, float* kt) {
  constexpr int64_t D = 4 * DV;
  for (int64_t kb = 0; kb < kChunk / 4 && c0 + 4 * kb <= last; ++kb) {
    const float* row[4];
    for (int i = 0; i < 4; ++i) row[i] = c0 + 4 * kb + i <= last ? K + (c0 + 4 * kb + i) * D : zeros;
    for (int db = 0; db < DV; ++db) {
      float32x4_t r[4], col[4];
      for (int i = 0; i < 4; ++i) r[i] = vld1q_f32(row[i] + 4 * db);
      transpose4(r, col);
      for (int j = 0; j < 4; ++j) vst1q_f32(kt + (4 * db + j) * kChunk + 4 * kb, col[j]);
    }
  }
}

// Scores (dot * scale) of QB queries against keys [4 g0, 4 (g0 + groups)) of the chunk (kt:
// transposed), into s[q][..]: each dot one fma chain over d. Eight 4-key groups a pass.
template <int QB, int DV>
inline void scores_pass(const Query* x, const float* kt, int g0, int groups, float scale, float (*s)[kChunk]) {
  constexpr int64_t D = 4 * DV;
  float32x4_t a[QB][8];
  for (int q = 0; q < QB; ++q)
    for (int g = 0; g < 8; ++g) a[q][g] = vdupq_n_f32(0.f);
  for (int64_t d = 0; d < D; ++d) {
    const float* k = kt + d * kChunk + 4 * g0;
    for (int g = 0; g < 8; ++g) {
      if (g >= groups) break;
      const float32x4_t kv = vld1q_f32(k + 4 * g);
      for (int q = 0; q < QB; ++q) a[q][g] = vfmaq_n_f32(a[q][g], kv, x[q].q[d]);
    }
  }
  for (int q = 0; q < QB; ++q)
    for (int g = 0; g < groups; ++g) vst1q_f32(s[q] + 4 * (g0 + g), vmulq_n_f32(a[q][g], scale));
}

template <int QB, int DV>
inline void scores(const Query* x, const float* kt, int groups, float scale, float (*s)[kChunk]) {
  for (int g0 = 0; g0 < groups; g0 += 8) scores_pass<QB, DV>(x, kt, g0, std::min(8, groups - g0), scale, s);
}

// One query's softmax step over a chunk's n scores: its max, rescale factor and weights e.
inline float softmax_step(Query& x, const float* s, int64_t n, float* e) {
  const int64_t groups = (n + 3) / 4;
  const float32x4_t ninf = vdupq_n_f32(-std::numeric_limits<float>::infinity());
  const int32x4_t iota = {0, 1, 2, 3};
  float32x4_t sv[kChunk / 4];
  float32x4_t cmv = ninf;
  for (int t = 0; t < groups; ++t) {
    const uint32x4_t in = vcltq_s32(iota, vdupq_n_s32(static_cast<int32_t>(n - 4 * t)));
    sv[t] = vbslq_f32(in, vld1q_f32(s + 4 * t), ninf);
    cmv = vmaxq_f32(cmv, sv[t]);
  }
  const float mn = std::fmax(x.m, vmaxvq_f32(cmv)), alpha = exp_def(x.m - mn);
  float32x4_t sum[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};  // 16 lanes
  for (int t = 0; t < groups; ++t) {
    const float32x4_t et = exp4(vsubq_f32(sv[t], vdupq_n_f32(mn)));
    vst1q_f32(e + 4 * t, et);
    sum[t % 4] = vaddq_f32(sum[t % 4], et);
  }
  x.l = x.l * alpha;
  x.l = x.l + tree(sum);
  x.m = mn;
  return alpha;
}

// acc = acc * alpha + sum_j e_j V_j, for PB queries and CB of the D / 4 vectors from vector c0.
template <int PB, int CB, int DV>
inline void weigh(Query* x, const float* alpha, float (*e)[kChunk], const float* V, int64_t n, int c0) {
  constexpr int64_t D = 4 * DV;
  float32x4_t acc[PB][CB];
  for (int q = 0; q < PB; ++q)
    for (int c = 0; c < CB; ++c) acc[q][c] = vmulq_n_f32(vld1q_f32(x[q].acc + 4 * (c0 + c)), alpha[q]);
  for (int64_t j = 0; j < n; ++j) {
    for (int c = 0; c < CB; ++c) {
      const float32x4_t v = vld1q_f32(V + j * D + 4 * (c0 + c));
      for (int q = 0; q < PB; ++q) acc[q][c] = vfmaq_n_f32(acc[q][c], v, e[q][j]);
    }
  }
  for (int q = 0; q < PB; ++q)
    for (int c = 0; c < CB; ++c) vst1q_f32(x[q].acc + 4 * (c0 + c), acc[q][c]);
}

template <int PB, int DV>
inline void weigh_queries(Query* x, const float* alpha, float (*e)[kChunk], const float* V, int64_t n) {
  static_assert(DV % 4 == 0, "head sizes are multiples of 16");
  for (int c = 0; c < DV; c += 4) weigh<PB, 4, DV>(x, alpha, e, V, n, c);
}

template <int DV>
void weigh_all(Query* x, int nq, const float* alpha, float (*e)[kChunk], const float* V, int64_t n) {
  int q = 0;
  for (; q + 4 <= nq; q += 4) weigh_queries<4, DV>(x + q, alpha + q, e + q, V, n);
  switch (nq - q) {
    case 1: weigh_queries<1, DV>(x + q, alpha + q, e + q, V, n); break;
    case 2: weigh_queries<2, DV>(x + q, alpha + q, e + q, V, n); break;
    case 3: weigh_queries<3, DV>(x + q, alpha + q, e + q, V, n); break;
    default: break;
  }
}

template <int QB, int DV>
void chunk(Query* x, const float* kt, const float* V, int64_t c0, float scale) {
  const int64_t p = x[0].p, n = std::min<int64_t>(kChunk, p + 1 - c0);
  alignas(16) float s[QB][kChunk];
  alignas(16) float e[QB][kChunk];
  float alpha[QB];
  scores<QB, DV>(x, kt, static_cast<int>((n + 3) / 4), scale, s);
  for (int q = 0; q < QB; ++q) alpha[q] = softmax_step(x[q], s[q], n, e[q]);
  weigh_all<DV>(x, QB, alpha, e, V + c0 * 4 * DV, n);
}

constexpr int kBlock = 3;  // queries of one position whose scores share each K load (24 accumulators)

template <int DV>
void chunk_any(Query* x, int qb, const float* kt, const float* V, int64_t c0, float scale) {
  switch (qb) {
    case 1: chunk<1, DV>(x, kt, V, c0, scale); break;
    case 2: chunk<2, DV>(x, kt, V, c0, scale); break;
    default: chunk<3, DV>(x, kt, V, c0, scale);
  }
}

template <int DV>
void walk(std::vector<Query>& qs, const float* K, const float* V, float scale) {
  alignas(16) static thread_local float zeros[4 * DV] = {};
  alignas(16) static thread_local float kt[4 * DV * kChunk];
  walk_chunks<kBlock>(
      qs, 4 * DV, [&](int64_t c0, int64_t last) { transpose_chunk<DV>(K, c0, last, zeros, kt); },
      [&](Query* x, int n, int64_t c0) { chunk_any<DV>(x, n, kt, V, c0, scale); });
}

}  // namespace

void attend_neon(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1) {
  attend_form(c, lane, g, e0, e1, [&](auto d, std::vector<Query>& qs, const float* K, const float* V) {
    walk<decltype(d)::value / 4>(qs, K, V, c.scale);
  });
}

}  // namespace specrt
