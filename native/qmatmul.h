// y[M, N] = x[M, K] @ W.T for 4-bit block weights: w[n, k] = scale[n, b] * code[n, k] + min[n, b]
// with b = k / 32 and codes 0..15. Activations are quantized per row and 32-block to int8
// (round to nearest even, scale = amax / 127), so a block's dot product is an exact integer.
// Every output then takes the same float operations in the same order, whatever M, the thread
// split or the instruction set: a row computes the same bits in any call (docs/design.md,
// "Our own kernel").
#pragma once
#include <cstddef>
#include <cstdint>

namespace specrt {

constexpr int kBlock = 32;       // codes per block and column
constexpr int kTile = 16;        // columns per tile
constexpr int kTileBytes = 256;  // one tile's packed codes of one block

struct Activations {  // x quantized: M rows
  const int8_t* q;    // [M, K]
  const float* sa;    // [M, K/32]: amax / 127
  const float* qsa;   // [M, K/32]: sum(q) * sa (the per-block min's factor)
};

// Weights in the kernel's layout (runtime/kernels/q4.py `pack`): for tile t and block b,
// 256 bytes: 4 chunks of 64; chunk j holds, for column c of the tile, 4 bytes whose low
// nibbles are codes k = 32b + 4j + i and high nibbles k = 32b + 4(j + 4) + i (i = 0..3).
struct Weights {
  const uint8_t* codes;  // [N/16, K/32, 256]
  const float* scale;    // [N/16, K/32, 16]
  const float* min;      // [N/16, K/32, 16] or null
  const float* bias;     // [N] or null
};

struct Shape {
  int64_t M, K, N;
};

// Column tiles [t0, t1) of y for every row. Each function computes the same bits.
void quantize(const float* x, int64_t M, int64_t K, int8_t* q, float* sa, float* qsa);
void matmul_ref(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
void quantize_avx512(const float* x, int64_t M, int64_t K, int8_t* q, float* sa, float* qsa);
void matmul_vnni(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
void matmul_amx(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);

}  // namespace specrt
