// The AVX-512 form of attention_ref.cc's attend_ref: the same bits. Its vector for the chunk
// kernels (attention_chunk.h): a work unit's queries walk the positions chunk by chunk together,
// so each chunk's K and V rows are read from cache once for all of them.
#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "attention.h"
#include "attention_chunk.h"

namespace specrt {
namespace {

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

struct Zmm {
  using Vec = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kBlock = 6;      // 6 queries x 4 key vectors: 24 accumulators
  static constexpr int kScoreVecs = 4;  // the whole chunk in one pass
  static constexpr int kWeighVecs = 4;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float f) { return _mm512_set1_ps(f); }
  static Vec load(const float* p) { return _mm512_load_ps(p); }
  static Vec loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_store_ps(p, v); }
  static void storeu(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static float max_lanes(Vec v) { return _mm512_reduce_max_ps(v); }
  static void transpose(const Vec* r, Vec* out) { transpose16(r, out); }

  // exp_def, 16 at a time (the same operations: multiply, round to nearest even, two fma
  // reductions, the Horner fmas, scale by 2^n; 0 below -80).
  static Vec exp(Vec x) {
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

  static Vec head(const float* s, int64_t n) {
    const __mmask16 in = n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
    return _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), in, s);
  }

  // One vector's 16 lanes summed in tree16's order.
  static float sum16(const Vec* v) {
    const __m512 a = v[0];
    const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 z = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    const __m128 w = _mm_add_ps(z, _mm_movehl_ps(z, z));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
  }
};

}  // namespace

void attend_avx512(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1) {
  attend_chunks<Zmm>(c, lane, g, e0, e1);
}

}  // namespace specrt
