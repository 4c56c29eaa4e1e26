// The definition of the kernel's numbers in portable C++: the fallback on CPUs without
// AVX-512 VNNI, and what the SIMD kernels are tested against bit for bit.
#include <cmath>

#include "qmatmul.h"

namespace specrt {

void quantize(const float* x, int64_t M, int64_t K, int8_t* q, float* sa, float* qsa) {
  const int64_t nb = K / kBlock;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kBlock;
      float amax = 0.f;
      for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
      const float id = amax > 0.f ? 127.f / amax : 0.f;
      int sum = 0;
      for (int i = 0; i < kBlock; ++i) {
        const int v = static_cast<int>(std::nearbyint(xb[i] * id));  // to nearest even
        q[m * K + b * kBlock + i] = static_cast<int8_t>(v);
        sum += v;
      }
      sa[m * nb + b] = amax / 127.f;
      qsa[m * nb + b] = static_cast<float>(sum) * (amax / 127.f);
    }
}

void matmul_ref(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  const int64_t nb = s.K / kBlock;
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t n = t0 * kTile; n < t1 * kTile; ++n) {
      const int64_t t = n / kTile, c = n % kTile;
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = w.codes + (t * nb + b) * kTileBytes;
        const int8_t* q = a.q + m * s.K + b * kBlock;
        int dot = 0;
        for (int j = 0; j < 4; ++j)
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = p[64 * j + 4 * c + i];
            dot += (byte & 15) * q[4 * j + i] + (byte >> 4) * q[4 * (j + 4) + i];
          }
        const int64_t o = (t * nb + b) * kTile + c;
        const int64_t mb = m * nb + b;
        acc = std::fma(static_cast<float>(dot), w.scale[o] * a.sa[mb], acc);
        if (w.min) acc = std::fma(w.min[o], a.qsa[mb], acc);
      }
      if (w.bias) acc += w.bias[n];
      y[m * s.N + n] = acc;
    }
}

}  // namespace specrt
