// The AVX2 (+FMA) form of attention_ref.cc's attend_ref, for x86-64 CPUs without AVX-512: the
// same bits. Its vector for the chunk kernels (attention_chunk.h): 8 lanes, so a 16-lane sum of
// the definition is a pair of them.
#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "attention.h"
#include "attention_chunk.h"

namespace specrt {
namespace {

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

struct Ymm {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kBlock = 3;      // 3 queries x 4 key vectors: 12 accumulators
  static constexpr int kScoreVecs = 4;  // half the chunk a pass
  static constexpr int kWeighVecs = 3;  // a block's 3 queries x 3: 9 fma chains (2: 6, latency-bound; 4 spills)
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float f) { return _mm256_set1_ps(f); }
  static Vec load(const float* p) { return _mm256_load_ps(p); }
  static Vec loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_store_ps(p, v); }
  static void storeu(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static void transpose(const Vec* r, Vec* out) { transpose8(r, out); }

  // exp_def, 8 at a time (multiply, round to nearest even, two fma reductions, the Horner fmas,
  // times 2^n; 0 below -80). Where it is called x <= 0 (a score minus a max at least as large),
  // so for x >= -80: n in [-116, 0] and p in [0.7, 1.5], p * 2^n is a normal float and adding n
  // to p's exponent field is ldexp's exact result.
  static Vec exp(Vec x) {
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

  static Vec head(const float* s, int64_t n) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), iota));
    return _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), _mm256_load_ps(s), in);
  }

  static float max_lanes(Vec v) {
    const __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 b = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(b, _mm_shuffle_ps(b, b, 1)));
  }

  // 16 lanes (v[0]: 0..7, v[1]: 8..15) summed in tree16's order: l + 8, + 4, + 2, + 1.
  static float sum16(const Vec* v) {
    const __m256 y = _mm256_add_ps(v[0], v[1]);
    const __m128 z = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    const __m128 w = _mm_add_ps(z, _mm_movehl_ps(z, z));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
  }
};

}  // namespace

void attend_avx2(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1) {
  attend_chunks<Ymm>(c, lane, g, e0, e1);
}

}  // namespace specrt
