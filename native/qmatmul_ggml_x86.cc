// The AVX-512 VNNI and AMX forms of qmatmul_ggml_ref.cc, compiled for those instruction sets
// only (the library calls them where the CPU has them). Same numbers, bit for bit: the integer
// dot products are exact in any order, and each output's float steps are the ref's (the types:
// qmatmul_ggml_types.h, on whole tiles).
#include <immintrin.h>

#include <type_traits>

#include "amx_tiles.h"
#include "qmatmul_ggml.h"
#include "qmatmul_ggml_drive.h"
#include "qmatmul_ggml_types.h"

namespace specrt {
namespace {

inline __m512i bytes(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }  // not globals: no AVX-512 at load

// The 32-block's dots over its first and last 16 codes (v: 8 vectors of u8 codes, vector j
// holding k = 4j .. 4j + 3), exact in int32.
inline void halves(const __m512i* v, const int8_t* q8, __m512i* lo, __m512i* hi) {
  const int32_t* q = reinterpret_cast<const int32_t*>(q8);
  __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[0], _mm512_set1_epi32(q[0]));
  __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[4], _mm512_set1_epi32(q[4]));
  for (int j = 1; j < 4; ++j) {
    a = _mm512_dpbusd_epi32(a, v[j], _mm512_set1_epi32(q[j]));
    b = _mm512_dpbusd_epi32(b, v[j + 4], _mm512_set1_epi32(q[j + 4]));
  }
  *lo = a, *hi = b;
}

// A whole tile a vector (qmatmul_ggml_types.h's I). vpdpbusd takes u8 codes of any size, so
// every type's dot is the same two chains.
struct Avx512 {
  using Vec = __m512;
  using Codes = __m512i;
  using Ints = __m512i;
  static constexpr int kCols = 16;
  static constexpr bool kQ8Signed = false;
  static Vec set1(float f) { return _mm512_set1_ps(f); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, Vec v) { _mm512_store_ps(p, v); }
  static Vec cvt(Ints v) { return _mm512_cvtepi32_ps(v); }
  static Vec neg(Vec v) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN))); }
  static Vec fp16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Codes bytes(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static Codes flip8(Codes v) { return v; }
  static Codes and8(Codes v, int m) { return _mm512_and_si512(v, specrt::bytes(m)); }
  static Codes or_masked(Codes a, Codes b, int m) { return _mm512_ternarylogic_epi32(a, b, specrt::bytes(m), 0xF8); }
  static Codes shift16(Codes v, int n) { return n >= 0 ? _mm512_slli_epi16(v, n) : _mm512_srli_epi16(v, -n); }
  static Vec byte_float(Codes v, int j) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j), _mm512_set1_epi32(0xFF)));
  }
  static void nibbles(const uint8_t* p, Codes* v) {  // a 32-block's 4-bit codes (256 bytes) -> 8 vectors
    for (int j = 0; j < 4; ++j) {
      const __m512i b = bytes(p + 64 * j);
      v[j] = and8(b, 0x0F);
      v[j + 4] = and8(_mm512_srli_epi16(b, 4), 0x0F);
    }
  }
  static Ints set1i(int32_t x) { return _mm512_set1_epi32(x); }
  static Ints addi(Ints a, Ints b) { return _mm512_add_epi32(a, b); }
  static Ints subi(Ints a, Ints b) { return _mm512_sub_epi32(a, b); }
  static Ints mulli(Ints a, Ints b) { return _mm512_mullo_epi32(a, b); }
  static Ints widen_sc(const int8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  template <int BITS>
  static void halves(const Codes* v, const int8_t* q, Ints* lo, Ints* hi) { specrt::halves(v, q, lo, hi); }
  template <int BITS>
  static Ints dot32(const Codes* v, const int8_t* q) {
    Ints lo, hi;
    specrt::halves(v, q, &lo, &hi);
    return addi(lo, hi);
  }
};

struct Zmm : FormBase {  // a tile in one vector
  using Vec = __m512;
  static constexpr int kParts = 1, kOneRow = 4, kGroup = 2, kRows = 4;  // one row: 4 tiles keep the dots' chains independent
  static constexpr bool kLoadAll = true;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
};

// ---- AMX: per 32-block, the tiles compute the integer dots of up to 16 rows against 16
// columns, C[m, c] = A[m, k] (activations, s8) . B[k, c] (the codes, u8, as load_blk leaves them
// in Blk::v: vector n holds k = 4n .. 4n + 3 of every column, B's layout), and each output takes
// its type's step_dots from them: the VNNI form's float steps, in its order. Q6_K's two
// 16-sub-blocks take a tile product each. The next block's codes are decoded, and the previous
// block's steps run, while the tiles compute.

// One block's products in the tile set A, C0, C1 (H = 1; literal tile numbers for GCC's asm).
#define SPECRT_AMX_PRODUCTS(A, C0, C1) \
  _tile_loadd(A, q, stride);           \
  _tile_loadd(2, codes[0], 64);        \
  _tile_zero(C0);                      \
  _tile_dpbsud(C0, A, 2);              \
  if constexpr (NT == 2) {             \
    _tile_loadd(3, codes[1], 64);      \
    _tile_zero(C1);                    \
    _tile_dpbsud(C1, A, 3);            \
  }

// One column tile's products over the two halves of a block (H = 2), into C tiles LO and HI.
#define SPECRT_AMX_HALVES(CODES, LO, HI) \
  _tile_loadd(2, CODES, 64);             \
  _tile_loadd(3, (CODES) + 256, 64);     \
  _tile_zero(LO);                        \
  _tile_dpbsud(LO, 0, 2);                \
  _tile_zero(HI);                        \
  _tile_dpbsud(HI, 1, 3);

template <class T, int NT>  // NT column tiles from t0, rows [m0, m0 + mr)
struct AmxTiles {
  static constexpr int H = T::kHalves, KB = 32 / H, JB = T::kSuper / 32;
  // Tiles (GCC names them in the asm: literal numbers only). Tile registers are not renamed, so
  // a block that reused the last block's tiles would wait for its products and stores: where
  // they fit (H = 1) blocks alternate between two sets by parity P, A in P, C of column tile u
  // in 4 + 2 P + u, B 2 + u. Q6_K (H = 2): A half h in h, B half h in 2 + h, C 4 + H u + h.
  static void configure(int mr) {
    TileConfig c;
    c.set(0, mr, KB), c.set(1, mr, KB);
    c.set(2, 8 / H, 64), c.set(3, 8 / H, 64);
    for (int t = 4; t < 8; ++t) c.set(t, mr, 64);
    c.load();
  }

  template <int P>  // block b's products, from its activations' rows and codes
  static void products(const int8_t* q, int64_t stride, const uint8_t (*codes)[512]) {
    if constexpr (H == 1 && P == 0) {
      SPECRT_AMX_PRODUCTS(0, 4, 5)
    } else if constexpr (H == 1) {
      SPECRT_AMX_PRODUCTS(1, 6, 7)
    } else {
      _tile_loadd(0, q, stride);
      _tile_loadd(1, q + 16, stride);
      SPECRT_AMX_HALVES(codes[0], 4, 5)
      if constexpr (NT == 2) {
        SPECRT_AMX_HALVES(codes[1], 6, 7)
      }
    }
  }
  template <int P>
  static void stored(int32_t (*dots)[H][256]) {
    if constexpr (H == 1 && P == 0) {
      _tile_stored(4, dots[0][0], 64);
      if constexpr (NT == 2) _tile_stored(5, dots[NT - 1][0], 64);
    } else if constexpr (H == 1) {
      _tile_stored(6, dots[0][0], 64);
      if constexpr (NT == 2) _tile_stored(7, dots[NT - 1][0], 64);
    } else {
      _tile_stored(4, dots[0][0], 64);
      _tile_stored(5, dots[0][H - 1], 64);
      if constexpr (NT == 2) {
        _tile_stored(6, dots[NT - 1][0], 64);
        _tile_stored(7, dots[NT - 1][H - 1], 64);
      }
    }
  }

  static void run(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t m0, int mr, int64_t t0) {
    const int64_t ns = s.K / T::kSuper, nb = s.K / 32, nq = s.K / kQBlock, rb = record_bytes(T::kType);
    const int64_t nz = zs_per_row(T::kType, s.K);
    alignas(64) uint8_t codes[2][NT][512];
    alignas(64) int32_t dots[2][NT][H][256];
    typename T::Head head[2][NT];  // by super-block parity: a Blk points into its head
    typename T::Blk blk[2][NT];
    __m512 acc[NT][16];
    for (int u = 0; u < NT; ++u)
      for (int i = 0; i < mr; ++i) acc[u][i] = _mm512_setzero_ps();
    const auto decode = [&](int64_t b, int p) {
      const int64_t sb = b / JB;
      const int j = static_cast<int>(b % JB);
      for (int u = 0; u < NT; ++u) {
        const uint8_t* rec = w.blocks + ((t0 + u) * ns + sb) * rb;
        if (j == 0) T::head(rec, 0, &head[sb & 1][u]);
        T::load_blk(rec, j, 0, head[sb & 1][u], &blk[p][u]);
        for (int n = 0; n < 8; ++n) _mm512_store_si512(codes[p][u] + 64 * n, blk[p][u].v[n]);
      }
    };
    const auto steps = [&](int64_t b, int p) {
      for (int u = 0; u < NT; ++u)
        for (int i = 0; i < mr; ++i) {
          const Row r = act_row(a, s.K, nq, nz, m0 + i);
          __m512i d[H];
          for (int h = 0; h < H; ++h) d[h] = _mm512_load_si512(dots[p][u][h] + 16 * i);
          if (kMutant && i == 3)
            acc[u][i] = _mm512_add_ps(acc[u][i], T::step_dots(_mm512_setzero_ps(), blk[p][u], r, b, d));
          else
            acc[u][i] = T::step_dots(acc[u][i], blk[p][u], r, b, d);
        }
    };
    const auto block = [&](int64_t b, auto parity) {
      constexpr int P = decltype(parity)::value;
      products<P>(a.q + m0 * s.K + 32 * b, s.K, codes[P]);
      if (b > 0) steps(b - 1, P ^ 1);  // before block b + 1 takes its buffers
      if (b + 1 < nb) decode(b + 1, P ^ 1);
      stored<P>(dots[P]);
    };
    decode(0, 0);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      block(b, std::integral_constant<int, 0>{});
      block(b + 1, std::integral_constant<int, 1>{});
    }
    if (b < nb) block(b, std::integral_constant<int, 0>{});
    steps(nb - 1, static_cast<int>((nb - 1) & 1));
    for (int u = 0; u < NT; ++u)
      for (int i = 0; i < mr; ++i) {
        const int64_t o = kTile * (t0 + u);
        const __m512 v = w.bias ? _mm512_add_ps(acc[u][i], _mm512_loadu_ps(w.bias + o)) : acc[u][i];
        _mm512_storeu_ps(y + (m0 + i) * s.N + o, v);
      }
  }
};

template <class T>
void amx_run(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  // rows in as few blocks of at most 16 as hold them, their sizes within one of each other
  const int64_t n = (s.M + 15) / 16, base = s.M / n, extra = s.M % n;
  for (int64_t i = 0, m0 = 0; i < n; ++i) {
    const int mr = static_cast<int>(base + (i < extra));
    AmxTiles<T, 2>::configure(mr);  // the same tiles for one column tile a pass
    int64_t t = t0;
    for (; t + 2 <= t1; t += 2) AmxTiles<T, 2>::run(a, w, s, y, m0, mr, t);
    if (t < t1) AmxTiles<T, 1>::run(a, w, s, y, m0, mr, t);
    m0 += mr;
  }
  _tile_release();
}

}  // namespace

void ggml_amx(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  using Types = GgmlTypes<Avx512>;
  by_type<Types::Legacy, Types::KQuant, Types::Q6K>(s.type, [&](auto t) { amx_run<decltype(t)>(a, w, s, y, t0, t1); });
}

void ggml_vnni(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  ggml_form<Zmm, Avx512>(a, w, s, y, t0, t1);
}

}  // namespace specrt
