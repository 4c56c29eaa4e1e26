// The ARM64 forms of qmatmul_ref.cc's matmul_ref: NEON (matmul_neon) and NEON with the
// dot-product extension (matmul_dotprod), one source built twice (native/arm_dot.h). Same
// numbers, bit for bit: a block's integer dot is exact and each output takes matmul_ref's float
// steps in its order. Quarter tiles (4 of a tile's 16 columns: 16 bytes of a 64-byte chunk);
// 8-bit codes are taken as code - 128 (int8) and 128 * sum(q) added back.

#include "arm_dot.h"
#include "qmatmul.h"
#include "qmatmul_drive.h"

namespace specrt {
namespace {

using arm::dot4;

// A block's codes of one quarter tile (p: the block's first chunk's quarter) as BLK/4 int8
// vectors, vector j for k = 4j .. 4j + 3: codes (4 bits) or code - 128 (8 bits).
template <int BITS, int BLK>
inline void load_codes(const uint8_t* p, int8x16_t* v) {
  if constexpr (BITS == 8) {
    for (int j = 0; j < BLK / 4; ++j) v[j] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p + 64 * j), vdupq_n_u8(0x80)));
  } else {
    for (int j = 0; j < 4; ++j) {
      const uint8x16_t b = vld1q_u8(p + 64 * j);
      v[j] = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F)));
      v[j + 4] = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
    }
  }
}

struct Q4 : QFormBase {  // quarter tiles (4 columns, one q register)
  using Vec = float32x4_t;
  using Code = int8x16_t;
  static constexpr int kParts = 4, kRows = 4;
  static Vec zero() { return vdupq_n_f32(0.f); }
  static Vec add(Vec a, Vec b) { return vaddq_f32(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return vfmaq_f32(c, a, b); }
  static Vec set1(float x) { return vdupq_n_f32(x); }
  static Vec load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, Vec v) { vst1q_f32(p, v); }
  template <int BITS, int BLK>
  static void load_codes(const uint8_t* p, Code* v) { specrt::load_codes<BITS, BLK>(p, v); }
  template <int BITS, int BLK>
  static Vec dot_step(Vec acc, const Code* v, const int8_t* q8, int32_t zs, Vec scale, float sa) {
    const int32_t* q = reinterpret_cast<const int32_t*>(q8);
    int32x4_t d0 = vdupq_n_s32(0), d1 = vdupq_n_s32(0);
    for (int j = 0; j < BLK / 4; j += 2) {
      d0 = dot4(d0, v[j], q[j]);
      d1 = dot4(d1, v[j + 1], q[j + 1]);
    }
    int32x4_t dot = vaddq_s32(d0, d1);
    if constexpr (BITS == 8) dot = vaddq_s32(dot, vdupq_n_s32(zs));
    return vfmaq_f32(acc, vcvtq_f32_s32(dot), vmulq_n_f32(scale, sa));
  }
};

}  // namespace

void SPECRT_ARM_FORM(matmul)(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  matmul_drive<Q4>(a, w, s, y, t0, t1);
}

}  // namespace specrt
