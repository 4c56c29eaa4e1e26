// The AVX2 (+FMA, F16C) form of qmatmul_ggml_ref.cc, for x86-64 CPUs without AVX-512, compiled
// for that instruction set only. Same numbers, bit for bit: the integer dot products are exact
// (below: no sum ever saturates), and each output's float steps are the ref's, in its order.
//
// The types are qmatmul_ggml_types.h's, on half tiles (Avx2 below); Q4_K and Q6_K at several rows
// have loops of their own (Q4KTile, Q6KTile: docs/design.md "Forms for AVX2 hosts and ARM64").
// Without vpdpbusd a chunk's dot is vpmaddubsw (u8 x s8 pairs -> s16, saturating) then vpmaddwd
// by ones (-> s32), or by Q6_K's sub-block scales. Built with SPECRT_AVXVNNI (avx2_dot.h) the same
// source is the AVX-VNNI form: every chunk's dot one vpdpbusd into int32 (no grouping), Q8_0's
// codes as stored with the zero point (as on AVX-512), Q6_K's sub-block dots scaled by vpmulld.
#include <immintrin.h>

#include <type_traits>

#include "avx2_dot.h"
#include "avx2_tile.h"
#include "qmatmul_ggml.h"
#include "qmatmul_ggml_drive.h"
#include "qmatmul_ggml_types.h"

namespace specrt {
namespace {

inline __m256i bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// A half's 4-bit codes of a 32-block (p: its first chunk's half) -> 8 vectors of u8, vector j
// holding k = 4j .. 4j + 3.
inline void nibbles(const uint8_t* p, __m256i* v) {
  for (int j = 0; j < 4; ++j) {
    const __m256i b = load(p + 64 * j);
    v[j] = _mm256_and_si256(b, bytes(0x0F));
    v[j + 4] = _mm256_and_si256(_mm256_srli_epi16(b, 4), bytes(0x0F));
  }
}

// Sum of code * q over code vectors v[0..3] (16 codes a column), exact in int32. vpmaddubsw adds
// two u8 x s8 products in int16 and saturates: codes <= 63 keep a pair within 2 * 63 * 127 =
// 16002. GROUP chunks' pairs are summed in int16 before widening, as far as that cannot overflow
// (GROUP * 2 * max code * 127 <= 32767: 4 for codes <= 31, 2 for <= 63). SIGNED: the codes are
// int8 (Q8_0's weights, -128 .. 127), taken as |code| against q with the code's sign (|q| <= 127:
// a pair <= 2 * 128 * 127 = 32512).
template <int GROUP, bool SIGNED>
inline __m256i dot16(const __m256i* v, const int32_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256(), s = acc;
  if constexpr (kDpbusd) return dpbusd_dot(v, q, 4);  // codes u8 (kQ8Signed false)
  for (int j = 0; j < 4; ++j) {
    const __m256i qb = _mm256_set1_epi32(q[j]);
    const __m256i p = SIGNED ? _mm256_maddubs_epi16(_mm256_sign_epi8(v[j], v[j]), _mm256_sign_epi8(qb, v[j]))
                             : _mm256_maddubs_epi16(v[j], qb);
    s = j % GROUP ? _mm256_add_epi16(s, p) : p;
    if ((j + 1) % GROUP == 0) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s, ones));
  }
  return acc;
}

// The 32-block's dot over all 32 codes of 4 bits (<= 15: the 8 chunks' pairs stay within int16,
// 8 * 2 * 15 * 127 = 30480), one widening.
inline __m256i dot32_nibbles(const __m256i* v, const int8_t* q8) {
  const int32_t* q = reinterpret_cast<const int32_t*>(q8);
  __m256i s = _mm256_maddubs_epi16(v[0], _mm256_set1_epi32(q[0]));
  for (int j = 1; j < 8; ++j) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(v[j], _mm256_set1_epi32(q[j])));
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

// The 32-block's dots over its first and last 16 codes.
template <int GROUP, bool SIGNED = false>
inline void halves(const __m256i* v, const int8_t* q8, __m256i* lo, __m256i* hi) {
  const int32_t* q = reinterpret_cast<const int32_t*>(q8);
  *lo = dot16<GROUP, SIGNED>(v, q);
  *hi = dot16<GROUP, SIGNED>(v + 4, q + 4);
}

// Half tiles (qmatmul_ggml_types.h's I): 8 of a record's 16 columns, so a 64-byte chunk's half
// (32 bytes: 8 columns x 4 codes) is one register.
struct Avx2 {
  using Vec = __m256;
  using Codes = __m256i;
  using Ints = __m256i;
  static constexpr int kCols = 8;
  static constexpr bool kQ8Signed = !kDpbusd;  // 8-bit codes would saturate vpmaddubsw pairs: code - 128
  static Vec set1(float f) { return _mm256_set1_ps(f); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec load(const float* p) { return _mm256_load_ps(p); }
  static void store(float* p, Vec v) { _mm256_store_ps(p, v); }
  static Vec cvt(Ints v) { return _mm256_cvtepi32_ps(v); }
  static Vec neg(Vec v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.f)); }
  static Vec fp16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static Codes bytes(const uint8_t* p) { return specrt::load(p); }
  static Codes flip8(Codes v) { return _mm256_xor_si256(v, specrt::bytes(0x80)); }
  static Codes and8(Codes v, int m) { return _mm256_and_si256(v, specrt::bytes(m)); }
  static Codes or_masked(Codes a, Codes b, int m) { return _mm256_or_si256(a, _mm256_and_si256(b, specrt::bytes(m))); }
  static Codes shift16(Codes v, int n) { return n >= 0 ? _mm256_slli_epi16(v, n) : _mm256_srli_epi16(v, -n); }
  static Vec byte_float(Codes v, int j) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8 * j), _mm256_set1_epi32(0xFF)));
  }
  static void nibbles(const uint8_t* p, Codes* v) { specrt::nibbles(p, v); }
  static Ints set1i(int32_t x) { return _mm256_set1_epi32(x); }
  static Ints addi(Ints a, Ints b) { return _mm256_add_epi32(a, b); }
  static Ints subi(Ints a, Ints b) { return _mm256_sub_epi32(a, b); }
  static Ints mulli(Ints a, Ints b) { return _mm256_mullo_epi32(a, b); }
  static Ints widen_sc(const int8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  // chunks summed in int16 before widening: as many as cannot saturate (dot16's GROUP)
  template <int BITS>
  static void halves(const Codes* v, const int8_t* q, Ints* lo, Ints* hi) {
    specrt::halves<BITS == 8 ? 1 : BITS == 6 ? 2 : 4, BITS == 8>(v, q, lo, hi);
  }
  template <int BITS>
  static Ints dot32(const Codes* v, const int8_t* q) {
    if constexpr (BITS == 4 || kDpbusd) {
      return kDpbusd ? dpbusd_dot(v, reinterpret_cast<const int32_t*>(q), 8) : dot32_nibbles(v, q);
    } else {
      Ints lo, hi;
      halves<BITS>(v, q, &lo, &hi);
      return addi(lo, hi);
    }
  }
};

// Several rows over a whole tile (both halves) at once, for Q4_K and Q6_K: each group of up to 4
// rows takes a 32-block chunk by chunk, one broadcast of a row's 4 activations serving both halves
// (Q4_K: avx2_tile.h's NibbleTile, the chunk's nibbles split as they load; Q6_K: the block's codes
// decoded once into L1, 16 vectors, too many to keep in registers beside the rows). Each output's float steps are the type's step (qmatmul_ggml_types.h), in its order;
// the integer dots are exact (bounds below). MUTANT: SPECRT_MUTANT's reordering (the block's terms
// added to acc last).
using Q4K = GgmlTypes<Avx2>::KQuant<false>;
using Q6 = GgmlTypes<Avx2>::Q6K;

SPECRT_STEP const int32_t* quads(const Row& r, int64_t b) { return reinterpret_cast<const int32_t*>(r.q + 32 * b); }

struct Q4KTile : NibbleTile {  // NibbleTile (avx2_tile.h) over a record's 32-block j
  using T = Q4K;
  SPECRT_STEP static void load(const uint8_t* rec, int j, const T::Head* head, Blk* k) {
    at(rec + 256 + 256 * j, k);
    for (int u = 0; u < 2; ++u) k->scale[u] = head[u].scale[j], k->min[u] = head[u].min[j];
  }
  template <int G>
  SPECRT_STEP static void group(const Row* r, __m256* acc, const Blk& k, int64_t b, bool mutant) {
    NibbleTile::group<G, true>(r, acc, k, b, mutant);
  }
};

// Q6_K: I = sc_lo * (dot_lo - zs_lo) + sc_hi * (dot_hi - zs_hi) as sum over chunk pairs of
// vpmaddwd(pair's int16 sums, the sub-block's scale in both int16 lanes of a column) less
// vpmaddwd((32 sc_lo, 32 sc_hi), (sum q_lo, sum q_hi)) (zs = 32 sum q): the same integer. Bounds:
// a chunk pair's int16 sum <= 2 * 2 * 63 * 127 = 32004; |sc| <= 128, so each vpmaddwd <= 8.2e6 and
// I within int32; 32 |sc| <= 4096 and |sum q| <= 16 * 127 fit int16. With vpdpbusd each sub-block's
// dot is one int32 (<= 16 * 63 * 127 = 128016), times its scale by vpmulld (<= 1.7e7): the same I.
struct Q6KTile {
  using T = Q6;
  static constexpr int kGroupRows = 4;
  struct Blk {
    __m256i codes[8][2];  // [chunk][half], codes 0..63
    __m256i sc[2][2];     // [sub-block][half]: each column's scale in both int16 lanes of its int32 (vpdpbusd: the int32)
    __m256i zsc[2];       // [half]: (32 sc_lo, 32 sc_hi) a column
    __m256 d[2];
  };
  SPECRT_STEP static void load(const uint8_t* rec, int j, const T::Head* head, Blk* k) {
    const uint8_t* p = rec + 288 + 384 * j;
    for (int u = 0; u < 2; ++u) {
      __m256i* v = &k->codes[0][u];  // stride 2
      for (int c = 0; c < 4; ++c) {
        const __m256i b = specrt::load(p + 64 * c + 32 * u);
        v[2 * c] = _mm256_and_si256(b, bytes(0x0F));
        v[2 * (c + 4)] = _mm256_and_si256(_mm256_srli_epi16(b, 4), bytes(0x0F));
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i hb = specrt::load(p + 256 + 64 * h + 32 * u);
        for (int c = 0; c < 4; ++c) {
          const int n = 4 - 2 * c;
          const __m256i t = n >= 0 ? _mm256_slli_epi16(hb, n) : _mm256_srli_epi16(hb, -n);
          v[2 * (4 * h + c)] = _mm256_or_si256(v[2 * (4 * h + c)], _mm256_and_si256(t, bytes(0x30)));
        }
      }
      const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(head[u].sc + 16 * (2 * j)));
      const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(head[u].sc + 16 * (2 * j + 1)));
      k->sc[0][u] = kDpbusd ? _mm256_cvtepi8_epi32(lo) : _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(lo, lo));
      k->sc[1][u] = kDpbusd ? _mm256_cvtepi8_epi32(hi) : _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(hi, hi));
      k->zsc[u] = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(lo, hi)), 5);
      k->d[u] = head[u].d;
    }
  }
  // vpdpbusd: G rows' dots over sub-block h (chunks 4h .. 4h + 3), each times its scale, into t
  template <int G>
  SPECRT_STEP static void scaled_dots(const Row* r, const Blk& k, int64_t b, int h, __m256i (*t)[2]) {
    __m256i d[G][2];
    for (auto& di : d) di[0] = di[1] = _mm256_setzero_si256();
    for (int c = 4 * h; c < 4 * h + 4; ++c)
      for (int i = 0; i < G; ++i) {
        const __m256i q = _mm256_set1_epi32(quads(r[i], b)[c]);
        for (int u = 0; u < 2; ++u) d[i][u] = dpbusd(d[i][u], k.codes[c][u], q);
      }
    for (int i = 0; i < G; ++i)
      for (int u = 0; u < 2; ++u) t[i][u] = _mm256_mullo_epi32(d[i][u], k.sc[h][u]);
  }
  template <int G>
  SPECRT_STEP static void group(const Row* r, __m256* acc, const Blk& k, int64_t b, bool mutant) {
    __m256i I[G][2];
    if constexpr (kDpbusd) {
      __m256i hi[G][2];
      scaled_dots<G>(r, k, b, 0, I);
      scaled_dots<G>(r, k, b, 1, hi);
      for (int i = 0; i < G; ++i)
        for (int u = 0; u < 2; ++u) I[i][u] = _mm256_add_epi32(I[i][u], hi[i][u]);
    }
    for (int c = 0; c < 8 && !kDpbusd; c += 2) {
      const __m256i sc0 = k.sc[c / 4][0], sc1 = k.sc[c / 4][1];
      for (int i = 0; i < G; ++i) {
        const __m256i qa = _mm256_set1_epi32(quads(r[i], b)[c]), qb = _mm256_set1_epi32(quads(r[i], b)[c + 1]);
        const __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(k.codes[c][0], qa), _mm256_maddubs_epi16(k.codes[c + 1][0], qb));
        const __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(k.codes[c][1], qa), _mm256_maddubs_epi16(k.codes[c + 1][1], qb));
        const __m256i t0 = _mm256_madd_epi16(s0, sc0), t1 = _mm256_madd_epi16(s1, sc1);
        I[i][0] = c ? _mm256_add_epi32(I[i][0], t0) : t0;
        I[i][1] = c ? _mm256_add_epi32(I[i][1], t1) : t1;
      }
    }
    for (int i = 0; i < G; ++i) {
      const int32_t* zs = r[i].zs + 2 * b;  // 32 * sum q of each 16-sub-block: exact / 32
      const __m256i sums = _mm256_set1_epi32(static_cast<int32_t>((static_cast<uint32_t>(zs[0] >> 5) & 0xFFFF) |
                                                                  (static_cast<uint32_t>(zs[1] >> 5) << 16)));
      const __m256 sa = _mm256_set1_ps(r[i].sa[b]);
      for (int u = 0; u < 2; ++u) {
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_sub_epi32(I[i][u], _mm256_madd_epi16(k.zsc[u], sums)));
        __m256& a = acc[2 * i + u];
        const __m256 t = _mm256_fmadd_ps(dot, _mm256_mul_ps(k.d[u], sa), mutant ? _mm256_setzero_ps() : a);
        a = mutant ? _mm256_add_ps(a, t) : t;
      }
    }
  }
};

// Tile<T>: the type's tile kernel, where it has one.
template <class T>
struct Tile {
  static constexpr bool kHas = false;
};
template <>
struct Tile<Q4K> : Q4KTile {
  static constexpr bool kHas = true;
};
template <>
struct Tile<Q6> : Q6KTile {
  static constexpr bool kHas = true;
};

// Half tiles (8 columns, one ymm). One row takes both halves of a tile (two independent
// accumulator chains, the codes used as they load). Several rows take whole tiles (kGroup 2) in
// blocks of up to 4: Q4_K and Q6_K by Tile<T> above (own), the other types half by half, a
// half's 8 code vectors in registers for the block's rows.
struct Ymm : FormBase {
  using Vec = __m256;
  static constexpr int kParts = 2, kOneRow = 2, kGroup = 2, kRows = 4;
  static constexpr bool kLoadAll = false;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }

  template <class T, int MR, int NP>
  static constexpr bool kOwn = NP == 2 && MR >= 2;
  template <class T, int MR, int NP, class Call>
  static void own(const Call& c, int64_t m0, int64_t p0) {  // p0 even: the tile p0 / 2
    if constexpr (Tile<T>::kHas) {
      tile_rows<T, MR>(c, m0, p0);
    } else {  // the other types half by half, as before the tile loops (measured slower by tiles)
      GgmlDrive<Ymm>::template rows_parts<T, MR, 1>(c, m0, p0);
      GgmlDrive<Ymm>::template rows_parts<T, MR, 1>(c, m0, p0 + 1);
    }
  }
  template <class T, int MR, class Call>
  static void tile_rows(const Call& c, int64_t m0, int64_t p0) {
    using K = Tile<T>;
    Row r[MR];
    for (int i = 0; i < MR; ++i) r[i] = c.row(m0 + i);
    __m256 acc[2 * MR];
    for (auto& a : acc) a = zero();
    typename K::Blk blk;
    for (int64_t sb = 0; sb < c.ns; ++sb) {
      const uint8_t* rec = c.record(p0, sb);
      typename T::Head head[2];
      T::head(rec, 0, &head[0]);
      T::head(rec, 1, &head[1]);
      for (int j = 0; j < 8; ++j) {
        const int64_t b = sb * 8 + j;
        K::load(rec, j, head, &blk);
        constexpr int G = K::kGroupRows;
        int g = 0;
        for (; g + G <= MR; g += G) K::template group<G>(r + g, acc + 2 * g, blk, b, kMutant && MR == 4);
        if constexpr (MR % G != 0) K::template group<MR % G>(r + g, acc + 2 * g, blk, b, kMutant && MR == 4);
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int u = 0; u < 2; ++u) {
        const int64_t o = 8 * (p0 + u);
        store(c.y + (m0 + i) * c.s.N + o, c.w.bias ? add(acc[2 * i + u], load(c.w.bias + o)) : acc[2 * i + u]);
      }
  }
};

}  // namespace

void SPECRT_AVX2_FORM(ggml)(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  ggml_form<Ymm, Avx2>(a, w, s, y, t0, t1);
}

}  // namespace specrt
