// The AVX2 forms' loop for 4-bit codes at several rows, over a whole 16-column tile (both
// halves): QMatMulGGML's Q4_K (qmatmul_ggml_avx2.cc) and QMatMul4 (qmatmul_avx2.cc) — the same
// chunk layout (4 chunks of 64 bytes a 32-block, 16 columns x 4 codes, low nibbles k = 4j + i,
// high nibbles k = 16 + 4j + i) and the same float steps (acc = fma(dot, scale * sa, acc), then
// acc = fma(min, qsa, acc)). A 32-block's codes are decoded once into L1 (16 vectors: too many to
// keep in registers beside the rows), then each group of up to 4 rows takes them chunk by chunk,
// one broadcast of a row's 4 activations serving both halves. The 8 chunks' vpmaddubsw pairs are
// summed in int16 (codes <= 15: 8 * 2 * 15 * 127 = 30480, no saturation), widened once.
//
// Included only by AVX2 objects, with internal linkage.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "form_step.h"

namespace specrt {
namespace {

struct NibbleTile {
  static constexpr int kGroupRows = 4;  // 2 measured slower at 9 and 17 rows (docs/benchmarks.md §40)
  struct Blk {
    __m256i codes[8][2];                // [chunk][half]
    const float *scale[2], *min[2];     // [half]: 8 columns each; min null: no mins' step
  };
  // p: the 32-block's first chunk (4 x 64 bytes)
  SPECRT_STEP static void decode(const uint8_t* p, Blk* k) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c)
      for (int u = 0; u < 2; ++u) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * c + 32 * u));
        k->codes[c][u] = _mm256_and_si256(v, low);
        k->codes[c + 4][u] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
  }
  // G rows' 32-block b into acc[2 * i + half]. R: a row with q (its int8 activations, 32 a block),
  // sa and qsa (per 32-block). MIN: take the mins' step (k.min set). mutant: SPECRT_MUTANT's
  // reordering (the block's terms added to acc last).
  template <int G, bool MIN, class R>
  SPECRT_STEP static void group(const R* r, __m256* acc, const Blk& k, int64_t b, bool mutant) {
    __m256i s[G][2];
    for (int c = 0; c < 8; ++c) {
      const __m256i c0 = k.codes[c][0], c1 = k.codes[c][1];
      for (int i = 0; i < G; ++i) {
        const __m256i qb = _mm256_set1_epi32(reinterpret_cast<const int32_t*>(r[i].q + 32 * b)[c]);
        const __m256i p0 = _mm256_maddubs_epi16(c0, qb), p1 = _mm256_maddubs_epi16(c1, qb);
        s[i][0] = c ? _mm256_add_epi16(s[i][0], p0) : p0;
        s[i][1] = c ? _mm256_add_epi16(s[i][1], p1) : p1;
      }
    }
    for (int i = 0; i < G; ++i)
      for (int u = 0; u < 2; ++u) {
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[i][u], _mm256_set1_epi16(1)));
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
