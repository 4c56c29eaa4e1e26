// The row x column driver the fast forms of ggml_ref share (qmatmul_ggml_{x86,avx2,neon}.cc):
// rows in registers over all of K, a type's Head decoded per record and its Blk per 32-block,
// T::step adding one 32-block of one row to an accumulator, bias last. The types (Legacy<Q4_0 / Q8_0>,
// KQuant<Q4_K / Q5_K>, Q6K) come from qmatmul_ggml_types.h over the form's integer vectors, and
// a form supplies its float vector (F below; `ggml_form<F, I>` puts them together); no number is
// computed here, so every form keeps the definition's steps in the definition's order.
//
// F: the form's float vector and how it covers a 16-column tile:
//   Vec, zero(), add(a, b), load(const float*), store(float*, v)
//   kParts    vectors a tile (1: AVX-512, 2: AVX2, 4: NEON); part p is columns
//             [p * 16 / kParts, (p + 1) * 16 / kParts) of y, in record p / kParts
//   kOneRow   parts a lone row takes at once (independent accumulator chains)
//   kGroup    parts several rows take at once (then single parts for the rest)
//   kRows     rows a block takes at most (each row block decodes the weights' blocks once)
//   kLoadAll  decode every part's block before the rows (true) or part by part (false)
//   kOwn<T, MR, NP>, own<T, MR, NP>(call, m0, p0): where kOwn is true, the form's own loop for
//             rows_parts<T, MR, NP> (FormBase below: none); it must take the same steps
// T: kType, kSuper, Head, Blk, head(rec, part in record, Head*), load_blk(rec, j, part, Head,
//   Blk*), step(acc, Blk, Row, 32-block index).
//
// Included only by the forms' objects, with internal linkage: each object compiles its own copy
// for its instruction set.
#pragma once
#include <cstdint>

#include "form_step.h"
#include "qmatmul_ggml.h"

namespace specrt {
namespace {

struct Row {  // one activation row
  const int8_t* q;
  const float* sa;
  const float* qsa;
  const int32_t* zs;
};

inline int64_t zs_per_row(int type, int64_t K) { return type == kQ6_K ? K / 16 : K / kQBlock; }

// Row m of a call's activations (nq: 32-blocks a row; nz: zs_per_row).
SPECRT_STEP Row act_row(const BlockActs& a, int64_t K, int64_t nq, int64_t nz, int64_t m) {
  return {a.q + m * K, a.sa + m * nq, a.qsa ? a.qsa + m * nq : nullptr, a.zs ? a.zs + m * nz : nullptr};
}

// fn(T{}) with the type T that reads blocks of `type` (the forms' loops: GgmlDrive below, AMX's).
template <template <int> class Legacy, template <bool> class KQuant, class Q6K, class Fn>
void by_type(int type, Fn&& fn) {
  switch (type) {
    case kQ4_0: return fn(Legacy<kQ4_0>{});
    case kQ8_0: return fn(Legacy<kQ8_0>{});
    case kQ4_K: return fn(KQuant<false>{});
    case kQ5_K: return fn(KQuant<true>{});
    case kQ6_K: return fn(Q6K{});
    default: return;
  }
}

struct FormBase {  // a form with no loop of its own
  template <class T, int MR, int NP>
  static constexpr bool kOwn = false;
  template <class T, int MR, int NP, class Call>
  static void own(const Call&, int64_t, int64_t) {}
};

template <class F>
struct GgmlDrive {
  using Vec = typename F::Vec;
  static constexpr int kWidth = kTile / F::kParts;  // columns a vector

  struct Call {  // what every loop below reads
    const BlockActs& a;
    const BlockWeights& w;
    const BlockShape& s;
    float* y;
    int64_t ns, nq, nz, rb;  // records a tile, 32-blocks a row, zs a row, bytes a record

    SPECRT_STEP Row row(int64_t m) const { return act_row(a, s.K, nq, nz, m); }
    SPECRT_STEP const uint8_t* record(int64_t p, int64_t i) const { return w.blocks + ((p / F::kParts) * ns + i) * rb; }
  };

  template <class T, int MR>
  SPECRT_STEP static Vec apply(Vec acc, const typename T::Blk& k, const Row& r, int64_t b) {
    if constexpr (kMutant && MR == 4) return F::add(acc, T::step(F::zero(), k, r, b));
    return T::step(acc, k, r, b);
  }

  // MR rows x NP parts from p0 in registers over all of K. Each row block decodes the parts'
  // heads again: decoding them once for all rows into L1 measured slower (docs/design.md, "The
  // GGUF's blocks in the kernel").
  template <class T, int MR, int NP>
  static void rows_parts(const Call& c, int64_t m0, int64_t p0) {
    if constexpr (F::template kOwn<T, MR, NP>) return F::template own<T, MR, NP>(c, m0, p0);
    Vec acc[MR][NP];
    for (int i = 0; i < MR; ++i)
      for (int u = 0; u < NP; ++u) acc[i][u] = F::zero();
    for (int64_t sb = 0; sb < c.ns; ++sb) {
      typename T::Head head[NP];
      for (int u = 0; u < NP; ++u) T::head(c.record(p0 + u, sb), static_cast<int>((p0 + u) % F::kParts), &head[u]);
      for (int j = 0; j < T::kSuper / 32; ++j) {
        const int64_t b = sb * (T::kSuper / 32) + j;
        if constexpr (F::kLoadAll) {
          typename T::Blk blk[NP];
          for (int u = 0; u < NP; ++u)
            T::load_blk(c.record(p0 + u, sb), j, static_cast<int>((p0 + u) % F::kParts), head[u], &blk[u]);
          for (int i = 0; i < MR; ++i) {
            const Row r = c.row(m0 + i);
            for (int u = 0; u < NP; ++u) acc[i][u] = apply<T, MR>(acc[i][u], blk[u], r, b);
          }
        } else {
          for (int u = 0; u < NP; ++u) {
            typename T::Blk blk;
            T::load_blk(c.record(p0 + u, sb), j, static_cast<int>((p0 + u) % F::kParts), head[u], &blk);
            for (int i = 0; i < MR; ++i) acc[i][u] = apply<T, MR>(acc[i][u], blk, c.row(m0 + i), b);
          }
        }
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int u = 0; u < NP; ++u) {
        const int64_t o = kWidth * (p0 + u);
        F::store(c.y + (m0 + i) * c.s.N + o, c.w.bias ? F::add(acc[i][u], F::load(c.w.bias + o)) : acc[i][u]);
      }
  }

  // n rows from m0 over NP parts: rows_parts<T, n, NP> for n in 1 .. R.
  template <class T, int NP, int R = F::kRows>
  static void rows_block(const Call& c, int64_t m0, int64_t n, int64_t p0) {
    if (n == R) return rows_parts<T, R, NP>(c, m0, p0);
    if constexpr (R > 1) return rows_block<T, NP, R - 1>(c, m0, n, p0);
  }

  // Every row over NP parts, in as few blocks of at most kRows rows as can hold them, their
  // sizes within one of each other (17 rows at kRows 4: 4 4 3 3 3, not 4 4 4 4 1): each block
  // decodes the parts' blocks again, so a lone row left over costs nearly a whole block.
  template <class T, int NP>
  static void all_rows(const Call& c, int64_t p0) {
    if (c.s.M < 1) return;
    const int64_t n = (c.s.M + F::kRows - 1) / F::kRows, base = c.s.M / n, extra = c.s.M % n;
    for (int64_t i = 0, m = 0; i < n; ++i) {
      const int64_t rows = base + (i < extra);
      rows_block<T, NP>(c, m, rows, p0);
      m += rows;
    }
  }

  template <class T>
  static void run(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
    const Call c{a, w, s, y, s.K / T::kSuper, s.K / kQBlock, zs_per_row(T::kType, s.K), record_bytes(T::kType)};
    int64_t p = F::kParts * t0;
    const int64_t p1 = F::kParts * t1;
    if (s.M == 1)
      for (; p + F::kOneRow <= p1; p += F::kOneRow) rows_parts<T, 1, F::kOneRow>(c, 0, p);
    for (; p + F::kGroup <= p1; p += F::kGroup) all_rows<T, F::kGroup>(c, p);
    if constexpr (F::kGroup > 1)
      for (; p < p1; ++p) all_rows<T, 1>(c, p);
  }
};

// ggml_ref's contract for the form F with its types.
template <class F, template <int> class Legacy, template <bool> class KQuant, class Q6K>
void ggml_drive(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1) {
  by_type<Legacy, KQuant, Q6K>(s.type, [&](auto t) { GgmlDrive<F>::template run<decltype(t)>(a, w, s, y, t0, t1); });
}

}  // namespace
}  // namespace specrt
