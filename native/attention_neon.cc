// The ARM64 NEON form of attention_ref.cc's attend_ref: the same bits. Its vector for the chunk
// kernels (attention_chunk.h): 4 lanes, so a 16-lane sum of the definition is four of them.
// Floating point only: one form for NEON with or without the dot-product extension.
#include <arm_neon.h>

#include <cstdint>
#include <limits>

#include "attention.h"
#include "attention_chunk.h"

namespace specrt {
namespace {

struct Qreg {
  using Vec = float32x4_t;
  static constexpr int kLanes = 4;
  static constexpr int kBlock = 3;      // 3 queries x 8 key vectors: 24 accumulators
  static constexpr int kScoreVecs = 8;  // half the chunk a pass
  static constexpr int kWeighVecs = 4;
  static Vec zero() { return vdupq_n_f32(0.f); }
  static Vec set1(float f) { return vdupq_n_f32(f); }
  static Vec load(const float* p) { return vld1q_f32(p); }
  static Vec loadu(const float* p) { return vld1q_f32(p); }
  static void store(float* p, Vec v) { vst1q_f32(p, v); }
  static void storeu(float* p, Vec v) { vst1q_f32(p, v); }
  static Vec add(Vec a, Vec b) { return vaddq_f32(a, b); }
  static Vec sub(Vec a, Vec b) { return vsubq_f32(a, b); }
  static Vec mul(Vec a, Vec b) { return vmulq_f32(a, b); }
  static Vec max(Vec a, Vec b) { return vmaxq_f32(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return vfmaq_f32(c, a, b); }
  static float max_lanes(Vec v) { return vmaxvq_f32(v); }

  static void transpose(const Vec* r, Vec* out) {
    const float32x4x2_t a = vtrnq_f32(r[0], r[1]), b = vtrnq_f32(r[2], r[3]);
    out[0] = vcombine_f32(vget_low_f32(a.val[0]), vget_low_f32(b.val[0]));
    out[1] = vcombine_f32(vget_low_f32(a.val[1]), vget_low_f32(b.val[1]));
    out[2] = vcombine_f32(vget_high_f32(a.val[0]), vget_high_f32(b.val[0]));
    out[3] = vcombine_f32(vget_high_f32(a.val[1]), vget_high_f32(b.val[1]));
  }

  // exp_def, 4 at a time (multiply, round to nearest even, two fma reductions, the Horner fmas,
  // times 2^n; 0 below -80). Where it is called x <= 0 (a score minus a max at least as large),
  // so for x >= -80: n in [-116, 0] and p in [0.7, 1.5], p * 2^n is a normal float and adding n
  // to p's exponent field is ldexp's exact result.
  static Vec exp(Vec x) {
    const uint32x4_t ok = vcgeq_f32(x, vdupq_n_f32(-80.f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-0.693359375f));
    r = vfmaq_f32(r, n, vdupq_n_f32(2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
    const int32x4_t scaled = vaddq_s32(vreinterpretq_s32_f32(p), vshlq_n_s32(vcvtq_s32_f32(n), 23));
    return vreinterpretq_f32_u32(vandq_u32(ok, vreinterpretq_u32_s32(scaled)));
  }

  static Vec head(const float* s, int64_t n) {
    const int32x4_t iota = {0, 1, 2, 3};
    const uint32x4_t in = vcltq_s32(iota, vdupq_n_s32(static_cast<int32_t>(n)));
    return vbslq_f32(in, vld1q_f32(s), vdupq_n_f32(-std::numeric_limits<float>::infinity()));
  }

  // 16 lanes (v[i]: lanes 4i .. 4i + 3) summed in tree16's order: l + 8, + 4, + 2, + 1.
  static float sum16(const Vec* v) {
    const float32x4_t y0 = vaddq_f32(v[0], v[2]), y1 = vaddq_f32(v[1], v[3]);  // y[l], y[l + 4]
    const float32x4_t z = vaddq_f32(y0, y1);
    const float32x2_t w = vadd_f32(vget_low_f32(z), vget_high_f32(z));
    return vget_lane_f32(w, 0) + vget_lane_f32(w, 1);
  }
};

}  // namespace

void attend_neon(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1) {
  attend_chunks<Qreg>(c, lane, g, e0, e1);
}

}  // namespace specrt
