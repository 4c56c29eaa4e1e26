// y[M, N] = x[M, K] @ W.T for block-quantized weights: w[n, k] = scale[n, b] * code[n, k] + min[n, b]
// with b = k / block. Two forms: 4-bit codes (0..15) in blocks of 32 (QMatMul4), 8-bit codes
// (0..255) in blocks of 16 or 32 (QMatMul8). Activations are quantized per row and 32-block to
// int8 (round to nearest even, scale sa = amax / 127), so a block's dot product is an exact
// integer; the mins' term takes the block's sum of the quantized activations (the exact dot of
// the dequantized weights with the quantized x, as llama.cpp computes these weights). Every
// output then takes the same float operations in the same order, whatever M, the thread split
// or the instruction set: a row computes the same bits in any call (docs/design.md, "Our own
// kernel").
#pragma once
#include <cstddef>
#include <cstdint>

namespace specrt {

constexpr int kQBlock = 32;  // activations: values per quantization block
constexpr int kTile = 16;    // columns per tile

struct Activations {  // x quantized: M rows
  const int8_t* q;    // [M, K]
  const float* sa;    // [M, K/32]: amax / 127
  const float* qsa;   // [M, K/block]: sum of q over the weights' block * its sa (the mins' factor)
};

// Weights in the kernel's layout (runtime/kernels/layout.py): for tile t and block b, the
// tile's codes in chunks of 64 bytes, chunk j holding for column c of the tile 4 bytes of codes
// k = block*b + 4j + i (i = 0..3): the AVX-512 VNNI / AMX operand order. 8 bits: block/4 chunks
// of one code a byte. 4 bits: 4 chunks whose low nibbles are codes k = 32b + 4j + i and high
// nibbles k = 32b + 4(j + 4) + i.
struct Weights {
  const uint8_t* codes;  // [N/16, K/block, 16 * block * bits / 8]
  const float* scale;    // [N/16, K/block, 16]
  const float* min;      // [N/16, K/block, 16] or null
  const float* bias;     // [N] or null
};

struct Shape {
  int64_t M, K, N;
  int bits, block;  // (4, 32), (8, 16) or (8, 32)
};

inline int64_t tile_bytes(const Shape& s) { return int64_t{kTile} * s.block * s.bits / 8; }

// x -> q, sa; then qsa at the weights' block.
void quantize(const float* x, int64_t M, int64_t K, int8_t* q, float* sa);
void quantize_avx2(const float* x, int64_t M, int64_t K, int8_t* q, float* sa);
void quantize_avx512(const float* x, int64_t M, int64_t K, int8_t* q, float* sa);
void block_sums(const int8_t* q, const float* sa, int64_t M, int64_t K, int block, float* qsa);

// Column tiles [t0, t1) of y for every row. Each function computes the same bits.
void matmul_ref(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
void matmul_avx2(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
// the AVX2 form with vpdpbusd (native/avx2_dot.h): VEX (AVX-VNNI) and EVEX (AVX-512 VL + VNNI) encodings
void matmul_avxvnni(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
void matmul_avxvnni_evex(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
void matmul_vnni(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
void matmul_amx(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
void matmul_neon(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);
void matmul_dotprod(const Activations& a, const Weights& w, const Shape& s, float* y, int64_t t0, int64_t t1);

}  // namespace specrt
