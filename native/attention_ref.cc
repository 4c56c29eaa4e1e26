// The definition of PackedAttention's numbers (attention.h) in portable C++: what the AVX-512
// form is tested against bit for bit. Rotation and the K/V writes are elementwise, so both
// forms share them.
#include <cmath>
#include <limits>
#include <vector>

#include "attention.h"

namespace specrt {

namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;  // ln 2 = hi - lo, hi exact in few bits
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                              4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// Lanes l + 8, + 4, + 2, + 1: the one order a 16-lane sum is taken in.
float tree16(const float* a) {
  float y[8], z[4], w[2];
  for (int l = 0; l < 8; ++l) y[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) z[l] = y[l] + y[l + 4];
  for (int l = 0; l < 2; ++l) w[l] = z[l] + z[l + 2];
  return w[0] + w[1];
}

float dot_def(const float* q, const float* k, int64_t D) {
  float a = 0.f;
  for (int64_t d = 0; d < D; ++d) a = std::fma(q[d], k[d], a);
  return a;
}

}  // namespace

float exp_def(float x) {
  if (!(x >= -80.f)) return 0.f;  // e^-80 of the chunk's largest term: nothing in float sums
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpPoly[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kExpPoly[i]);
  p = std::fma(p, r, 1.f);
  p = std::fma(p, r, 1.f);
  return std::ldexp(p, static_cast<int>(n));
}

void rotate(const float* x, const float* cos, const float* sin, int64_t half, float* y) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    y[i] = x1 * cos[i] - x2 * sin[i];
    y[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

void write_kv(const AttnCall& c, int64_t lane) {
  const int64_t D = c.head_dim, H = c.heads, G = c.kv_heads, stride = (H + 2 * G) * D, rows = c.rows[lane];
  for (int64_t e = 0; e < c.width[lane]; ++e) {
    const float* t = c.qkv + c.token[c.offset[lane] + e] * stride;
    const int64_t p = c.first[lane] + e;
    for (int64_t g = 0; g < G; ++g) {
      rotate(t + (H + g) * D, c.cos + p * c.half, c.sin + p * c.half, c.half, c.k[lane] + (g * rows + p) * D);
      const float* v = t + (H + G + g) * D;
      float* dst = c.v[lane] + (g * rows + p) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = v[d];
    }
  }
}

void attend_ref(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1) {
  const int64_t D = c.head_dim, H = c.heads, G = c.kv_heads, stride = (H + 2 * G) * D, rows = c.rows[lane];
  const float* K = c.k[lane] + g * rows * D;
  const float* V = c.v[lane] + g * rows * D;
  std::vector<float> q(D), acc(D);
  float s[kChunk], e[kChunk];
  for (int64_t en = e0; en < e1; ++en) {
    const int64_t out = c.target[c.offset[lane] + en];
    if (out < 0) continue;
    const float* t = c.qkv + c.token[c.offset[lane] + en] * stride;
    const int64_t p = c.first[lane] + en;
    for (int64_t h = g * (H / G); h < (g + 1) * (H / G); ++h) {
      rotate(t + h * D, c.cos + p * c.half, c.sin + p * c.half, c.half, q.data());
      float m = -std::numeric_limits<float>::infinity(), l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t c0 = 0; c0 <= p; c0 += kChunk) {
        const int64_t n = std::min<int64_t>(kChunk, p + 1 - c0);
        float cm = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          s[j] = dot_def(q.data(), K + (c0 + j) * D, D) * c.scale;
          cm = std::fmax(cm, s[j]);
        }
        const float mn = std::fmax(m, cm), alpha = exp_def(m - mn);
        for (int64_t j = 0; j < kChunk; ++j) e[j] = j < n ? exp_def(s[j] - mn) : 0.f;
        float a[16] = {};
        for (int64_t j = 0; j < kChunk; ++j) a[j % 16] = a[j % 16] + e[j];
        l = l * alpha;
        l = l + tree16(a);
        for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * alpha;
        for (int64_t j = 0; j < n; ++j)
          for (int64_t d = 0; d < D; ++d) acc[d] = std::fma(e[j], V[(c0 + j) * D + d], acc[d]);
        m = mn;
      }
      float* o = c.out + out * H * D + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] = acc[d] / l;
    }
  }
}

}  // namespace specrt
