// The AVX2 (+FMA) form of attention_ref.cc's attend_ref, for x86-64 CPUs without AVX-512: the
// same bits. attention_x86.cc's structure (each 64-key chunk transposed once per work unit,
// blocks of queries of one position scored against it, V weighed several queries x vectors at a
// time) on 8-lane vectors; a 16-lane sum of the definition is a pair of them.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "attention.h"
#include "attention_walk.h"

namespace specrt {
namespace {

// exp_def, 8 at a time (multiply, round to nearest even, two fma reductions, the Horner fmas,
// times 2^n; 0 below -80). Where it is called x <= 0 (a score minus a max at least as large), so
// for x >= -80: n in [-116, 0] and p in [0.7, 1.5], p * 2^n is a normal float and adding n to
// p's exponent field is ldexp's exact result.
inline __m256 exp8(__m256 x) {
  const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(-80.f), _CMP_GE_OQ);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i scaled = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
  return _mm256_and_ps(ok, _mm256_castsi256_ps(scaled));
}

// 16 lanes (lo: 0..7, hi: 8..15) summed in tree16's order: l + 8, + 4, + 2, + 1.
inline float tree(__m256 lo, __m256 hi) {
  const __m256 y = _mm256_add_ps(lo, hi);
  const __m128 z = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
  const __m128 w = _mm_add_ps(z, _mm_movehl_ps(z, z));
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

inline float max8(__m256 v) {
  const __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 b = _mm_max_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_max_ss(b, _mm_shuffle_ps(b, b, 1)));
}

// An 8 x 8 block transposed: out[j] = column j (r[0][j] .. r[7][j]).
inline void transpose8(const __m256* r, __m256* out) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // u[4i + m], 128-bit lane L: rows 4i .. 4i + 3 at column 4L + m
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int m = 0; m < 4; ++m) {
    out[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
    out[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
  }
}

// K rows [c0, c0 + kChunk) -> kt[d][kChunk] (rows past `last` as zeros; blocks of 8 wholly past
// it are left unwritten and never read).
template <int DV>
void transpose_chunk(const float* K, int64_t c0, int64_t last, const float* zeros, float* kt) {
  constexpr int64_t D = 8 * DV;
  for (int64_t kb = 0; kb < kChunk / 8 && c0 + 8 * kb <= last; ++kb) {
    const float* row[8];
    for (int i = 0; i < 8; ++i) row[i] = c0 + 8 * kb + i <= last ? K + (c0 + 8 * kb + i) * D : zeros;
    for (int db = 0; db < DV; ++db) {
      __m256 r[8], col[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(row[i] + 8 * db);
      transpose8(r, col);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(kt + (8 * db + j) * kChunk + 8 * kb, col[j]);
    }
  }
}

// Scores (dot * scale) of QB queries against keys [32 g0, 32 g0 + 8 groups) of the chunk (kt:
// transposed), into s[q][..]: each dot one fma chain over d. Four 8-key groups a pass.
template <int QB, int DV>
inline void scores_pass(const Query* x, const float* kt, int g0, int groups, float scale, float (*s)[kChunk]) {
  constexpr int64_t D = 8 * DV;
  __m256 a[QB][4];
  for (int q = 0; q < QB; ++q)
    for (int g = 0; g < 4; ++g) a[q][g] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const float* k = kt + d * kChunk + 8 * g0;
    __m256 qd[QB];
    for (int q = 0; q < QB; ++q) qd[q] = _mm256_set1_ps(x[q].q[d]);
    for (int g = 0; g < 4; ++g) {
      if (g >= groups) break;
      const __m256 kv = _mm256_load_ps(k + 8 * g);
      for (int q = 0; q < QB; ++q) a[q][g] = _mm256_fmadd_ps(qd[q], kv, a[q][g]);
    }
  }
  for (int q = 0; q < QB; ++q)
    for (int g = 0; g < groups; ++g) _mm256_store_ps(s[q] + 8 * (g0 + g), _mm256_mul_ps(a[q][g], _mm256_set1_ps(scale)));
}

template <int QB, int DV>
inline void scores(const Query* x, const float* kt, int groups, float scale, float (*s)[kChunk]) {
  for (int g0 = 0; g0 < groups; g0 += 4) scores_pass<QB, DV>(x, kt, g0, std::min(4, groups - g0), scale, s);
}

// One query's softmax step over a chunk's n scores: its max, rescale factor and weights e.
inline float softmax_step(Query& x, const float* s, int64_t n, float* e) {
  const int64_t groups = (n + 7) / 8;
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 sv[kChunk / 8];
  __m256 cmv = ninf;
  for (int t = 0; t < groups; ++t) {
    const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - 8 * t)), iota));
    sv[t] = _mm256_blendv_ps(ninf, _mm256_load_ps(s + 8 * t), in);
    cmv = _mm256_max_ps(cmv, sv[t]);
  }
  const float mn = std::fmax(x.m, max8(cmv)), alpha = exp_def(x.m - mn);
  __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // the definition's 16 lanes
  for (int t = 0; t < groups; ++t) {
    const __m256 et = exp8(_mm256_sub_ps(sv[t], _mm256_set1_ps(mn)));
    _mm256_store_ps(e + 8 * t, et);
    sum[t % 2] = _mm256_add_ps(sum[t % 2], et);
  }
  x.l = x.l * alpha;
  x.l = x.l + tree(sum[0], sum[1]);
  x.m = mn;
  return alpha;
}

// acc = acc * alpha + sum_j e_j V_j, for PB queries and CB of the D / 8 vectors from vector c0.
template <int PB, int CB, int DV>
inline void weigh(Query* x, const float* alpha, float (*e)[kChunk], const float* V, int64_t n, int c0) {
  constexpr int64_t D = 8 * DV;
  __m256 acc[PB][CB];
  for (int q = 0; q < PB; ++q)
    for (int c = 0; c < CB; ++c)
      acc[q][c] = _mm256_mul_ps(_mm256_loadu_ps(x[q].acc + 8 * (c0 + c)), _mm256_set1_ps(alpha[q]));
  for (int64_t j = 0; j < n; ++j) {
    __m256 ej[PB];
    for (int q = 0; q < PB; ++q) ej[q] = _mm256_set1_ps(e[q][j]);
    for (int c = 0; c < CB; ++c) {
      const __m256 v = _mm256_loadu_ps(V + j * D + 8 * (c0 + c));
      for (int q = 0; q < PB; ++q) acc[q][c] = _mm256_fmadd_ps(ej[q], v, acc[q][c]);
    }
  }
  for (int q = 0; q < PB; ++q)
    for (int c = 0; c < CB; ++c) _mm256_storeu_ps(x[q].acc + 8 * (c0 + c), acc[q][c]);
}

template <int PB, int DV>
inline void weigh_queries(Query* x, const float* alpha, float (*e)[kChunk], const float* V, int64_t n) {
  int c = 0;
  for (; c + 2 <= DV; c += 2) weigh<PB, 2, DV>(x, alpha, e, V, n, c);
  if (c < DV) weigh<PB, 1, DV>(x, alpha, e, V, n, c);
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
  alignas(32) float s[QB][kChunk];
  alignas(32) float e[QB][kChunk];
  float alpha[QB];
  scores<QB, DV>(x, kt, static_cast<int>((n + 7) / 8), scale, s);
  for (int q = 0; q < QB; ++q) alpha[q] = softmax_step(x[q], s[q], n, e[q]);
  weigh_all<DV>(x, QB, alpha, e, V + c0 * 8 * DV, n);
}

constexpr int kBlock = 3;  // queries of one position whose scores share each K load (12 accumulators)

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
  alignas(32) static thread_local float zeros[8 * DV] = {};
  alignas(32) static thread_local float kt[8 * DV * kChunk];
  walk_chunks<kBlock>(
      qs, 8 * DV, [&](int64_t c0, int64_t last) { transpose_chunk<DV>(K, c0, last, zeros, kt); },
      [&](Query* x, int n, int64_t c0) { chunk_any<DV>(x, n, kt, V, c0, scale); });
}

}  // namespace

void attend_avx2(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1) {
  attend_form(c, lane, g, e0, e1, [&](auto d, std::vector<Query>& qs, const float* K, const float* V) {
    walk<decltype(d)::value / 8>(qs, K, V, c.scale);
  });
}

}  // namespace specrt
