// The AVX2 forms' loop for 4-bit codes over a whole 16-column tile (both halves): QMatMulGGML's
// Q4_K at several rows (qmatmul_ggml_avx2.cc) and QMatMul4 at any (qmatmul_avx2.cc) — the same
// chunk layout (4 chunks of 64 bytes a 32-block, 16 columns x 4 codes, low nibbles k = 4j + i,
// high nibbles k = 16 + 4j + i) and the same float steps (acc = fma(dot, scale * sa, acc), then
// acc = fma(min, qsa, acc)). Each group of up to 4 rows takes a 32-block chunk by chunk, the
// chunk's nibbles split as they load (decoding the block once into L1 for all groups measured the
// same: docs/benchmarks.md §41), one broadcast of a row's 4 activations serving both halves. The
// 8 chunks' vpmaddubsw pairs are summed in int16 in any order (codes <= 15: 8 * 2 * 15 * 127 =
// 30480, no saturation), widened once; with vpdpbusd (avx2_dot.h) the chunks add into int32.
//
// Included only by AVX2 objects, with internal linkage.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "avx2_dot.h"
#include "form_step.h"

namespace specrt {
namespace {

struct NibbleTile {
  static constexpr int kGroupRows = 4;  // 2 measured slower (docs/benchmarks.md §40, §41)
  struct Blk {
    const uint8_t* codes;             // the 32-block's first chunk (4 x 64 bytes)
    const float *scale[2], *min[2];   // [half]: 8 columns each; min null: no mins' step
  };
  SPECRT_STEP static void at(const uint8_t* p, Blk* k) { k->codes = p; }
  // G rows' 32-block b into acc[2 * i + half]. R: a row with q (its int8 activations, 32 a block),
  // sa and qsa (per 32-block). MIN: take the mins' step (k.min set). mutant: SPECRT_MUTANT's
  // reordering (the block's terms added to acc last).
  template <int G, bool MIN, class R>
  SPECRT_STEP static void group(const R* r, __m256* acc, const Blk& k, int64_t b, bool mutant) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const int32_t* q[G];
    for (int i = 0; i < G; ++i) q[i] = reinterpret_cast<const int32_t*>(r[i].q + 32 * b);
    // [row][half][chain]: int16 pair sums (AVX2; one chain) or int32 dots (vpdpbusd: at 1-2 rows
    // the low and the high nibbles in two chains, or vpdpbusd's latency binds; at 3-4, one)
    constexpr int C = kDpbusd && G <= 2 ? 2 : 1;
    __m256i s[G][2][C];
    for (int c = 0; c < 4; ++c) {
      __m256i raw[2];
      for (int u = 0; u < 2; ++u) raw[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.codes + 64 * c + 32 * u));
      for (int h = 0; h < 2; ++h) {  // low nibbles: chunk c; high: chunk c + 4
        const __m256i c0 = _mm256_and_si256(h ? _mm256_srli_epi16(raw[0], 4) : raw[0], low);
        const __m256i c1 = _mm256_and_si256(h ? _mm256_srli_epi16(raw[1], 4) : raw[1], low);
        for (int i = 0; i < G; ++i) {
          const __m256i qb = _mm256_set1_epi32(q[i][c + 4 * h]);
          if constexpr (kDpbusd) {
            const int e = h % C;
            const bool first = C == 2 ? c == 0 : c == 0 && h == 0;
            s[i][0][e] = dpbusd(first ? _mm256_setzero_si256() : s[i][0][e], c0, qb);
            s[i][1][e] = dpbusd(first ? _mm256_setzero_si256() : s[i][1][e], c1, qb);
          } else {
            const __m256i p0 = _mm256_maddubs_epi16(c0, qb), p1 = _mm256_maddubs_epi16(c1, qb);
            s[i][0][0] = c || h ? _mm256_add_epi16(s[i][0][0], p0) : p0;
            s[i][1][0] = c || h ? _mm256_add_epi16(s[i][1][0], p1) : p1;
          }
        }
      }
    }
    for (int i = 0; i < G; ++i)
      for (int u = 0; u < 2; ++u) {
        __m256i d = s[i][u][0];
        if constexpr (C == 2) d = _mm256_add_epi32(d, s[i][u][1]);
        const __m256 dot = _mm256_cvtepi32_ps(kDpbusd ? d : _mm256_madd_epi16(d, _mm256_set1_epi16(1)));
        const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(k.scale[u]), _mm256_set1_ps(r[i].sa[b]));
        __m256& a = acc[2 * i + u];
        __m256 t = _mm256_fmadd_ps(dot, scale, mutant ? _mm256_setzero_ps() : a);
        if constexpr (MIN) t = _mm256_fmadd_ps(_mm256_loadu_ps(k.min[u]), _mm256_set1_ps(r[i].qsa[b]), t);
        a = mutant ? _mm256_add_ps(a, t) : t;
      }
  }
  // every group of kGroupRows rows of MR, then the rest
  template <int MR, bool MIN, class R>
  SPECRT_STEP static void rows(const R* r, __m256* acc, const Blk& k, int64_t b, bool mutant) {
    constexpr int G = kGroupRows;
    int g = 0;
    for (; g + G <= MR; g += G) group<G, MIN>(r + g, acc + 2 * g, k, b, mutant);
    if constexpr (MR % G != 0) group<MR % G, MIN>(r + g, acc + 2 * g, k, b, mutant);
  }
};

}  // namespace
}  // namespace specrt
