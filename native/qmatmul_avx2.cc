// The AVX2 (+FMA) form of qmatmul_ref.cc, for x86-64 CPUs without AVX-512, compiled for that
// instruction set only. Same numbers, bit for bit: a block's integer dot is exact (no sum below
// saturates) and each output takes matmul_ref's float steps in its order.
//
// Half tiles (8 of a tile's 16 columns): a 64-byte chunk's half is one register of 8 columns x
// 4 codes. A chunk's dot is vpmaddubsw (u8 x s8 pairs -> s16) then vpmaddwd by ones (-> s32).
// 4-bit codes (<= 15) keep all 8 chunks' pairs within int16 (8 * 2 * 15 * 127 = 30480); 8-bit codes
// (<= 255) would saturate a pair, so they are taken as code - 128 (|c| against q with c's sign,
// a pair <= 2 * 128 * 127 = 32512) and 128 * sum(q) is added back. 4-bit codes take whole tiles
// (avx2_tile.h's NibbleTile, which QMatMulGGML's Q4_K shares: the same chunk layout and float
// steps); 8-bit codes a half tile at a time. Built with SPECRT_AVXVNNI (avx2_dot.h) the same
// source is the AVX-VNNI form: each chunk's dot one vpdpbusd into int32, 8-bit codes as stored
// (their dot is then sum code * q itself, so the zero sums are not added).
#include <immintrin.h>

#include "avx2_dot.h"
#include "avx2_tile.h"
#include "qmatmul.h"
#include "qmatmul_drive.h"

namespace specrt {
namespace {

inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// A block's codes of one half tile (p: the block's first chunk's half) as BLK/4 vectors, vector
// j for k = 4j .. 4j + 3: u8 codes (4 bits; 8 bits with vpdpbusd) or code - 128 as int8 (8 bits).
template <int BITS, int BLK>
inline void load_codes(const uint8_t* p, __m256i* v) {
  if constexpr (BITS == 8 && kDpbusd) {
    for (int j = 0; j < BLK / 4; ++j) v[j] = load(p + 64 * j);
  } else if constexpr (BITS == 8) {
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

// The block's dot per column: sum of code * q (4 bits; 8 bits with vpdpbusd) or of
// (code - 128) * q (8 bits), exact.
template <int BITS, int BLK>
inline __m256i block_dot(const __m256i* v, const int32_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  if constexpr (kDpbusd) {
    acc = dpbusd_dot(v, q, BLK / 4);
  } else if constexpr (BITS == 4) {
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

struct Ymm : QFormBase {  // half tiles (8 columns, one ymm)
  using Vec = __m256;
  using Code = __m256i;
  static constexpr int kParts = 2, kRows = 4;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  template <int BITS, int BLK>
  static void load_codes(const uint8_t* p, Code* v) { specrt::load_codes<BITS, BLK>(p, v); }
  template <int BITS, int BLK>
  static Vec dot_step(Vec acc, const Code* v, const int8_t* q, int32_t zs, Vec scale, float sa) {
    __m256i dot = block_dot<BITS, BLK>(v, reinterpret_cast<const int32_t*>(q));
    if constexpr (BITS == 8 && !kDpbusd) dot = _mm256_add_epi32(dot, _mm256_set1_epi32(zs));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_set1_ps(sa)), acc);
  }

  // 4-bit codes: whole tiles at any row count (one row: two independent chains, one broadcast for
  // 16 columns; docs/benchmarks.md §41)
  template <int BITS, int BLK>
  static constexpr int kTileRows = BITS == 4 ? 1 : 0;
  template <int BITS, int BLK, int MR>
  static void tile_rows(const Activations& a, const Weights& w, const Shape& s, const int32_t*, float* y, int64_t m0,
                        int64_t t) {
    if constexpr (BITS == 4) return w.min ? nibble_tile<MR, true>(a, w, s, y, m0, t) : nibble_tile<MR, false>(a, w, s, y, m0, t);
  }
  template <int MR, bool MIN>
  static void nibble_tile(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t m0, int64_t t) {
    const int64_t nb = s.K / kQBlock;
    struct Row {
      const int8_t* q;
      const float *sa, *qsa;
    } r[MR];
    for (int i = 0; i < MR; ++i) r[i] = {a.q + (m0 + i) * s.K, a.sa + (m0 + i) * nb, a.qsa + (m0 + i) * nb};
    __m256 acc[2 * MR];
    for (auto& v : acc) v = zero();
    NibbleTile::Blk k;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t o = (t * nb + b) * kTile;
      NibbleTile::at(w.codes + (t * nb + b) * kTile * kQBlock / 2, &k);
      for (int u = 0; u < 2; ++u) k.scale[u] = w.scale + o + 8 * u, k.min[u] = MIN ? w.min + o + 8 * u : nullptr;
      NibbleTile::rows<MR, MIN>(r, acc, k, b, kMutant && MR == 4);
    }
    for (int i = 0; i < MR; ++i)
      for (int u = 0; u < 2; ++u) {
        const int64_t n = kTile * t + 8 * u;
        float* out = y + (m0 + i) * s.N + n;
        store(out, w.bias ? add(acc[2 * i + u], load(w.bias + n)) : acc[2 * i + u]);
      }
  }
};

}  // namespace

#if !defined(SPECRT_AVXVNNI)  // the AVX-VNNI form quantizes with this one (AVX2 alone)
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

#endif

void SPECRT_AVX2_FORM(matmul)(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  matmul_drive<Ymm>(a, w, s, y, t0, t1);
}

}  // namespace specrt
