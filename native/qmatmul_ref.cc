// The definition of the kernels' numbers in portable C++: the fallback on CPUs without AVX-512
// VNNI, and what the SIMD forms are tested against bit for bit.
#include <cmath>

#include "qmatmul.h"

namespace specrt {

void quantize(const float* x, int64_t M, int64_t K, int8_t* q, float* sa) {
  const int64_t nb = K / kQBlock;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kQBlock;
      float amax = 0.f;
      for (int i = 0; i < kQBlock; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
      const float id = amax > 0.f ? 127.f / amax : 0.f;
      for (int i = 0; i < kQBlock; ++i)  // to nearest even
        q[m * K + b * kQBlock + i] = static_cast<int8_t>(static_cast<int>(std::nearbyint(xb[i] * id)));
      sa[m * nb + b] = amax / 127.f;
    }
}

void block_sums(const int8_t* q, const float* sa, int64_t M, int64_t K, int block, float* qsa) {
  const int64_t nb = K / block;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      int sum = 0;
      for (int i = 0; i < block; ++i) sum += q[m * K + b * block + i];
      qsa[m * nb + b] = static_cast<float>(sum) * sa[m * (K / kQBlock) + b * block / kQBlock];
    }
}

namespace {

int code(const uint8_t* p, int bits, int c, int k) {  // tile-block bytes, column c, k in block
  if (bits == 8) return p[64 * (k / 4) + 4 * c + k % 4];
  const int j = (k / 4) % 4;
  const uint8_t byte = p[64 * j + 4 * c + k % 4];
  return k < 16 ? byte & 15 : byte >> 4;
}

}  // namespace

void matmul_ref(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  const int64_t nb = s.K / s.block, nq = s.K / kQBlock;
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t n = t0 * kTile; n < t1 * kTile; ++n) {
      const int64_t t = n / kTile;
      const int c = static_cast<int>(n % kTile);
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = w.codes + (t * nb + b) * tile_bytes(s);
        const int8_t* q = a.q + m * s.K + b * s.block;
        int dot = 0;
        for (int k = 0; k < s.block; ++k) dot += code(p, s.bits, c, k) * q[k];
        const int64_t o = (t * nb + b) * kTile + c;
        acc = std::fma(static_cast<float>(dot), w.scale[o] * a.sa[m * nq + b * s.block / kQBlock], acc);
        if (w.min) acc = std::fma(w.min[o], a.qsa[m * nb + b], acc);
      }
      if (w.bias) acc += w.bias[n];
      y[m * s.N + n] = acc;
    }
}

}  // namespace specrt
