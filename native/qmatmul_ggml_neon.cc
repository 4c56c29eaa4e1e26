// The ARM64 forms of qmatmul_ggml_ref.cc: NEON (ggml_neon) and NEON with the dot-product
// extension (ggml_dotprod), one source built twice (native/arm_dot.h). Same numbers, bit for
// bit: the integer dot products are exact, and each output's float steps are the ref's.
//
// The VNNI form's structure (qmatmul_ggml_x86.cc: Head per ggml block, Blk per 32-block, step per
// row) on quarter tiles: 4 of a record's 16 columns, so a 64-byte chunk's quarter (16 bytes: 4
// columns x 4 codes) is one register. Codes are taken as int8 (4-6 bit codes are < 64; Q8_0's
// stored code ^ 0x80 is its int8 weight).
#include "arm_dot.h"
#include "qmatmul_ggml.h"
#include "qmatmul_ggml_drive.h"

namespace specrt {
namespace {

using arm::dot4;

inline uint8x16_t load(const uint8_t* p) { return vld1q_u8(p); }
inline float32x4_t fp16x4(const uint8_t* p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }
inline uint8x16_t or_masked(uint8x16_t a, uint8x16_t b, uint8_t mask) { return vorrq_u8(a, vandq_u8(b, vdupq_n_u8(mask))); }
inline uint8x16_t shift16(uint8x16_t b, int n) {  // per 16-bit lane: left by n (right where n < 0)
  return vreinterpretq_u8_u16(vshlq_u16(vreinterpretq_u16_u8(b), vdupq_n_s16(static_cast<int16_t>(n))));
}
inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

// A quarter's 4-bit codes of a 32-block (p: its first chunk's quarter) -> 8 vectors, vector j
// holding k = 4j .. 4j + 3.
inline void nibbles(const uint8_t* p, uint8x16_t* v) {
  for (int j = 0; j < 4; ++j) {
    const uint8x16_t b = load(p + 64 * j);
    v[j] = vandq_u8(b, vdupq_n_u8(0x0F));
    v[j + 4] = vshrq_n_u8(b, 4);
  }
}

// The 32-block's dots over its first and last 16 codes.
inline void halves(const uint8x16_t* v, const int8_t* q8, int32x4_t* lo, int32x4_t* hi) {
  const int32_t* q = reinterpret_cast<const int32_t*>(q8);
  int32x4_t a = vdupq_n_s32(0), b = vdupq_n_s32(0);
  for (int j = 0; j < 4; ++j) {
    a = dot4(a, s8(v[j]), q[j]);
    b = dot4(b, s8(v[j + 4]), q[j + 4]);
  }
  *lo = a, *hi = b;
}

// Each type: Head (per quarter tile and ggml block), Blk (per quarter and 32-block), head(),
// load_blk() and step(), as in qmatmul_ggml_x86.cc. qt: the quarter (0..3).
template <int TYPE>  // Q8_0 (codes stored + 128) and Q4_0 (zero point 8, in zs)
struct Legacy {
  static constexpr int kType = TYPE, kSuper = 32;
  struct Head {
    float32x4_t d;
  };
  struct Blk {
    uint8x16_t v[8];
    float32x4_t d;
  };
  static void head(const uint8_t* rec, int qt, Head* hd) { hd->d = fp16x4(rec + 8 * qt); }
  static void load_blk(const uint8_t* rec, int, int qt, const Head& hd, Blk* k) {
    if constexpr (TYPE == kQ8_0) {  // code ^ 0x80: the int8 weight
      for (int j = 0; j < 8; ++j) k->v[j] = veorq_u8(load(rec + 32 + 64 * j + 16 * qt), vdupq_n_u8(0x80));
    } else {
      nibbles(rec + 32 + 16 * qt, k->v);
    }
    k->d = hd.d;
  }
  static float32x4_t step(float32x4_t acc, const Blk& k, const Row& r, int64_t b) {
    int32x4_t lo, hi;
    halves(k.v, r.q + 32 * b, &lo, &hi);
    int32x4_t dot = vaddq_s32(lo, hi);
    if constexpr (TYPE == kQ4_0) dot = vsubq_s32(dot, vdupq_n_s32(r.zs[b]));
    return vfmaq_f32(acc, vcvtq_f32_s32(dot), vmulq_n_f32(k.d, r.sa[b]));
  }
};

template <bool FIFTH>  // Q4_K, Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins
struct KQuant {
  static constexpr int kType = FIFTH ? kQ5_K : kQ4_K, kSuper = 256;
  struct Head {
    float scale[8][4];  // d * sc
    float min[8][4];    // -(dmin * m)
  };
  struct Blk {
    uint8x16_t v[8];
    const float *scale, *min;
  };
  static void store4(uint32x4_t six, float32x4_t f, float (*out)[4]) {  // 4 bytes a column -> 4 vectors
    for (int j = 0; j < 4; ++j) {
      const uint32x4_t v = vandq_u32(vshlq_u32(six, vdupq_n_s32(-8 * j)), vdupq_n_u32(0xFF));
      vst1q_f32(out[j], vmulq_f32(vcvtq_f32_u32(v), f));
    }
  }
  static void head(const uint8_t* rec, int qt, Head* hd) {
    const float32x4_t d = fp16x4(rec + 8 * qt), neg_dmin = vnegq_f32(fp16x4(rec + 32 + 8 * qt));
    const uint32x4_t g0 = vld1q_u32(reinterpret_cast<const uint32_t*>(rec + 64 + 16 * qt));
    const uint32x4_t g1 = vld1q_u32(reinterpret_cast<const uint32_t*>(rec + 128 + 16 * qt));
    const uint32x4_t g2 = vld1q_u32(reinterpret_cast<const uint32_t*>(rec + 192 + 16 * qt));
    const uint32x4_t m0f = vdupq_n_u32(0x0F0F0F0F), m30 = vdupq_n_u32(0x30303030), m3f = vdupq_n_u32(0x3F3F3F3F);
    const uint32x4_t sc_hi = vorrq_u32(vandq_u32(g2, m0f), vandq_u32(vshrq_n_u32(g0, 2), m30));
    const uint32x4_t m_hi = vorrq_u32(vandq_u32(vshrq_n_u32(g2, 4), m0f), vandq_u32(vshrq_n_u32(g1, 2), m30));
    store4(vandq_u32(g0, m3f), d, hd->scale);
    store4(sc_hi, d, hd->scale + 4);
    store4(vandq_u32(g1, m3f), neg_dmin, hd->min);
    store4(m_hi, neg_dmin, hd->min + 4);
  }
  static void load_blk(const uint8_t* rec, int j, int qt, const Head& hd, Blk* k) {
    const uint8_t* p = rec + 256 + j * (FIFTH ? 320 : 256);
    nibbles(p + 16 * qt, k->v);
    if constexpr (FIFTH) {
      const uint8x16_t fifth = load(p + 256 + 16 * qt);  // bit u of a byte: vector u's fifth bit
      for (int u = 0; u < 8; ++u) k->v[u] = or_masked(k->v[u], shift16(fifth, 4 - u), 0x10);
    }
    k->scale = hd.scale[j];
    k->min = hd.min[j];
  }
  static float32x4_t step(float32x4_t acc, const Blk& k, const Row& r, int64_t b) {
    int32x4_t lo, hi;
    halves(k.v, r.q + 32 * b, &lo, &hi);
    const float32x4_t scale = vmulq_n_f32(vld1q_f32(k.scale), r.sa[b]);
    acc = vfmaq_f32(acc, vcvtq_f32_s32(vaddq_s32(lo, hi)), scale);
    return vfmaq_f32(acc, vld1q_f32(k.min), vdupq_n_f32(r.qsa[b]));
  }
};

struct Q6K {  // 16 sub-blocks of 16 with int8 scales, codes 0..63 with zero point 32 (in zs)
  static constexpr int kType = kQ6_K, kSuper = 256;
  struct Head {
    float32x4_t d;
    const int8_t* sc;  // the quarter's first column's scale of sub-block 0
  };
  struct Blk {
    uint8x16_t v[8];
    int32x4_t sc_lo, sc_hi;
    float32x4_t d;
  };
  static void head(const uint8_t* rec, int qt, Head* hd) {
    hd->d = fp16x4(rec + 8 * qt), hd->sc = reinterpret_cast<const int8_t*>(rec + 32 + 4 * qt);
  }
  static int32x4_t sc4(const int8_t* p) {
    int32_t four;
    __builtin_memcpy(&four, p, 4);
    return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)))));
  }
  static void load_blk(const uint8_t* rec, int j, int qt, const Head& hd, Blk* k) {
    const uint8_t* p = rec + 288 + 384 * j;
    nibbles(p + 16 * qt, k->v);
    for (int half = 0; half < 2; ++half) {
      const uint8x16_t hb = load(p + 256 + 64 * half + 16 * qt);  // bits 2u, 2u + 1: vector 4 half + u's bits 4, 5
      for (int u = 0; u < 4; ++u) k->v[4 * half + u] = or_masked(k->v[4 * half + u], shift16(hb, 4 - 2 * u), 0x30);
    }
    k->sc_lo = sc4(hd.sc + 16 * (2 * j));
    k->sc_hi = sc4(hd.sc + 16 * (2 * j + 1));
    k->d = hd.d;
  }
  static float32x4_t step(float32x4_t acc, const Blk& k, const Row& r, int64_t b) {
    int32x4_t lo, hi;
    halves(k.v, r.q + 32 * b, &lo, &hi);
    lo = vmulq_s32(vsubq_s32(lo, vdupq_n_s32(r.zs[2 * b])), k.sc_lo);
    hi = vmulq_s32(vsubq_s32(hi, vdupq_n_s32(r.zs[2 * b + 1])), k.sc_hi);
    return vfmaq_f32(acc, vcvtq_f32_s32(vaddq_s32(lo, hi)), vmulq_n_f32(k.d, r.sa[b]));
  }
};

struct Q4 {  // quarter tiles (4 columns, one q register)
  using Vec = float32x4_t;
  static constexpr int kParts = 4, kOneRow = 1, kGroup = 1;
  static constexpr bool kLoadAll = false;
  static Vec zero() { return vdupq_n_f32(0.f); }
  static Vec add(Vec a, Vec b) { return vaddq_f32(a, b); }
  static Vec load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, Vec v) { vst1q_f32(p, v); }
};

}  // namespace

void SPECRT_ARM_FORM(ggml)(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  ggml_drive<Q4, Legacy, KQuant, Q6K>(a, w, s, y, t0, t1);
}

}  // namespace specrt
