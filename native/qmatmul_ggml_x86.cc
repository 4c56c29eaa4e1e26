// The AVX-512 VNNI form of qmatmul_ggml_ref.cc, compiled for that instruction set only (the
// library calls it where the CPU has it; CPUs with AMX run it too). Same numbers, bit for bit:
// the integer dot products are exact in any order, and each output's float steps are the ref's
// (the types: qmatmul_ggml_types.h, on whole tiles).
#include <immintrin.h>

#include "qmatmul_ggml.h"
#include "qmatmul_ggml_drive.h"
#include "qmatmul_ggml_types.h"

namespace specrt {
namespace {

inline __m512i bytes(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }  // not globals: no AVX-512 at load

// The 32-block's dots over its first and last 16 codes (v: 8 vectors of u8 codes, vector j
// holding k = 4j .. 4j + 3), exact in int32.
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

// A whole tile a vector (qmatmul_ggml_types.h's I). vpdpbusd takes u8 codes of any size, so
// every type's dot is the same two chains.
struct Avx512 {
  using Vec = __m512;
  using Codes = __m512i;
  using Ints = __m512i;
  static constexpr int kCols = 16;
  static constexpr bool kQ8Signed = false;
  static Vec set1(float f) { return _mm512_set1_ps(f); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, Vec v) { _mm512_store_ps(p, v); }
  static Vec cvt(Ints v) { return _mm512_cvtepi32_ps(v); }
  static Vec neg(Vec v) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN))); }
  static Vec fp16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Codes bytes(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static Codes flip8(Codes v) { return v; }
  static Codes and8(Codes v, int m) { return _mm512_and_si512(v, specrt::bytes(m)); }
  static Codes or_masked(Codes a, Codes b, int m) { return _mm512_ternarylogic_epi32(a, b, specrt::bytes(m), 0xF8); }
  static Codes shift16(Codes v, int n) { return n >= 0 ? _mm512_slli_epi16(v, n) : _mm512_srli_epi16(v, -n); }
  static Vec byte_float(Codes v, int j) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j), _mm512_set1_epi32(0xFF)));
  }
  static void nibbles(const uint8_t* p, Codes* v) {  // a 32-block's 4-bit codes (256 bytes) -> 8 vectors
    for (int j = 0; j < 4; ++j) {
      const __m512i b = bytes(p + 64 * j);
      v[j] = and8(b, 0x0F);
      v[j + 4] = and8(_mm512_srli_epi16(b, 4), 0x0F);
    }
  }
  static Ints set1i(int32_t x) { return _mm512_set1_epi32(x); }
  static Ints addi(Ints a, Ints b) { return _mm512_add_epi32(a, b); }
  static Ints subi(Ints a, Ints b) { return _mm512_sub_epi32(a, b); }
  static Ints mulli(Ints a, Ints b) { return _mm512_mullo_epi32(a, b); }
  static Ints widen_sc(const int8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  template <int BITS>
  static void halves(const Codes* v, const int8_t* q, Ints* lo, Ints* hi) { specrt::halves(v, q, lo, hi); }
  template <int BITS>
  static Ints dot32(const Codes* v, const int8_t* q) {
    Ints lo, hi;
    specrt::halves(v, q, &lo, &hi);
    return addi(lo, hi);
  }
};

struct Zmm : FormBase {  // a tile in one vector
  using Vec = __m512;
  static constexpr int kParts = 1, kOneRow = 4, kGroup = 2, kRows = 4;  // one row: 4 tiles keep the dots' chains independent
  static constexpr bool kLoadAll = true;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
};

}  // namespace

void ggml_vnni(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  ggml_form<Zmm, Avx512>(a, w, s, y, t0, t1);
}

}  // namespace specrt
