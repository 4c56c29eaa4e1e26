// The row x column driver the AVX2 and NEON forms of matmul_ref share (qmatmul_avx2.cc,
// qmatmul_neon.cc): MR rows of one tile part in registers over all of K, each block's codes
// loaded once for the rows, bias last; 8-bit codes' zero sums (128 * sum of q per row and block,
// the codes being taken as code - 128). A form supplies its vector and its block step (F below);
// no number is computed here but the int32 zero sums, so each form keeps matmul_ref's float
// steps in their order. (The AVX-512 form, qmatmul_x86.cc, has AMX tiles and its own loops.)
//
// F: Vec, Code (a register of one part's codes), zero(), add(a, b), fma(a, b, c) = a * b + c,
//   set1(x), load(const float*), store(float*, v);
//   kRows: rows a block takes at most (each block loads the codes once);
//   kParts: vectors a 16-column tile (2: AVX2, 4: NEON); part p is columns
//   [p * 16 / kParts, (p + 1) * 16 / kParts), bytes [p * 64 / kParts, ...) of each 64-byte chunk;
//   load_codes<BITS, BLK>(p, Code[BLK / 4]); dot_step<BITS, BLK>(acc, codes, q, zs, scale, sa):
//   acc = fma(float(dot + zs), scale * sa, acc) (zs 0 for 4 bits);
//   kTileRows<BITS, BLK>, tile_rows<BITS, BLK, MR>(a, w, s, zs, y, m0, tile): calls of at least
//   kTileRows rows (0: none) take whole tiles, MR rows at a time, by the form's own loop, which
//   must take the same steps (QFormBase below: none).
//
// Included only by the forms' objects, with internal linkage: each object compiles its own copy
// for its instruction set.
#pragma once
#include <cstdint>
#include <memory>

#include "form_step.h"
#include "qmatmul.h"

namespace specrt {
namespace {

struct QFormBase {  // a form with no whole-tile loop
  template <int BITS, int BLK>
  static constexpr int kTileRows = 0;
  template <int BITS, int BLK, int MR>
  static void tile_rows(const Activations&, const Weights&, const Shape&, const int32_t*, float*, int64_t, int64_t) {}
};

template <class F>
struct QDrive {
  using Vec = typename F::Vec;
  using Code = typename F::Code;
  static constexpr int kWidth = kTile / F::kParts;  // columns a vector

  // MR rows x one part p (= kParts * tile + part) over all of K. zs: 128 * sum of q per row and
  // block (8 bits), which the codes' offset takes out.
  template <int BITS, int BLK, int MR>
  static void rows_part(const Activations& a, const Weights& w, const Shape& s, const int32_t* zs, float* y,
                        int64_t m0, int64_t p) {
    constexpr int64_t bytes = int64_t{kTile} * BLK * BITS / 8;
    const int64_t nb = s.K / BLK, nq = s.K / kQBlock, t = p / F::kParts, part = p % F::kParts;
    Vec acc[MR];
    for (int i = 0; i < MR; ++i) acc[i] = F::zero();
    for (int64_t b = 0; b < nb; ++b) {
      Code v[BLK / 4];
      F::template load_codes<BITS, BLK>(w.codes + (t * nb + b) * bytes + (64 / F::kParts) * part, v);
      const int64_t o = (t * nb + b) * kTile + kWidth * part;
      const Vec scale = F::load(w.scale + o);
      for (int i = 0; i < MR; ++i) {
        const int64_t m = m0 + i;
        const int32_t z = BITS == 8 ? zs[m * nb + b] : 0;
        acc[i] = F::template dot_step<BITS, BLK>(acc[i], v, a.q + m * s.K + b * BLK, z, scale,
                                                 a.sa[m * nq + b * BLK / kQBlock]);
        if (w.min) acc[i] = F::fma(F::load(w.min + o), F::set1(a.qsa[m * nb + b]), acc[i]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      float* out = y + (m0 + i) * s.N + kWidth * p;
      F::store(out, w.bias ? F::add(acc[i], F::load(w.bias + kWidth * p)) : acc[i]);
    }
  }

  template <int BITS, int BLK>
  static void run(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
    const int64_t nb = s.K / BLK;
    // (no std::vector: its out-of-line members would be weak symbols the forms' objects share)
    std::unique_ptr<int32_t[]> zs;
    if constexpr (BITS == 8) {
      zs.reset(new int32_t[s.M * nb]);
      for (int64_t i = 0; i < s.M * nb; ++i) {
        int sum = 0;
        for (int k = 0; k < BLK; ++k) sum += a.q[i * BLK + k];
        zs[i] = 128 * sum;
      }
    }
    // rows in as few blocks of at most F::kRows as hold them, sizes within one of each other
    // (each block loads the codes again: 17 rows at 4 are 4 4 3 3 3, not 4 4 4 4 1); from
    // kTileRows rows by whole tiles
    const int64_t n = (s.M + F::kRows - 1) / F::kRows;
    constexpr int from = F::template kTileRows<BITS, BLK>;
    const bool tiles = from > 0 && s.M >= from;
    for (int64_t p = F::kParts * t0; n > 0 && p < F::kParts * t1; p += tiles ? F::kParts : 1)
      for (int64_t i = 0, m = 0; i < n; ++i) {
        const int64_t rows = s.M / n + (i < s.M % n);
        rows_block<BITS, BLK>(a, w, s, zs.get(), y, m, rows, p, tiles);
        m += rows;
      }
  }

  template <int BITS, int BLK, int R = F::kRows>
  static void rows_block(const Activations& a, const Weights& w, const Shape& s, const int32_t* zs, float* y,
                         int64_t m0, int64_t rows, int64_t p, bool tiles) {
    if (rows == R && tiles) return F::template tile_rows<BITS, BLK, R>(a, w, s, zs, y, m0, p / F::kParts);
    if (rows == R) return rows_part<BITS, BLK, R>(a, w, s, zs, y, m0, p);
    if constexpr (R > 1) return rows_block<BITS, BLK, R - 1>(a, w, s, zs, y, m0, rows, p, tiles);
  }
};

// matmul_ref's contract for the form F.
template <class F>
void matmul_drive(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1) {
  if (s.bits == 4) return QDrive<F>::template run<4, 32>(a, w, s, y, t0, t1);
  if (s.block == 16) return QDrive<F>::template run<8, 16>(a, w, s, y, t0, t1);
  return QDrive<F>::template run<8, 32>(a, w, s, y, t0, t1);
}

}  // namespace
}  // namespace specrt
