// The AVX2 (+FMA) form of qmatmul_ref.cc, for x86-64 CPUs without AVX-512, compiled for that
// instruction set only. Same numbers, bit for bit: a block's integer dot is exact (no sum below
// saturates) and each output takes matmul_ref's float steps in its order.
//
// Half tiles (8 of a tile's 16 columns): a 64-byte chunk's half is one register of 8 columns x
// 4 codes. A chunk's dot is vpmaddubsw (u8 x s8 pairs -> s16) then vpmaddwd by ones (-> s32).
// 4-bit codes (<= 15) keep all 8 chunks' pairs within int16 (8 * 2 * 15 * 127 = 30480); 8-bit codes
// (<= 255) would saturate a pair, so they are taken as code - 128 (|c| against q with c's sign,
// a pair <= 2 * 128 * 127 = 32512) and 128 * sum(q) is added back.
#include <immintrin.h>

#include <vector>

#include "qmatmul.h"

namespace specrt {
namespace {

inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// A block's codes of one half tile (p: the block's first chunk's half) as BLK/4 vectors, vector
// j for k = 4j .. 4j + 3: u8 codes (4 bits) or code - 128 as int8 (8 bits).
template <int BITS, int BLK>
inline void load_codes(const uint8_t* p, __m256i* v) {
  if constexpr (BITS == 8) {
    for (int j = 0; j < BLK / 4; ++j) v[j] = _mm256_xor_si256(load(p + 64 * j), _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m256i b = load(p + 64 * j);
      v[j] = _mm256_and_si256(b, low);
      v[j + 4] = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    }
  }
}

// The block's dot per column: sum of code * q (4 bits) or of (code - 128) * q (8 bits), exact.
template <int BITS, int BLK>
inline __m256i block_dot(const __m256i* v, const int32_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  if constexpr (BITS == 4) {
    __m256i s = _mm256_maddubs_epi16(v[0], _mm256_set1_epi32(q[0]));
    for (int j = 1; j < 8; ++j) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(v[j], _mm256_set1_epi32(q[j])));
    acc = _mm256_madd_epi16(s, ones);
  } else {
    for (int j = 0; j < BLK / 4; ++j) {
      const __m256i qb = _mm256_set1_epi32(q[j]);
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v[j], v[j]), _mm256_sign_epi8(qb, v[j]));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
  }
  return acc;
}

// MR rows x one half tile hf (= 2 * tile + half) over all of K. zs: 128 * sum of q per row and
// block (8 bits), which the codes' offset takes out.
template <int BITS, int BLK, int MR>
void rows_half(const Activations& a, const Weights& w, const Shape& s, const int32_t* zs, float* y, int64_t m0,
               int64_t hf) {
  constexpr int64_t bytes = int64_t{kTile} * BLK * BITS / 8;
  const int64_t nb = s.K / BLK, nq = s.K / kQBlock, t = hf / 2, h = hf % 2;
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i v[BLK / 4];
    load_codes<BITS, BLK>(w.codes + (t * nb + b) * bytes + 32 * h, v);
    const int64_t o = (t * nb + b) * kTile + 8 * h;
    const __m256 scale = _mm256_loadu_ps(w.scale + o);
    for (int i = 0; i < MR; ++i) {
      const int64_t m = m0 + i;
      __m256i dot = block_dot<BITS, BLK>(v, reinterpret_cast<const int32_t*>(a.q + m * s.K + b * BLK));
      if constexpr (BITS == 8) dot = _mm256_add_epi32(dot, _mm256_set1_epi32(zs[m * nb + b]));
      const float sa = a.sa[m * nq + b * BLK / kQBlock];
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_set1_ps(sa)), acc[i]);
      if (w.min) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(w.min + o), _mm256_set1_ps(a.qsa[m * nb + b]), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* out = y + (m0 + i) * s.N + 8 * hf;
    _mm256_storeu_ps(out, w.bias ? _mm256_add_ps(acc[i], _mm256_loadu_ps(w.bias + 8 * hf)) : acc[i]);
  }
}

template <int BITS, int BLK>
void avx2(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  const int64_t nb = s.K / BLK;
  std::vector<int32_t> zs;
  if constexpr (BITS == 8) {
    zs.resize(static_cast<size_t>(s.M * nb));
    for (int64_t i = 0; i < s.M * nb; ++i) {
      int sum = 0;
      for (int k = 0; k < BLK; ++k) sum += a.q[i * BLK + k];
      zs[i] = 128 * sum;
    }
  }
  for (int64_t hf = 2 * t0; hf < 2 * t1; ++hf) {
    int64_t m = 0;
    for (; m + 4 <= s.M; m += 4) rows_half<BITS, BLK, 4>(a, w, s, zs.data(), y, m, hf);
    switch (s.M - m) {
      case 3: rows_half<BITS, BLK, 3>(a, w, s, zs.data(), y, m, hf); break;
      case 2: rows_half<BITS, BLK, 2>(a, w, s, zs.data(), y, m, hf); break;
      case 1: rows_half<BITS, BLK, 1>(a, w, s, zs.data(), y, m, hf); break;
      default: break;
    }
  }
}

}  // namespace

void quantize_avx2(const float* x, int64_t M, int64_t K, int8_t* q, float* sa) {
  const int64_t nb = K / kQBlock;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kQBlock;
      __m256 v[4], mx = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i), mx = _mm256_max_ps(mx, _mm256_and_ps(v[i], abs_mask));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
      const __m256 id = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      __m256i i[4];
      for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));  // to nearest even
      // packs interleave 128-bit lanes: 0..3 8..11 16..19 24..27 4..7 12..15 20..23 28..31, then put back
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + m * K + b * kQBlock),
                          _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      sa[m * nb + b] = amax / 127.f;
    }
}

void matmul_avx2(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  if (s.bits == 4) return avx2<4, 32>(a, w, s, y, t0, t1);
  if (s.block == 16) return avx2<8, 16>(a, w, s, y, t0, t1);
  return avx2<8, 32>(a, w, s, y, t0, t1);
}

}  // namespace specrt
