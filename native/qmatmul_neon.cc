// The ARM64 forms of qmatmul_ref.cc's matmul_ref: NEON (matmul_neon) and NEON with the
// dot-product extension (matmul_dotprod), one source built twice (native/arm_dot.h). Same
// numbers, bit for bit: a block's integer dot is exact and each output takes matmul_ref's float
// steps in its order. Quarter tiles (4 of a tile's 16 columns: 16 bytes of a 64-byte chunk);
// 8-bit codes are taken as code - 128 (int8) and 128 * sum(q) added back.
#include <vector>

#include "arm_dot.h"
#include "qmatmul.h"

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

template <int BITS, int BLK, int MR>
void rows_quarter(const Activations& a, const Weights& w, const Shape& s, const int32_t* zs, float* y, int64_t m0,
                  int64_t qf) {
  constexpr int64_t bytes = int64_t{kTile} * BLK * BITS / 8;
  const int64_t nb = s.K / BLK, nq = s.K / kQBlock, t = qf / 4, qt = qf % 4;
  float32x4_t acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < nb; ++b) {
    int8x16_t v[BLK / 4];
    load_codes<BITS, BLK>(w.codes + (t * nb + b) * bytes + 16 * qt, v);
    const int64_t o = (t * nb + b) * kTile + 4 * qt;
    const float32x4_t scale = vld1q_f32(w.scale + o);
    for (int i = 0; i < MR; ++i) {
      const int64_t m = m0 + i;
      const int32_t* q = reinterpret_cast<const int32_t*>(a.q + m * s.K + b * BLK);
      int32x4_t d0 = vdupq_n_s32(0), d1 = vdupq_n_s32(0);
      for (int j = 0; j < BLK / 4; j += 2) {
        d0 = dot4(d0, v[j], q[j]);
        d1 = dot4(d1, v[j + 1], q[j + 1]);
      }
      int32x4_t dot = vaddq_s32(d0, d1);
      if constexpr (BITS == 8) dot = vaddq_s32(dot, vdupq_n_s32(zs[m * nb + b]));
      acc[i] = vfmaq_f32(acc[i], vcvtq_f32_s32(dot), vmulq_n_f32(scale, a.sa[m * nq + b * BLK / kQBlock]));
      if (w.min) acc[i] = vfmaq_f32(acc[i], vld1q_f32(w.min + o), vdupq_n_f32(a.qsa[m * nb + b]));
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* out = y + (m0 + i) * s.N + 4 * qf;
    vst1q_f32(out, w.bias ? vaddq_f32(acc[i], vld1q_f32(w.bias + 4 * qf)) : acc[i]);
  }
}

template <int BITS, int BLK>
void run(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  const int64_t nb = s.K / BLK;
  std::vector<int32_t> zs;  // 8 bits: 128 * sum of q per row and block
  if constexpr (BITS == 8) {
    zs.resize(static_cast<size_t>(s.M * nb));
    for (int64_t i = 0; i < s.M * nb; ++i) {
      int sum = 0;
      for (int k = 0; k < BLK; ++k) sum += a.q[i * BLK + k];
      zs[i] = 128 * sum;
    }
  }
  for (int64_t qf = 4 * t0; qf < 4 * t1; ++qf) {
    int64_t m = 0;
    for (; m + 4 <= s.M; m += 4) rows_quarter<BITS, BLK, 4>(a, w, s, zs.data(), y, m, qf);
    switch (s.M - m) {
      case 3: rows_quarter<BITS, BLK, 3>(a, w, s, zs.data(), y, m, qf); break;
      case 2: rows_quarter<BITS, BLK, 2>(a, w, s, zs.data(), y, m, qf); break;
      case 1: rows_quarter<BITS, BLK, 1>(a, w, s, zs.data(), y, m, qf); break;
      default: break;
    }
  }
}

}  // namespace

void SPECRT_ARM_FORM(matmul)(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  if (s.bits == 4) return run<4, 32>(a, w, s, y, t0, t1);
  if (s.block == 16) return run<8, 16>(a, w, s, y, t0, t1);
  return run<8, 32>(a, w, s, y, t0, t1);
}

}  // namespace specrt
