// The AVX-512 VNNI form of qmatmul_ggml_ref.cc, compiled for that instruction set only (the
// library calls it where the CPU has it; CPUs with AMX run it too). Same numbers, bit for bit:
// the integer dot products are exact in any order, and each output's float steps are the ref's.
#include <immintrin.h>

#include "qmatmul_ggml.h"
#include "qmatmul_ggml_drive.h"

namespace specrt {
namespace {

inline __m512i bytes(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }  // not globals: no AVX-512 at load
inline __m512i load(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline __m512 fp16x16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512i or_masked(__m512i a, __m512i b, __m512i mask) { return _mm512_ternarylogic_epi32(a, b, mask, 0xF8); }  // a | (b & mask)

// A 32-block's 4-bit codes (256 bytes) -> 8 vectors of u8 codes, vector j holding k = 4j .. 4j + 3.
inline void nibbles(const uint8_t* p, __m512i* v) {
  for (int j = 0; j < 4; ++j) {
    const __m512i b = load(p + 64 * j);
    v[j] = _mm512_and_si512(b, bytes(0x0F));
    v[j + 4] = _mm512_and_si512(_mm512_srli_epi16(b, 4), bytes(0x0F));
  }
}

// The 32-block's dots over its first and last 16 codes, exact in int32.
inline void halves(const __m512i* v, const int8_t* q8, __m512i* lo, __m512i* hi) {
  const int32_t* q = reinterpret_cast<const int32_t*>(q8);
  __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[0], _mm512_set1_epi32(q[0]));
  __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[4], _mm512_set1_epi32(q[4]));
  for (int j = 1; j < 4; ++j) {
    a = _mm512_dpbusd_epi32(a, v[j], _mm512_set1_epi32(q[j]));
    b = _mm512_dpbusd_epi32(b, v[j + 4], _mm512_set1_epi32(q[j + 4]));
  }
  *lo = a, *hi = b;
}

// Each type: Head (per tile and ggml block: its fp16 fields, decoded scales), Blk (per tile and
// 32-block: codes and what its step needs), head(), load() and step() (one 32-block of one row).
template <int TYPE>  // Q8_0 (codes stored + 128) and Q4_0: one fp16 d a 32-block, its zero point in zs
struct Legacy {
  static constexpr int kType = TYPE, kSuper = 32;
  struct Head {
    __m512 d;
  };
  struct Blk {
    __m512i v[8];
    __m512 d;
  };
  static void head(const uint8_t* rec, int, Head* h) { h->d = fp16x16(rec); }
  static void load_blk(const uint8_t* rec, int, int, const Head& h, Blk* k) {
    if constexpr (TYPE == kQ8_0) {
      for (int j = 0; j < 8; ++j) k->v[j] = load(rec + 32 + 64 * j);
    } else {
      nibbles(rec + 32, k->v);
    }
    k->d = h.d;
  }
  static __m512 step(__m512 acc, const Blk& k, const Row& r, int64_t b) {
    __m512i lo, hi;
    halves(k.v, r.q + 32 * b, &lo, &hi);
    const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(lo, hi), _mm512_set1_epi32(r.zs[b]));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(k.d, _mm512_set1_ps(r.sa[b])), acc);
  }
};

template <bool FIFTH>  // Q4_K, Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins
struct KQuant {
  static constexpr int kType = FIFTH ? kQ5_K : kQ4_K, kSuper = 256;
  struct Head {
    alignas(64) float scale[8][16];  // d * sc
    alignas(64) float min[8][16];    // -(dmin * m)
  };
  struct Blk {
    __m512i v[8];
    const float *scale, *min;  // into the head: read where the step uses them (fewer live registers)
  };
  static void store4(const __m512i six, __m512 f, float (*out)[16]) {  // 4 bytes a column -> 4 vectors
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_and_si512(_mm512_srli_epi32(six, 8 * j), _mm512_set1_epi32(0xFF));
      _mm512_store_ps(out[j], _mm512_mul_ps(_mm512_cvtepi32_ps(v), f));
    }
  }
  static void head(const uint8_t* rec, int, Head* h) {
    const __m512 d = fp16x16(rec);
    const __m512 neg_dmin = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(fp16x16(rec + 32)),
                                                                 _mm512_set1_epi32(INT32_MIN)));
    const __m512i g0 = load(rec + 64), g1 = load(rec + 128), g2 = load(rec + 192);
    const __m512i sc_hi = or_masked(_mm512_and_si512(g2, bytes(0x0F)), _mm512_srli_epi32(g0, 2), bytes(0x30));
    const __m512i m_hi = or_masked(_mm512_and_si512(_mm512_srli_epi32(g2, 4), bytes(0x0F)), _mm512_srli_epi32(g1, 2),
                                   bytes(0x30));
    store4(_mm512_and_si512(g0, bytes(0x3F)), d, h->scale);
    store4(sc_hi, d, h->scale + 4);
    store4(_mm512_and_si512(g1, bytes(0x3F)), neg_dmin, h->min);
    store4(m_hi, neg_dmin, h->min + 4);
  }
  static void load_blk(const uint8_t* rec, int j, int, const Head& h, Blk* k) {
    const uint8_t* p = rec + 256 + j * (FIFTH ? 320 : 256);
    nibbles(p, k->v);
    if constexpr (FIFTH) {
      const __m512i fifth = load(p + 256);  // bit u of a byte: vector u's fifth bit
      for (int u = 0; u < 8; ++u) {
        const __m512i at4 = u < 4 ? _mm512_slli_epi16(fifth, 4 - u) : _mm512_srli_epi16(fifth, u - 4);
        k->v[u] = or_masked(k->v[u], at4, bytes(0x10));
      }
    }
    k->scale = h.scale[j];
    k->min = h.min[j];
  }
  static __m512 step(__m512 acc, const Blk& k, const Row& r, int64_t b) {
    __m512i lo, hi;
    halves(k.v, r.q + 32 * b, &lo, &hi);
    const __m512 scale = _mm512_mul_ps(_mm512_load_ps(k.scale), _mm512_set1_ps(r.sa[b]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), scale, acc);
    return _mm512_fmadd_ps(_mm512_load_ps(k.min), _mm512_set1_ps(r.qsa[b]), acc);
  }
};

struct Q6K {  // 16 sub-blocks of 16 with int8 scales, codes 0..63 with zero point 32
  static constexpr int kType = kQ6_K, kSuper = 256;
  struct Head {
    __m512 d;
    const int8_t* sc;
  };
  struct Blk {
    __m512i v[8], sc_lo, sc_hi;
    __m512 d;
  };
  static void head(const uint8_t* rec, int, Head* h) { h->d = fp16x16(rec), h->sc = reinterpret_cast<const int8_t*>(rec + 32); }
  static void load_blk(const uint8_t* rec, int j, int, const Head& h, Blk* k) {
    const uint8_t* p = rec + 288 + 384 * j;
    nibbles(p, k->v);
    for (int half = 0; half < 2; ++half) {
      const __m512i hb = load(p + 256 + 64 * half);  // bits 2u, 2u + 1: vector 4 half + u's bits 4, 5
      k->v[4 * half] = or_masked(k->v[4 * half], _mm512_slli_epi16(hb, 4), bytes(0x30));
      k->v[4 * half + 1] = or_masked(k->v[4 * half + 1], _mm512_slli_epi16(hb, 2), bytes(0x30));
      k->v[4 * half + 2] = or_masked(k->v[4 * half + 2], hb, bytes(0x30));
      k->v[4 * half + 3] = or_masked(k->v[4 * half + 3], _mm512_srli_epi16(hb, 2), bytes(0x30));
    }
    const auto sc16 = [&](int sub) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(h.sc + 16 * sub)); };
    k->sc_lo = _mm512_cvtepi8_epi32(sc16(2 * j));
    k->sc_hi = _mm512_cvtepi8_epi32(sc16(2 * j + 1));
    k->d = h.d;
  }
  static __m512 step(__m512 acc, const Blk& k, const Row& r, int64_t b) {
    __m512i lo, hi;
    halves(k.v, r.q + 32 * b, &lo, &hi);
    lo = _mm512_mullo_epi32(_mm512_sub_epi32(lo, _mm512_set1_epi32(r.zs[2 * b])), k.sc_lo);
    hi = _mm512_mullo_epi32(_mm512_sub_epi32(hi, _mm512_set1_epi32(r.zs[2 * b + 1])), k.sc_hi);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), _mm512_mul_ps(k.d, _mm512_set1_ps(r.sa[b])), acc);
  }
};

struct Zmm {  // a tile in one vector
  using Vec = __m512;
  static constexpr int kParts = 1, kOneRow = 4, kGroup = 2;  // one row: 4 tiles keep the dots' chains independent
  static constexpr bool kLoadAll = true;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
};

}  // namespace

void ggml_vnni(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  ggml_drive<Zmm, Legacy, KQuant, Q6K>(a, w, s, y, t0, t1);
}

}  // namespace specrt
