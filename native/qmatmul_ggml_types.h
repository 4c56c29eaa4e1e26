// The GGUF block types of the fast forms of ggml_ref (qmatmul_ggml_{x86,avx2,neon}.cc), written
// once over the form's integer and float vectors I: for each type, Head (per tile part and ggml
// block: its fp16 fields, decoded scales), Blk (per tile part and 32-block: codes and what its
// step needs), head(), load_blk() and step() (one 32-block of one row), as qmatmul_ggml_drive.h
// calls them. Every float step is qmatmul_ggml.h's, in its order; the integer dots (I::dot32,
// I::halves) are exact in any order, and are what truly differs per instruction set (vpdpbusd,
// vpmaddubsw pairs that must not saturate, sdot or widening multiplies). step() is the dots, then
// step_dots(acc, Blk, Row, b, dots) with them: kHalves dots a column (1: the 32-block's; 2, Q6_K:
// its two 16-sub-blocks'), of the codes as load_blk leaves them in Blk::v (the AMX form computes
// them in tiles and takes the same step_dots).
//
// I: the form's vectors for one tile part of kCols columns (16, 8 or 4):
//   Vec (float), Codes (a part's 4 codes a column, as bytes), Ints (int32, one a column)
//   float: set1, mul, fma(a, b, c) = a * b + c, load / store (aligned), cvt(Ints), neg, fp16(p)
//   int: bytes(p) (load), nibbles(p, v[8]), and8(v, m), or_masked(a, b, m) = a | (b & m) (m: a
//     byte), shift16(v, n) (per 16-bit lane, left by n, right where n < 0), byte_float(v, j) (each
//     column's byte j as float), set1i, addi, subi, mulli, widen_sc(p) (kCols int8 -> Ints)
//   kQ8Signed: Q8_0's codes taken as code - 128 (flip8 on load, no zero point) for a signed dot;
//     false: the stored unsigned codes, the zero point (zs) taken out after
//   dot32<BITS>(v, q): the 32-block's dot, codes < 2^BITS (8: Q8_0 as loaded)
//   halves<BITS>(v, q, lo, hi): its dots over the first and last 16 codes
//
// Included only by the forms' objects, with internal linkage (qmatmul_ggml_drive.h).
#pragma once
#include <cstdint>

#include "qmatmul_ggml.h"
#include "qmatmul_ggml_drive.h"

namespace specrt {
namespace {

template <class I>
struct GgmlTypes {
  using Vec = typename I::Vec;
  using Codes = typename I::Codes;
  using Ints = typename I::Ints;
  static constexpr int C = I::kCols;  // a part's offsets in a record: 2 C bytes of fp16, 4 C of codes

  template <int TYPE>  // Q8_0 (codes stored + 128) and Q4_0: one fp16 d a 32-block, its zero point in zs
  struct Legacy {
    static constexpr int kType = TYPE, kSuper = 32, kHalves = 1;
    struct Head {
      Vec d;
    };
    struct Blk {
      Codes v[8];
      Vec d;
    };
    SPECRT_STEP static void head(const uint8_t* rec, int part, Head* h) { h->d = I::fp16(rec + 2 * C * part); }
    SPECRT_STEP static void load_blk(const uint8_t* rec, int, int part, const Head& h, Blk* k) {
      if constexpr (TYPE == kQ8_0) {
        for (int j = 0; j < 8; ++j) {
          k->v[j] = I::bytes(rec + 32 + 64 * j + 4 * C * part);
          if constexpr (I::kQ8Signed) k->v[j] = I::flip8(k->v[j]);
        }
      } else {
        I::nibbles(rec + 32 + 4 * C * part, k->v);
      }
      k->d = h.d;
    }
    SPECRT_STEP static Vec step(Vec acc, const Blk& k, const Row& r, int64_t b) {
      const Ints dot = I::template dot32<TYPE == kQ8_0 ? 8 : 4>(k.v, r.q + 32 * b);
      return step_dots(acc, k, r, b, &dot);
    }
    SPECRT_STEP static Vec step_dots(Vec acc, const Blk& k, const Row& r, int64_t b, const Ints* dots) {
      Ints dot = dots[0];
      if constexpr (TYPE == kQ4_0 || !I::kQ8Signed) dot = I::subi(dot, I::set1i(r.zs[b]));
      return I::fma(I::cvt(dot), I::mul(k.d, I::set1(r.sa[b])), acc);
    }
  };

  template <bool FIFTH>  // Q4_K, Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins
  struct KQuant {
    static constexpr int kType = FIFTH ? kQ5_K : kQ4_K, kSuper = 256, kHalves = 1;
    struct Head {
      alignas(sizeof(Vec)) float scale[8][C];  // d * sc
      alignas(sizeof(Vec)) float min[8][C];    // -(dmin * m)
    };
    struct Blk {
      Codes v[8];
      const float *scale, *min;  // into the head: read where the step uses them (fewer live registers)
    };
    SPECRT_STEP static void store4(Codes six, Vec f, float (*out)[C]) {  // 4 bytes a column -> 4 vectors
      for (int j = 0; j < 4; ++j) I::store(out[j], I::mul(I::byte_float(six, j), f));
    }
    SPECRT_STEP static void head(const uint8_t* rec, int part, Head* h) {
      const Vec d = I::fp16(rec + 2 * C * part), neg_dmin = I::neg(I::fp16(rec + 32 + 2 * C * part));
      const Codes g0 = I::bytes(rec + 64 + 4 * C * part), g1 = I::bytes(rec + 128 + 4 * C * part);
      const Codes g2 = I::bytes(rec + 192 + 4 * C * part);
      const Codes sc_hi = I::or_masked(I::and8(g2, 0x0F), I::shift16(g0, -2), 0x30);
      const Codes m_hi = I::or_masked(I::and8(I::shift16(g2, -4), 0x0F), I::shift16(g1, -2), 0x30);
      store4(I::and8(g0, 0x3F), d, h->scale);
      store4(sc_hi, d, h->scale + 4);
      store4(I::and8(g1, 0x3F), neg_dmin, h->min);
      store4(m_hi, neg_dmin, h->min + 4);
    }
    SPECRT_STEP static void load_blk(const uint8_t* rec, int j, int part, const Head& h, Blk* k) {
      const uint8_t* p = rec + 256 + j * (FIFTH ? 320 : 256);
      I::nibbles(p + 4 * C * part, k->v);
      if constexpr (FIFTH) {
        const Codes fifth = I::bytes(p + 256 + 4 * C * part);  // bit u of a byte: vector u's fifth bit
        for (int u = 0; u < 8; ++u) k->v[u] = I::or_masked(k->v[u], I::shift16(fifth, 4 - u), 0x10);
      }
      k->scale = h.scale[j];
      k->min = h.min[j];
    }
    SPECRT_STEP static Vec step(Vec acc, const Blk& k, const Row& r, int64_t b) {
      const Ints dot = I::template dot32<FIFTH ? 5 : 4>(k.v, r.q + 32 * b);
      return step_dots(acc, k, r, b, &dot);
    }
    SPECRT_STEP static Vec step_dots(Vec acc, const Blk& k, const Row& r, int64_t b, const Ints* dots) {
      acc = I::fma(I::cvt(dots[0]), I::mul(I::load(k.scale), I::set1(r.sa[b])), acc);
      return I::fma(I::load(k.min), I::set1(r.qsa[b]), acc);
    }
  };

  struct Q6K {  // 16 sub-blocks of 16 with int8 scales, codes 0..63 with zero point 32 (in zs)
    static constexpr int kType = kQ6_K, kSuper = 256, kHalves = 2;
    struct Head {
      Vec d;
      const int8_t* sc;  // the part's first column's scale of sub-block 0
    };
    struct Blk {
      Codes v[8];
      Ints sc_lo, sc_hi;
      Vec d;
    };
    SPECRT_STEP static void head(const uint8_t* rec, int part, Head* h) {
      h->d = I::fp16(rec + 2 * C * part), h->sc = reinterpret_cast<const int8_t*>(rec + 32 + C * part);
    }
    SPECRT_STEP static void load_blk(const uint8_t* rec, int j, int part, const Head& h, Blk* k) {
      const uint8_t* p = rec + 288 + 384 * j;
      I::nibbles(p + 4 * C * part, k->v);
      for (int half = 0; half < 2; ++half) {
        const Codes hb = I::bytes(p + 256 + 64 * half + 4 * C * part);  // bits 2u, 2u + 1: vector 4 half + u's bits 4, 5
        for (int u = 0; u < 4; ++u) k->v[4 * half + u] = I::or_masked(k->v[4 * half + u], I::shift16(hb, 4 - 2 * u), 0x30);
      }
      k->sc_lo = I::widen_sc(h.sc + 16 * (2 * j));
      k->sc_hi = I::widen_sc(h.sc + 16 * (2 * j + 1));
      k->d = h.d;
    }
    SPECRT_STEP static Vec step(Vec acc, const Blk& k, const Row& r, int64_t b) {
      Ints dots[2];
      I::template halves<6>(k.v, r.q + 32 * b, &dots[0], &dots[1]);
      return step_dots(acc, k, r, b, dots);
    }
    SPECRT_STEP static Vec step_dots(Vec acc, const Blk& k, const Row& r, int64_t b, const Ints* dots) {
      const Ints lo = I::mulli(I::subi(dots[0], I::set1i(r.zs[2 * b])), k.sc_lo);
      const Ints hi = I::mulli(I::subi(dots[1], I::set1i(r.zs[2 * b + 1])), k.sc_hi);
      return I::fma(I::cvt(I::addi(lo, hi)), I::mul(k.d, I::set1(r.sa[b])), acc);
    }
  };
};

// ggml_ref's contract for the form F (qmatmul_ggml_drive.h) with I's types.
template <class F, class I>
void ggml_form(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  using T = GgmlTypes<I>;
  ggml_drive<F, T::template Legacy, T::template KQuant, typename T::Q6K>(a, w, s, y, t0, t1);
}

}  // namespace
}  // namespace specrt
