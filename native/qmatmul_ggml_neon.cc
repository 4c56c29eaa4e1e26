// The ARM64 forms of qmatmul_ggml_ref.cc: NEON (ggml_neon) and NEON with the dot-product
// extension (ggml_dotprod), one source built twice (native/arm_dot.h). Same numbers, bit for
// bit: the integer dot products are exact, and each output's float steps are the ref's (the
// types: qmatmul_ggml_types.h, on quarter tiles).
#include "arm_dot.h"
#include "qmatmul_ggml.h"
#include "qmatmul_ggml_drive.h"
#include "qmatmul_ggml_types.h"

namespace specrt {
namespace {

using arm::dot4;

inline uint8x16_t load(const uint8_t* p) { return vld1q_u8(p); }

// The 32-block's dots over its first and last 16 codes (v: 8 vectors of int8 codes, vector j
// holding k = 4j .. 4j + 3).
inline void halves(const uint8x16_t* v, const int8_t* q8, int32x4_t* lo, int32x4_t* hi) {
  const int32_t* q = reinterpret_cast<const int32_t*>(q8);
  int32x4_t a = vdupq_n_s32(0), b = vdupq_n_s32(0);
  for (int j = 0; j < 4; ++j) {
    a = dot4(a, vreinterpretq_s8_u8(v[j]), q[j]);
    b = dot4(b, vreinterpretq_s8_u8(v[j + 4]), q[j + 4]);
  }
  *lo = a, *hi = b;
}

// Quarter tiles (qmatmul_ggml_types.h's I): 4 of a record's 16 columns, so a 64-byte chunk's
// quarter (16 bytes: 4 columns x 4 codes) is one register. Codes are taken as int8 (4-6 bit codes
// are < 64; Q8_0's stored code ^ 0x80 is its int8 weight).
struct Neon {
  using Vec = float32x4_t;
  using Codes = uint8x16_t;
  using Ints = int32x4_t;
  static constexpr int kCols = 4;
  static constexpr bool kQ8Signed = true;
  static Vec set1(float f) { return vdupq_n_f32(f); }
  static Vec mul(Vec a, Vec b) { return vmulq_f32(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return vfmaq_f32(c, a, b); }
  static Vec load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, Vec v) { vst1q_f32(p, v); }
  static Vec cvt(Ints v) { return vcvtq_f32_s32(v); }
  static Vec neg(Vec v) { return vnegq_f32(v); }
  static Vec fp16(const uint8_t* p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }
  static Codes bytes(const uint8_t* p) { return specrt::load(p); }
  static Codes flip8(Codes v) { return veorq_u8(v, vdupq_n_u8(0x80)); }
  static Codes and8(Codes v, int m) { return vandq_u8(v, vdupq_n_u8(static_cast<uint8_t>(m))); }
  static Codes or_masked(Codes a, Codes b, int m) { return vorrq_u8(a, and8(b, m)); }
  static Codes shift16(Codes v, int n) {  // vshlq: right where n < 0
    return vreinterpretq_u8_u16(vshlq_u16(vreinterpretq_u16_u8(v), vdupq_n_s16(static_cast<int16_t>(n))));
  }
  static Vec byte_float(Codes v, int j) {
    return vcvtq_f32_u32(vandq_u32(vshlq_u32(vreinterpretq_u32_u8(v), vdupq_n_s32(-8 * j)), vdupq_n_u32(0xFF)));
  }
  static void nibbles(const uint8_t* p, Codes* v) {  // a quarter's 4-bit codes of a 32-block -> 8 vectors
    for (int j = 0; j < 4; ++j) {
      const uint8x16_t b = specrt::load(p + 64 * j);
      v[j] = vandq_u8(b, vdupq_n_u8(0x0F));
      v[j + 4] = vshrq_n_u8(b, 4);
    }
  }
  static Ints set1i(int32_t x) { return vdupq_n_s32(x); }
  static Ints addi(Ints a, Ints b) { return vaddq_s32(a, b); }
  static Ints subi(Ints a, Ints b) { return vsubq_s32(a, b); }
  static Ints mulli(Ints a, Ints b) { return vmulq_s32(a, b); }
  static Ints widen_sc(const int8_t* p) {
    int32_t four;
    __builtin_memcpy(&four, p, 4);
    return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)))));
  }
  template <int BITS>
  static void halves(const Codes* v, const int8_t* q, Ints* lo, Ints* hi) { specrt::halves(v, q, lo, hi); }
  template <int BITS>
  static Ints dot32(const Codes* v, const int8_t* q) {
    Ints lo, hi;
    specrt::halves(v, q, &lo, &hi);
    return addi(lo, hi);
  }
};

struct Q4 : FormBase {  // quarter tiles (4 columns, one q register)
  using Vec = float32x4_t;
  static constexpr int kParts = 4, kOneRow = 1, kGroup = 1, kRows = 4;
  static constexpr bool kLoadAll = false;
  static Vec zero() { return vdupq_n_f32(0.f); }
  static Vec add(Vec a, Vec b) { return vaddq_f32(a, b); }
  static Vec load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, Vec v) { vst1q_f32(p, v); }
};

}  // namespace

void SPECRT_ARM_FORM(ggml)(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  ggml_form<Q4, Neon>(a, w, s, y, t0, t1);
}

}  // namespace specrt
