// AVX-512 VNNI and AMX forms of qmatmul_ref.cc, compiled for those instruction sets only (the
// library's dispatch calls them where the CPU has them). Same numbers, bit for bit.
#include <immintrin.h>

#include "amx_tiles.h"
#include "qmatmul.h"

namespace specrt {
namespace {

inline __m512i low_nibbles() { return _mm512_set1_epi8(0x0F); }  // not a global: no AVX-512 at load

// acc += dot * (scale * sa) [+ min * qsa]: the one float step per block, as in matmul_ref.
inline __m512 step(__m512 acc, __m512i dot, __m512 scale, __m512 min, bool has_min, float sa, float qsa) {
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(sa)), acc);
  return has_min ? _mm512_fmadd_ps(min, _mm512_set1_ps(qsa), acc) : acc;
}

inline void store(float* y, __m512 acc, const float* bias) {
  _mm512_storeu_ps(y, bias ? _mm512_add_ps(acc, _mm512_loadu_ps(bias)) : acc);
}

// A block's codes of one tile as BLK/4 vectors of u8, vector j for k = 4j .. 4j + 3.
template <int BITS, int BLK>
inline void load_codes(const uint8_t* p, __m512i* v) {
  if constexpr (BITS == 8) {
    for (int j = 0; j < BLK / 4; ++j) v[j] = _mm512_loadu_si512(p + 64 * j);
  } else {
    for (int j = 0; j < 4; ++j) {
      const __m512i b = _mm512_loadu_si512(p + 64 * j);
      v[j] = _mm512_and_si512(b, low_nibbles());
      v[j + 4] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low_nibbles());
    }
  }
}

template <int BITS, int BLK>
constexpr int64_t kBytes = int64_t{kTile} * BLK * BITS / 8;

// ---- VNNI: MR rows x NT tiles in registers, over all of K.
template <int BITS, int BLK, int MR, int NT>
void vnni_block(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t m0, int64_t t0) {
  const int64_t nb = s.K / BLK, nq = s.K / kQBlock;
  __m512 acc[MR][NT];
  for (int i = 0; i < MR; ++i)
    for (int u = 0; u < NT; ++u) acc[i][u] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i wv[NT][BLK / 4];
    for (int u = 0; u < NT; ++u) load_codes<BITS, BLK>(w.codes + ((t0 + u) * nb + b) * kBytes<BITS, BLK>, wv[u]);
    for (int i = 0; i < MR; ++i) {
      const int32_t* q = reinterpret_cast<const int32_t*>(a.q + (m0 + i) * s.K + b * BLK);
      const float sa = a.sa[(m0 + i) * nq + b * BLK / kQBlock], qsa = a.qsa[(m0 + i) * nb + b];
      for (int u = 0; u < NT; ++u) {
        __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
        for (int j = 0; j < BLK / 4; j += 2) {
          d0 = _mm512_dpbusd_epi32(d0, wv[u][j], _mm512_set1_epi32(q[j]));
          d1 = _mm512_dpbusd_epi32(d1, wv[u][j + 1], _mm512_set1_epi32(q[j + 1]));
        }
        const int64_t o = ((t0 + u) * nb + b) * kTile;
        const __m512 mn = w.min ? _mm512_loadu_ps(w.min + o) : _mm512_setzero_ps();
        acc[i][u] = step(acc[i][u], _mm512_add_epi32(d0, d1), _mm512_loadu_ps(w.scale + o), mn, w.min, sa, qsa);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int u = 0; u < NT; ++u)
      store(y + (m0 + i) * s.N + (t0 + u) * kTile, acc[i][u], w.bias ? w.bias + (t0 + u) * kTile : nullptr);
}

template <int BITS, int BLK>
void vnni(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  int64_t t = t0;
  if (s.M < 4) {  // few rows: several tiles at once keep the dot products' chains independent
    for (; t + 4 <= t1; t += 4)
      for (int64_t m = 0; m < s.M; ++m) vnni_block<BITS, BLK, 1, 4>(a, w, s, y, m, t);
  } else {
    for (; t + 2 <= t1; t += 2) {
      int64_t m = 0;
      for (; m + 4 <= s.M; m += 4) vnni_block<BITS, BLK, 4, 2>(a, w, s, y, m, t);
      for (; m < s.M; ++m) vnni_block<BITS, BLK, 1, 2>(a, w, s, y, m, t);
    }
  }
  for (; t < t1; ++t)
    for (int64_t m = 0; m < s.M; ++m) vnni_block<BITS, BLK, 1, 1>(a, w, s, y, m, t);
}

// ---- AMX: per block, C[m, c] = A[m, k] (activations, s8) . B[k, c] (codes, u8), the block's
// integer dot products, then the same float step. The next block's codes are unpacked (4 bits)
// and the previous block's steps run while the tiles compute.
void configure(int mr, int blk) {
  TileConfig c;
  c.set(0, mr, blk);      // A: activations
  c.set(1, blk / 4, 64);  // B: codes of tile 0
  c.set(2, blk / 4, 64);  // B: codes of tile 1
  c.set(3, mr, 64);       // C: tile 0
  c.set(4, mr, 64);       // C: tile 1
  c.load();
}

template <int BITS, int BLK>
inline const uint8_t* b_operand(const uint8_t* p, uint8_t* scratch) {  // -> B [BLK/4][64] u8
  if constexpr (BITS == 8) {
    return p;  // already in the tile's layout
  } else {
    __m512i v[8];
    load_codes<4, 32>(p, v);
    for (int j = 0; j < 8; ++j) _mm512_store_si512(scratch + 64 * j, v[j]);
    return scratch;
  }
}

template <int BITS, int BLK, int NT>
void amx_steps(const Activations& a, const Weights& w, const Shape& s, int64_t m0, int mr, int64_t t0, int64_t b,
               const int32_t (*dots)[256], __m512 (*acc)[16]) {
  const int64_t nb = s.K / BLK, nq = s.K / kQBlock;
  for (int u = 0; u < NT; ++u) {
    const int64_t o = ((t0 + u) * nb + b) * kTile;
    const __m512 sc = _mm512_loadu_ps(w.scale + o);
    const __m512 mn = w.min ? _mm512_loadu_ps(w.min + o) : _mm512_setzero_ps();
    for (int i = 0; i < mr; ++i)
      acc[u][i] = step(acc[u][i], _mm512_load_si512(dots[u] + 16 * i), sc, mn, w.min,
                       a.sa[(m0 + i) * nq + b * BLK / kQBlock], a.qsa[(m0 + i) * nb + b]);
  }
}

template <int BITS, int BLK, int NT>
void amx_block(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t m0, int mr, int64_t t0) {
  const int64_t nb = s.K / BLK;
  alignas(64) uint8_t scratch[2][2][512];
  alignas(64) int32_t dots[2][2][256];
  const uint8_t* codes[2][2];
  __m512 acc[2][16];
  for (int u = 0; u < NT; ++u)
    for (int i = 0; i < mr; ++i) acc[u][i] = _mm512_setzero_ps();
  for (int u = 0; u < NT; ++u)
    codes[0][u] = b_operand<BITS, BLK>(w.codes + (t0 + u) * nb * kBytes<BITS, BLK>, scratch[0][u]);
  for (int64_t b = 0; b < nb; ++b) {
    const int p = b & 1;
    _tile_loadd(0, a.q + m0 * s.K + b * BLK, s.K);
    _tile_loadd(1, codes[p][0], 64);
    _tile_zero(3);
    _tile_dpbsud(3, 0, 1);
    if (NT == 2) {
      _tile_loadd(2, codes[p][1], 64);
      _tile_zero(4);
      _tile_dpbsud(4, 0, 2);
    }
    if (b + 1 < nb)
      for (int u = 0; u < NT; ++u)
        codes[p ^ 1][u] = b_operand<BITS, BLK>(w.codes + ((t0 + u) * nb + b + 1) * kBytes<BITS, BLK>, scratch[p ^ 1][u]);
    if (b > 0) amx_steps<BITS, BLK, NT>(a, w, s, m0, mr, t0, b - 1, dots[p ^ 1], acc);
    _tile_stored(3, dots[p][0], 64);
    if (NT == 2) _tile_stored(4, dots[p][1], 64);
  }
  amx_steps<BITS, BLK, NT>(a, w, s, m0, mr, t0, nb - 1, dots[(nb - 1) & 1], acc);
  for (int u = 0; u < NT; ++u)
    for (int i = 0; i < mr; ++i)
      store(y + (m0 + i) * s.N + (t0 + u) * kTile, acc[u][i], w.bias ? w.bias + (t0 + u) * kTile : nullptr);
}

template <int BITS, int BLK>
void amx(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  for (int64_t m0 = 0; m0 < s.M; m0 += 16) {
    const int mr = static_cast<int>(s.M - m0 < 16 ? s.M - m0 : 16);
    configure(mr, BLK);
    int64_t t = t0;
    for (; t + 2 <= t1; t += 2) amx_block<BITS, BLK, 2>(a, w, s, y, m0, mr, t);
    for (; t < t1; ++t) amx_block<BITS, BLK, 1>(a, w, s, y, m0, mr, t);
  }
  _tile_release();
}

}  // namespace

void quantize_avx512(const float* x, int64_t M, int64_t K, int8_t* q, float* sa) {
  const int64_t nb = K / kQBlock;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kQBlock;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const __m512 id = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
      int8_t* qb = q + m * K + b * kQBlock;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtsepi32_epi8(i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtsepi32_epi8(i1));
      sa[m * nb + b] = amax / 127.f;
    }
}

#define SPECRT_DISPATCH(fn)                                                \
  void matmul_##fn(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) { \
    if (s.bits == 4) return fn<4, 32>(a, w, s, y, t0, t1);                 \
    if (s.block == 16) return fn<8, 16>(a, w, s, y, t0, t1);               \
    return fn<8, 32>(a, w, s, y, t0, t1);                                  \
  }
SPECRT_DISPATCH(vnni)
SPECRT_DISPATCH(amx)

}  // namespace specrt
