// The definition of QMatMulGGML's numbers (qmatmul_ggml.h) in portable C++: the fallback on CPUs
// without AVX-512 VNNI, and what the SIMD form is tested against bit for bit.
#include <cmath>
#include <cstring>

#include "qmatmul_ggml.h"

namespace specrt {
namespace {

float fp16(const uint8_t* p) {  // IEEE half -> float, exact (subnormals, inf, nan kept)
  const uint32_t h = p[0] | uint32_t{p[1]} << 8;
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1F, f = h & 0x3FF;
  float v;
  if (e == 0) {
    v = std::ldexp(static_cast<float>(f), -24);  // 0 and subnormals: f * 2^-24, exact
  } else {
    const uint32_t bits = e == 31 ? 0x7F800000u | f << 13 : (e + 112) << 23 | f << 13;
    std::memcpy(&v, &bits, 4);
  }
  uint32_t out;
  std::memcpy(&out, &v, 4);
  out |= sign;
  std::memcpy(&v, &out, 4);
  return v;
}

// Code k (0..31) of column c in a 32-block's codes (qmatmul_ggml.h's chunk order).
int nibble(const uint8_t* p, int c, int k) {
  const uint8_t byte = p[64 * ((k / 4) % 4) + 4 * c + k % 4];
  return k < 16 ? byte & 15 : byte >> 4;
}
int byte8(const uint8_t* p, int c, int k) { return p[64 * (k / 4) + 4 * c + k % 4]; }

// Q4_K / Q5_K: sub-block j's 6-bit scale and min of column c from the 3 groups of scale bytes.
void scale_min(const uint8_t* g, int c, int j, int* sc, int* m) {
  auto byte = [&](int grp, int i) { return g[64 * grp + 4 * c + i]; };
  if (j < 4) {
    *sc = byte(0, j) & 63;
    *m = byte(1, j) & 63;
  } else {
    *sc = (byte(2, j - 4) & 15) | (byte(0, j - 4) >> 6) << 4;
    *m = (byte(2, j - 4) >> 4) | (byte(1, j - 4) >> 6) << 4;
  }
}

struct Row {  // one activation row, at one column
  const int8_t* q;
  const float* sa;
  const float* qsa;
  int c;
};

float q8_0(const uint8_t* rec, const Row& r, int64_t b, float acc) {
  int dot = 0;
  for (int k = 0; k < 32; ++k) dot += (byte8(rec + 32, r.c, k) - 128) * r.q[32 * b + k];
  return std::fma(static_cast<float>(dot), fp16(rec + 2 * r.c) * r.sa[b], acc);
}

float q4_0(const uint8_t* rec, const Row& r, int64_t b, float acc) {
  int dot = 0;
  for (int k = 0; k < 32; ++k) dot += (nibble(rec + 32, r.c, k) - 8) * r.q[32 * b + k];
  return std::fma(static_cast<float>(dot), fp16(rec + 2 * r.c) * r.sa[b], acc);
}

template <bool FIFTH>  // Q5_K: each 32-block's codes carry 64 bytes of fifth bits
float q45_k(const uint8_t* rec, const Row& r, int64_t sb, float acc) {
  const float d = fp16(rec + 2 * r.c), dmin = fp16(rec + 32 + 2 * r.c);
  for (int j = 0; j < 8; ++j) {
    const uint8_t* codes = rec + 256 + j * (FIFTH ? 320 : 256);
    const int64_t b = 8 * sb + j;
    int sc, m, dot = 0;
    scale_min(rec + 64, r.c, j, &sc, &m);
    for (int k = 0; k < 32; ++k) {
      const int hi = FIFTH ? (codes[256 + 4 * r.c + k % 4] >> (k / 4) & 1) << 4 : 0;
      dot += (nibble(codes, r.c, k) | hi) * r.q[32 * b + k];
    }
    acc = std::fma(static_cast<float>(dot), d * static_cast<float>(sc) * r.sa[b], acc);
    acc = std::fma(-(dmin * static_cast<float>(m)), r.qsa[b], acc);
  }
  return acc;
}

float q6_k(const uint8_t* rec, const Row& r, int64_t sb, float acc) {
  const float d = fp16(rec + 2 * r.c);
  const int8_t* sc = reinterpret_cast<const int8_t*>(rec + 32);
  for (int j = 0; j < 8; ++j) {
    const uint8_t* codes = rec + 288 + j * 384;
    const int64_t b = 8 * sb + j;
    int sum = 0;
    for (int h = 0; h < 2; ++h) {
      int dot = 0;
      for (int k = 16 * h; k < 16 * h + 16; ++k) {
        const int hi = codes[256 + 64 * (k / 16) + 4 * r.c + k % 4] >> (2 * ((k / 4) % 4)) & 3;
        dot += ((nibble(codes, r.c, k) | hi << 4) - 32) * r.q[32 * b + k];
      }
      sum += sc[16 * (2 * j + h) + r.c] * dot;
    }
    acc = std::fma(static_cast<float>(sum), d * r.sa[b], acc);
  }
  return acc;
}

using Step = float (*)(const uint8_t*, const Row&, int64_t, float);
constexpr Step kSteps[kGgmlTypes] = {q4_0, q8_0, q45_k<false>, q45_k<true>, q6_k};

}  // namespace

int64_t zero_sums_count(int64_t M, int64_t K, int type) {
  return type == kQ6_K ? M * K / 16 : type == kQ8_0 || type == kQ4_0 ? M * K / 32 : 0;
}

void zero_sums(const int8_t* q, int64_t M, int64_t K, int type, int32_t* zs) {
  const int sub = type == kQ6_K ? 16 : 32, zp = type == kQ6_K ? 32 : type == kQ8_0 ? 128 : 8;
  if (!zero_sums_count(M, K, type)) return;
  for (int64_t i = 0; i < M * K / sub; ++i) {
    int sum = 0;
    for (int k = 0; k < sub; ++k) sum += q[i * sub + k];
    zs[i] = zp * sum;
  }
}

void ggml_ref(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  const int64_t ns = s.K / kGgml[s.type].super, nq = s.K / kQBlock;
  const Step step = kSteps[s.type];
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t n = t0 * kTile; n < t1 * kTile; ++n) {
      const int64_t t = n / kTile;
      const Row r{a.q + m * s.K, a.sa + m * nq, a.qsa ? a.qsa + m * nq : nullptr, static_cast<int>(n % kTile)};
      float acc = 0.f;
      for (int64_t sb = 0; sb < ns; ++sb) acc = step(w.blocks + (t * ns + sb) * record_bytes(s.type), r, sb, acc);
      if (w.bias) acc += w.bias[n];
      y[m * s.N + n] = acc;
    }
}

}  // namespace specrt
