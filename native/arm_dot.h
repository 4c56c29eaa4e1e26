// ARM64's integer dot of 4 columns x 4 codes against 4 activations, for the NEON forms
// (native/*_neon.cc). One source, two objects: built with -march=armv8.2-a+dotprod and
// SPECRT_DOTPROD it is one sdot; built for plain ARMv8-A it is widening multiplies and pairwise
// adds. Both are exact in int32 (|code| <= 128, |q| <= 127: a pair's sum <= 32512 fits int16).
#pragma once
#include <arm_neon.h>

#include <cstdint>

namespace specrt {
namespace arm {

#ifdef SPECRT_DOTPROD
#define SPECRT_ARM_FORM(name) name##_dotprod
#else
#define SPECRT_ARM_FORM(name) name##_neon
#endif

// acc[c] += sum over i < 4 of v[4c + i] * q4[i] (q4: 4 int8 activations, as one int32).
inline int32x4_t dot4(int32x4_t acc, int8x16_t v, int32_t q4) {
  const int8x16_t q = vreinterpretq_s8_s32(vdupq_n_s32(q4));
#ifdef SPECRT_DOTPROD
  return vdotq_s32(acc, v, q);
#else
  const int16x8_t lo = vmull_s8(vget_low_s8(v), vget_low_s8(q)), hi = vmull_high_s8(v, q);
  return vpadalq_s16(acc, vpaddq_s16(lo, hi));
#endif
}

}  // namespace arm
}  // namespace specrt
