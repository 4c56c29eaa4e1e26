// The AVX-512 form of attention_ref.cc's attend_ref: the same bits. A work unit's queries (its
// tokens times the KV head's query heads) walk the positions chunk by chunk together, so each
// chunk's K and V rows are read from cache once for all of them.
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

// exp_def, 16 at a time (the same operations: multiply, round to nearest even, two fma
// reductions, the Horner fmas, scale by 2^n; 0 below -80).
inline __m512 exp16(__m512 x) {
  const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-80.f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(ok, _mm512_scalef_ps(p, n));
}

// One vector's 16 lanes summed in tree16's order.
inline float tree(__m512 a) {
  const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 z = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
  const __m128 w = _mm_add_ps(z, _mm_movehl_ps(z, z));
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

// A 16 x 16 block transposed: rows r[i][0..15] -> out[j] = column j (r[0][j] .. r[15][j]).
inline void transpose16(const __m512* r, __m512* out) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + m], 128-bit lane L: rows 4i .. 4i + 3 at column 4L + m
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int m = 0; m < 4; ++m) {
    const __m512 x0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44), x1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44), y1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
    out[m] = _mm512_shuffle_f32x4(x0, y0, 0x88);
    out[4 + m] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
    out[8 + m] = _mm512_shuffle_f32x4(x1, y1, 0x88);
    out[12 + m] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
  }
}

// K rows [c0, c0 + kChunk) -> kt[d][kChunk] (rows past `last` as zeros): a chunk's keys sixteen
// to a vector, for every query of the unit.
template <int DV>
void transpose_chunk(const float* K, int64_t c0, int64_t last, const float* zeros, float* kt) {
  constexpr int64_t D = 16 * DV;
  for (int64_t kb = 0; kb < kChunk / 16 && c0 + 16 * kb <= last; ++kb) {
    const float* row[16];
    for (int i = 0; i < 16; ++i) row[i] = c0 + 16 * kb + i <= last ? K + (c0 + 16 * kb + i) * D : zeros;
    for (int db = 0; db < DV; ++db) {
      __m512 r[16], col[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(row[i] + 16 * db);
      transpose16(r, col);
      for (int j = 0; j < 16; ++j) _mm512_store_ps(kt + (16 * db + j) * kChunk + 16 * kb, col[j]);
    }
  }
}

// Scores (dot * scale) of QB queries against the chunk's first 16 * groups keys (kt: the chunk
// transposed), into s[q][..]: each dot one fma chain over d.
template <int QB, int DV>
inline void scores(const Query* x, const float* kt, int groups, float scale, float (*s)[kChunk]) {
  constexpr int64_t D = 16 * DV;
  __m512 a[QB][kChunk / 16];
  for (int q = 0; q < QB; ++q)
    for (int g = 0; g < kChunk / 16; ++g) a[q][g] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const float* k = kt + d * kChunk;
    for (int g = 0; g < kChunk / 16; ++g) {
      if (g >= groups) break;
      const __m512 kv = _mm512_load_ps(k + 16 * g);
      for (int q = 0; q < QB; ++q) a[q][g] = _mm512_fmadd_ps(_mm512_set1_ps(x[q].q[d]), kv, a[q][g]);
    }
  }
  for (int q = 0; q < QB; ++q)
    for (int g = 0; g < groups; ++g) _mm512_store_ps(s[q] + 16 * g, _mm512_mul_ps(a[q][g], _mm512_set1_ps(scale)));
}

// One query's softmax step over a chunk's n scores: its max, rescale factor and weights e.
inline float softmax_step(Query& x, const float* s, int64_t n, float* e) {
  const int64_t groups = (n + 15) / 16;
  __m512 sv[kChunk / 16];
  __m512 cmv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int t = 0; t < groups; ++t) {
    const int64_t left = n - 16 * t;
    const __mmask16 in = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    sv[t] = _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), in, s + 16 * t);
    cmv = _mm512_max_ps(cmv, sv[t]);
  }
  const float mn = std::fmax(x.m, _mm512_reduce_max_ps(cmv)), alpha = exp_def(x.m - mn);
  __m512 sum = _mm512_setzero_ps();
  for (int t = 0; t < groups; ++t) {
    const __m512 et = exp16(_mm512_sub_ps(sv[t], _mm512_set1_ps(mn)));
    _mm512_store_ps(e + 16 * t, et);
    sum = _mm512_add_ps(sum, et);
  }
  x.l = x.l * alpha;
  x.l = x.l + tree(sum);
  x.m = mn;
  return alpha;
}

// acc = acc * alpha + sum_j e_j V_j, for PB queries and CB of the D / 16 vectors from vector c0
// (PB x CB accumulators in registers: each V load serves PB queries, each weight CB vectors).
template <int PB, int CB, int DV>
inline void weigh(Query* x, const float* alpha, float (*e)[kChunk], const float* V, int64_t n, int c0) {
  constexpr int64_t D = 16 * DV;
  __m512 acc[PB][CB];
  for (int q = 0; q < PB; ++q)
    for (int c = 0; c < CB; ++c)
      acc[q][c] = _mm512_mul_ps(_mm512_loadu_ps(x[q].acc + 16 * (c0 + c)), _mm512_set1_ps(alpha[q]));
  for (int64_t j = 0; j < n; ++j) {
    __m512 ej[PB];
    for (int q = 0; q < PB; ++q) ej[q] = _mm512_set1_ps(e[q][j]);
    for (int c = 0; c < CB; ++c) {
      const __m512 v = _mm512_loadu_ps(V + j * D + 16 * (c0 + c));
      for (int q = 0; q < PB; ++q) acc[q][c] = _mm512_fmadd_ps(ej[q], v, acc[q][c]);
    }
  }
  for (int q = 0; q < PB; ++q)
    for (int c = 0; c < CB; ++c) _mm512_storeu_ps(x[q].acc + 16 * (c0 + c), acc[q][c]);
}

template <int PB, int DV>
inline void weigh_queries(Query* x, const float* alpha, float (*e)[kChunk], const float* V, int64_t n) {
  int c = 0;
  for (; c + 4 <= DV; c += 4) weigh<PB, 4, DV>(x, alpha, e, V, n, c);
  switch (DV - c) {
    case 1: weigh<PB, 1, DV>(x, alpha, e, V, n, c); break;
    case 2: weigh<PB, 2, DV>(x, alpha, e, V, n, c); break;
    case 3: weigh<PB, 3, DV>(x, alpha, e, V, n, c); break;
    default: break;
  }
}

// Every query of a block, four at a time.
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
  alignas(64) float s[QB][kChunk];
  alignas(64) float e[QB][kChunk];
  float alpha[QB];
  scores<QB, DV>(x, kt, static_cast<int>((n + 15) / 16), scale, s);
  for (int q = 0; q < QB; ++q) alpha[q] = softmax_step(x[q], s[q], n, e[q]);
  weigh_all<DV>(x, QB, alpha, e, V + c0 * 16 * DV, n);
}

template <int DV>
void chunk_any(Query* x, int qb, const float* kt, const float* V, int64_t c0, float scale) {
  switch (qb) {
    case 1: chunk<1, DV>(x, kt, V, c0, scale); break;
    case 2: chunk<2, DV>(x, kt, V, c0, scale); break;
    case 3: chunk<3, DV>(x, kt, V, c0, scale); break;
    case 4: chunk<4, DV>(x, kt, V, c0, scale); break;
    case 5: chunk<5, DV>(x, kt, V, c0, scale); break;
    default: chunk<6, DV>(x, kt, V, c0, scale);
  }
}

constexpr int kBlock = 6;  // queries of one position whose scores share each K load

template <int DV>
void walk(std::vector<Query>& qs, const float* K, const float* V, float scale) {
  alignas(64) static thread_local float zeros[16 * DV] = {};
  alignas(64) static thread_local float kt[16 * DV * kChunk];
  walk_chunks<kBlock>(
      qs, 16 * DV, [&](int64_t c0, int64_t last) { transpose_chunk<DV>(K, c0, last, zeros, kt); },
      [&](Query* x, int n, int64_t c0) { chunk_any<DV>(x, n, kt, V, c0, scale); });
}

}  // namespace

void attend_avx512(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1) {
  attend_form(c, lane, g, e0, e1, [&](auto d, std::vector<Query>& qs, const float* K, const float* V) {
    walk<decltype(d)::value / 16>(qs, K, V, c.scale);
  });
}

}  // namespace specrt
