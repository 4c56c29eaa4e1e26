// The AVX2 (+FMA, F16C) form of qmatmul_ggml_ref.cc, for x86-64 CPUs without AVX-512, compiled
// for that instruction set only. Same numbers, bit for bit: the integer dot products are exact
// (below: no sum ever saturates), and each output's float steps are the ref's, in its order.
//
// The VNNI form's structure (qmatmul_ggml_x86.cc: Head per ggml block, Blk per 32-block, step per
// row) on half tiles: 8 of a record's 16 columns, so a 64-byte chunk's half (32 bytes: 8 columns
// x 4 codes) is one register. Without vpdpbusd a chunk's dot is vpmaddubsw (u8 x s8 pairs -> s16,
// saturating) then vpmaddwd by ones (-> s32).
#include <immintrin.h>

#include "qmatmul_ggml.h"
#include "qmatmul_ggml_drive.h"

namespace specrt {
namespace {

inline __m256i bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256 fp16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256i or_masked(__m256i a, __m256i b, __m256i mask) { return _mm256_or_si256(a, _mm256_and_si256(b, mask)); }

// A half's 4-bit codes of a 32-block (p: its first chunk's half) -> 8 vectors of u8, vector j
// holding k = 4j .. 4j + 3.
inline void nibbles(const uint8_t* p, __m256i* v) {
  for (int j = 0; j < 4; ++j) {
    const __m256i b = load(p + 64 * j);
    v[j] = _mm256_and_si256(b, bytes(0x0F));
    v[j + 4] = _mm256_and_si256(_mm256_srli_epi16(b, 4), bytes(0x0F));
  }
}

// Sum of code * q over code vectors v[0..3] (16 codes a column), exact in int32. vpmaddubsw adds
// two u8 x s8 products in int16 and saturates: codes <= 63 keep a pair within 2 * 63 * 127 =
// 16002. GROUP chunks' pairs are summed in int16 before widening, as far as that cannot overflow
// (GROUP * 2 * max code * 127 <= 32767: 4 for codes <= 31, 2 for <= 63). SIGNED: the codes are
// int8 (Q8_0's weights, -128 .. 127), taken as |code| against q with the code's sign (|q| <= 127:
// a pair <= 2 * 128 * 127 = 32512).
template <int GROUP, bool SIGNED>
inline __m256i dot16(const __m256i* v, const int32_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256(), s = acc;
  for (int j = 0; j < 4; ++j) {
    const __m256i qb = _mm256_set1_epi32(q[j]);
    const __m256i p = SIGNED ? _mm256_maddubs_epi16(_mm256_sign_epi8(v[j], v[j]), _mm256_sign_epi8(qb, v[j]))
                             : _mm256_maddubs_epi16(v[j], qb);
    s = j % GROUP ? _mm256_add_epi16(s, p) : p;
    if ((j + 1) % GROUP == 0) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s, ones));
  }
  return acc;
}

// The 32-block's dot over all 32 codes of 4 bits (<= 15: the 8 chunks' pairs stay within int16,
// 8 * 2 * 15 * 127 = 30480), one widening.
inline __m256i dot32_nibbles(const __m256i* v, const int8_t* q8) {
  const int32_t* q = reinterpret_cast<const int32_t*>(q8);
  __m256i s = _mm256_maddubs_epi16(v[0], _mm256_set1_epi32(q[0]));
  for (int j = 1; j < 8; ++j) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(v[j], _mm256_set1_epi32(q[j])));
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

// The 32-block's dots over its first and last 16 codes.
template <int GROUP, bool SIGNED = false>
inline void halves(const __m256i* v, const int8_t* q8, __m256i* lo, __m256i* hi) {
  const int32_t* q = reinterpret_cast<const int32_t*>(q8);
  *lo = dot16<GROUP, SIGNED>(v, q);
  *hi = dot16<GROUP, SIGNED>(v + 4, q + 4);
}

// Each type: Head (per half tile and ggml block), Blk (per half tile and 32-block), head(),
// load_blk() and step() (one 32-block of one row), as in qmatmul_ggml_x86.cc. h: the half (0, 1).
template <int TYPE>  // Q8_0 (codes stored + 128) and Q4_0 (zero point 8, in zs)
struct Legacy {
  static constexpr int kType = TYPE, kSuper = 32;
  struct Head {
    __m256 d;
  };
  struct Blk {
    __m256i v[8];
    __m256 d;
  };
  static void head(const uint8_t* rec, int h, Head* hd) { hd->d = fp16x8(rec + 16 * h); }
  static void load_blk(const uint8_t* rec, int, int h, const Head& hd, Blk* k) {
    if constexpr (TYPE == kQ8_0) {  // code - 128: the int8 weight
      for (int j = 0; j < 8; ++j) k->v[j] = _mm256_xor_si256(load(rec + 32 + 64 * j + 32 * h), bytes(0x80));
    } else {
      nibbles(rec + 32 + 32 * h, k->v);
    }
    k->d = hd.d;
  }
  static __m256 step(__m256 acc, const Blk& k, const Row& r, int64_t b) {
    __m256i dot;
    if constexpr (TYPE == kQ8_0) {  // the weights are signed here: no zero point to take out
      __m256i lo, hi;
      halves<1, true>(k.v, r.q + 32 * b, &lo, &hi);
      dot = _mm256_add_epi32(lo, hi);
    } else {
      dot = _mm256_sub_epi32(dot32_nibbles(k.v, r.q + 32 * b), _mm256_set1_epi32(r.zs[b]));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(k.d, _mm256_set1_ps(r.sa[b])), acc);
  }
};

template <bool FIFTH>  // Q4_K, Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins
struct KQuant {
  static constexpr int kType = FIFTH ? kQ5_K : kQ4_K, kSuper = 256;
  struct Head {
    alignas(32) float scale[8][8];  // d * sc
    alignas(32) float min[8][8];    // -(dmin * m)
  };
  struct Blk {
    __m256i v[8];
    const float *scale, *min;
  };
  static void store4(const __m256i six, __m256 f, float (*out)[8]) {  // 4 bytes a column -> 4 vectors
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_and_si256(_mm256_srli_epi32(six, 8 * j), _mm256_set1_epi32(0xFF));
      _mm256_store_ps(out[j], _mm256_mul_ps(_mm256_cvtepi32_ps(v), f));
    }
  }
  static void head(const uint8_t* rec, int h, Head* hd) {
    const __m256 d = fp16x8(rec + 16 * h);
    const __m256 neg_dmin = _mm256_xor_ps(fp16x8(rec + 32 + 16 * h), _mm256_set1_ps(-0.f));
    const __m256i g0 = load(rec + 64 + 32 * h), g1 = load(rec + 128 + 32 * h), g2 = load(rec + 192 + 32 * h);
    const __m256i sc_hi = or_masked(_mm256_and_si256(g2, bytes(0x0F)), _mm256_srli_epi32(g0, 2), bytes(0x30));
    const __m256i m_hi = or_masked(_mm256_and_si256(_mm256_srli_epi32(g2, 4), bytes(0x0F)), _mm256_srli_epi32(g1, 2),
                                   bytes(0x30));
    store4(_mm256_and_si256(g0, bytes(0x3F)), d, hd->scale);
    store4(sc_hi, d, hd->scale + 4);
    store4(_mm256_and_si256(g1, bytes(0x3F)), neg_dmin, hd->min);
    store4(m_hi, neg_dmin, hd->min + 4);
  }
  static void load_blk(const uint8_t* rec, int j, int h, const Head& hd, Blk* k) {
    const uint8_t* p = rec + 256 + j * (FIFTH ? 320 : 256);
    nibbles(p + 32 * h, k->v);
    if constexpr (FIFTH) {
      const __m256i fifth = load(p + 256 + 32 * h);  // bit u of a byte: vector u's fifth bit
      for (int u = 0; u < 8; ++u) {
        const __m256i at4 = u < 4 ? _mm256_slli_epi16(fifth, 4 - u) : _mm256_srli_epi16(fifth, u - 4);
        k->v[u] = or_masked(k->v[u], at4, bytes(0x10));
      }
    }
    k->scale = hd.scale[j];
    k->min = hd.min[j];
  }
  static __m256 step(__m256 acc, const Blk& k, const Row& r, int64_t b) {
    __m256i dot;
    if constexpr (FIFTH) {
      __m256i lo, hi;
      halves<4>(k.v, r.q + 32 * b, &lo, &hi);
      dot = _mm256_add_epi32(lo, hi);
    } else {
      dot = dot32_nibbles(k.v, r.q + 32 * b);
    }
    const __m256 scale = _mm256_mul_ps(_mm256_load_ps(k.scale), _mm256_set1_ps(r.sa[b]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc);
    return _mm256_fmadd_ps(_mm256_load_ps(k.min), _mm256_set1_ps(r.qsa[b]), acc);
  }
};

struct Q6K {  // 16 sub-blocks of 16 with int8 scales, codes 0..63 with zero point 32 (in zs)
  static constexpr int kType = kQ6_K, kSuper = 256;
  struct Head {
    __m256 d;
    const int8_t* sc;  // the half's first column's scale of sub-block 0
  };
  struct Blk {
    __m256i v[8], sc_lo, sc_hi;
    __m256 d;
  };
  static void head(const uint8_t* rec, int h, Head* hd) {
    hd->d = fp16x8(rec + 16 * h), hd->sc = reinterpret_cast<const int8_t*>(rec + 32 + 8 * h);
  }
  static void load_blk(const uint8_t* rec, int j, int h, const Head& hd, Blk* k) {
    const uint8_t* p = rec + 288 + 384 * j;
    nibbles(p + 32 * h, k->v);
    for (int half = 0; half < 2; ++half) {
      const __m256i hb = load(p + 256 + 64 * half + 32 * h);  // bits 2u, 2u + 1: vector 4 half + u's bits 4, 5
      k->v[4 * half] = or_masked(k->v[4 * half], _mm256_slli_epi16(hb, 4), bytes(0x30));
      k->v[4 * half + 1] = or_masked(k->v[4 * half + 1], _mm256_slli_epi16(hb, 2), bytes(0x30));
      k->v[4 * half + 2] = or_masked(k->v[4 * half + 2], hb, bytes(0x30));
      k->v[4 * half + 3] = or_masked(k->v[4 * half + 3], _mm256_srli_epi16(hb, 2), bytes(0x30));
    }
    const auto sc8 = [&](int sub) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hd.sc + 16 * sub)); };
    k->sc_lo = _mm256_cvtepi8_epi32(sc8(2 * j));
    k->sc_hi = _mm256_cvtepi8_epi32(sc8(2 * j + 1));
    k->d = hd.d;
  }
  static __m256 step(__m256 acc, const Blk& k, const Row& r, int64_t b) {
    __m256i lo, hi;
    halves<2>(k.v, r.q + 32 * b, &lo, &hi);
    lo = _mm256_mullo_epi32(_mm256_sub_epi32(lo, _mm256_set1_epi32(r.zs[2 * b])), k.sc_lo);
    hi = _mm256_mullo_epi32(_mm256_sub_epi32(hi, _mm256_set1_epi32(r.zs[2 * b + 1])), k.sc_hi);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)), _mm256_mul_ps(k.d, _mm256_set1_ps(r.sa[b])), acc);
  }
};

// Half tiles (8 columns, one ymm): NH = 1 keeps a half's 8 code vectors and MR accumulators
// within AVX2's 16 registers; one row takes both halves of a tile (two independent accumulator
// chains, the codes used as they load).
struct Ymm {
  using Vec = __m256;
  static constexpr int kParts = 2, kOneRow = 2, kGroup = 1;
  static constexpr bool kLoadAll = false;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
};

}  // namespace

void ggml_avx2(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  ggml_drive<Ymm, Legacy, KQuant, Q6K>(a, w, s, y, t0, t1);
}

}  // namespace specrt
