// The chunk kernels of the fast forms of attend_ref (attention_x86.cc, attention_avx2.cc,
// attention_neon.cc), written once over the form's vector T: a 64-key chunk's keys transposed
// once per work unit, a block of queries of one position scored against it, each query's softmax
// step, then V weighed several queries x vectors at a time. Every float step is the definition's
// (attention.h), in its order: a score is one fma chain over d, then times scale; the chunk's
// 16-lane sum is 16 / kLanes vectors, vector t adding into t % (16 / kLanes), then T::sum16 in
// tree16's order; acc = acc * alpha, then one fma per key, j ascending.
//
// T: the form's float vector (Vec, kLanes lanes: 16, 8 or 4) and its sizes:
//   kBlock        queries of one position whose scores share each K load
//   kScoreVecs    key vectors a scores pass holds per query (kBlock x kScoreVecs accumulators)
//   kWeighVecs    V vectors a weigh step holds per query (4 queries x kWeighVecs accumulators)
//   zero(), set1(f), load(p) / store(p, v) (aligned), loadu(p) / storeu(p, v), add, sub, mul,
//   max(a, b), fma(a, b, c) = a * b + c rounded once
//   exp(x)        exp_def lane by lane
//   head(s, n)    the vector at s, lanes n and past as -inf (s: kChunk floats, vector-aligned)
//   max_lanes(v)  its largest lane
//   sum16(v)      the 16 lanes of v[0 .. 16 / kLanes) summed in tree16's order
//   transpose(r, out)  a kLanes x kLanes block: out[j] = column j of the rows r[0 ..]
//
// Included only by the forms' objects, with internal linkage (attention_walk.h says why).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention.h"
#include "attention_walk.h"

namespace specrt {
namespace {

template <class T>
struct AttnChunk {
  using Vec = typename T::Vec;
  static constexpr int W = T::kLanes;
  static_assert(16 % W == 0, "the definition's 16 lanes are whole vectors");

  // K rows [c0, c0 + kChunk) -> kt[d][kChunk] (rows past `last` as zeros; blocks of W wholly past
  // it are left unwritten and never read).
  template <int DV>
  static void transpose_chunk(const float* K, int64_t c0, int64_t last, const float* zeros, float* kt) {
    constexpr int64_t D = W * DV;
    for (int64_t kb = 0; kb < kChunk / W && c0 + W * kb <= last; ++kb) {
      const float* row[W];
      for (int i = 0; i < W; ++i) row[i] = c0 + W * kb + i <= last ? K + (c0 + W * kb + i) * D : zeros;
      for (int db = 0; db < DV; ++db) {
        Vec r[W], col[W];
        for (int i = 0; i < W; ++i) r[i] = T::loadu(row[i] + W * db);
        T::transpose(r, col);
        for (int j = 0; j < W; ++j) T::store(kt + (W * db + j) * kChunk + W * kb, col[j]);
      }
    }
  }

  // Scores (dot * scale) of QB queries against keys [W g0, W (g0 + groups)) of the chunk (kt:
  // transposed), into s[q][..]: each dot one fma chain over d.
  template <int QB, int DV>
  static void scores_pass(const Query* x, const float* kt, int g0, int groups, float scale, float (*s)[kChunk]) {
    constexpr int64_t D = W * DV;
    Vec a[QB][T::kScoreVecs];
    for (int q = 0; q < QB; ++q)
      for (int g = 0; g < T::kScoreVecs; ++g) a[q][g] = T::zero();
    for (int64_t d = 0; d < D; ++d) {
      const float* k = kt + d * kChunk + W * g0;
      Vec qd[QB];
      for (int q = 0; q < QB; ++q) qd[q] = T::set1(x[q].q[d]);
      for (int g = 0; g < T::kScoreVecs; ++g) {
        if (g >= groups) break;
        const Vec kv = T::load(k + W * g);
        for (int q = 0; q < QB; ++q) a[q][g] = T::fma(qd[q], kv, a[q][g]);
      }
    }
    for (int q = 0; q < QB; ++q)
      for (int g = 0; g < groups; ++g) T::store(s[q] + W * (g0 + g), T::mul(a[q][g], T::set1(scale)));
  }

  template <int QB, int DV>
  static void scores(const Query* x, const float* kt, int groups, float scale, float (*s)[kChunk]) {
    for (int g0 = 0; g0 < groups; g0 += T::kScoreVecs)
      scores_pass<QB, DV>(x, kt, g0, std::min(T::kScoreVecs, groups - g0), scale, s);
  }

  // One query's softmax step over a chunk's n scores: its max, rescale factor and weights e.
  static float softmax_step(Query& x, const float* s, int64_t n, float* e) {
    const int64_t groups = (n + W - 1) / W;
    Vec sv[kChunk / W];
    Vec cmv = T::set1(-std::numeric_limits<float>::infinity());
    for (int t = 0; t < groups; ++t) {
      sv[t] = T::head(s + W * t, n - W * t);
      cmv = T::max(cmv, sv[t]);
    }
    const float mn = std::fmax(x.m, T::max_lanes(cmv)), alpha = exp_def(x.m - mn);
    Vec sum[16 / W];  // the definition's 16 lanes
    for (Vec& v : sum) v = T::zero();
    for (int t = 0; t < groups; ++t) {
      const Vec et = T::exp(T::sub(sv[t], T::set1(mn)));
      T::store(e + W * t, et);
      sum[t % (16 / W)] = T::add(sum[t % (16 / W)], et);
    }
    x.l = x.l * alpha;
    x.l = x.l + T::sum16(sum);
    x.m = mn;
    return alpha;
  }

  // acc = acc * alpha + sum_j e_j V_j, for PB queries and CB of the D / W vectors from vector c0
  // (PB x CB accumulators in registers: each V load serves PB queries, each weight CB vectors).
  template <int PB, int CB, int DV>
  static void weigh(Query* x, const float* alpha, float (*e)[kChunk], const float* V, int64_t n, int c0) {
    constexpr int64_t D = W * DV;
    Vec acc[PB][CB];
    for (int q = 0; q < PB; ++q)
      for (int c = 0; c < CB; ++c) acc[q][c] = T::mul(T::loadu(x[q].acc + W * (c0 + c)), T::set1(alpha[q]));
    for (int64_t j = 0; j < n; ++j) {
      Vec ej[PB];
      for (int q = 0; q < PB; ++q) ej[q] = T::set1(e[q][j]);
      for (int c = 0; c < CB; ++c) {
        const Vec v = T::loadu(V + j * D + W * (c0 + c));
        for (int q = 0; q < PB; ++q) acc[q][c] = T::fma(ej[q], v, acc[q][c]);
      }
    }
    for (int q = 0; q < PB; ++q)
      for (int c = 0; c < CB; ++c) T::storeu(x[q].acc + W * (c0 + c), acc[q][c]);
  }

  template <int PB, int DV>
  static void weigh_queries(Query* x, const float* alpha, float (*e)[kChunk], const float* V, int64_t n) {
    constexpr int CB = T::kWeighVecs, rest = DV % CB;
    for (int c = 0; c + CB <= DV; c += CB) weigh<PB, CB, DV>(x, alpha, e, V, n, c);
    if constexpr (rest > 0) weigh<PB, rest, DV>(x, alpha, e, V, n, DV - rest);
  }

  // Every query of a block, four at a time.
  template <int DV>
  static void weigh_all(Query* x, int nq, const float* alpha, float (*e)[kChunk], const float* V, int64_t n) {
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
  static void chunk(Query* x, const float* kt, const float* V, int64_t c0, float scale) {
    const int64_t p = x[0].p, n = std::min<int64_t>(kChunk, p + 1 - c0);
    alignas(sizeof(Vec)) float s[QB][kChunk];
    alignas(sizeof(Vec)) float e[QB][kChunk];
    float alpha[QB];
    scores<QB, DV>(x, kt, static_cast<int>((n + W - 1) / W), scale, s);
    for (int q = 0; q < QB; ++q) alpha[q] = softmax_step(x[q], s[q], n, e[q]);
    weigh_all<DV>(x, QB, alpha, e, V + c0 * W * DV, n);
  }

  // A block of qb (1 .. kBlock) queries.
  template <int DV, int QB = T::kBlock>
  static void chunk_any(Query* x, int qb, const float* kt, const float* V, int64_t c0, float scale) {
    if constexpr (QB > 1)
      if (qb < QB) return chunk_any<DV, QB - 1>(x, qb, kt, V, c0, scale);
    chunk<QB, DV>(x, kt, V, c0, scale);
  }

  template <int DV>
  static void walk(std::vector<Query>& qs, const float* K, const float* V, float scale) {
    alignas(sizeof(Vec)) static thread_local float zeros[W * DV] = {};
    alignas(sizeof(Vec)) static thread_local float kt[W * DV * kChunk];
    walk_chunks<T::kBlock>(
        qs, W * DV, [&](int64_t c0, int64_t last) { transpose_chunk<DV>(K, c0, last, zeros, kt); },
        [&](Query* x, int n, int64_t c0) { chunk_any<DV>(x, n, kt, V, c0, scale); });
  }
};

// attend_ref's contract in the form T.
template <class T>
void attend_chunks(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1) {
  attend_form(c, lane, g, e0, e1, [&](auto d, std::vector<Query>& qs, const float* K, const float* V) {
    AttnChunk<T>::template walk<decltype(d)::value / T::kLanes>(qs, K, V, c.scale);
  });
}

}  // namespace
}  // namespace specrt
