// y[M, N] = x[M, K] @ W.T for W in a GGUF's own blocks: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K (ggml's
// layouts; docs/design.md "The GGUF's blocks in the kernel"). The operator QMatMulGGML reads
// the blocks' bytes, rows interleaved 16 at a time (export/kernel_blocks.py): no scale or min is
// widened to fp32 in memory, so a call streams the GGUF's bits per weight (4.5, 8.5, 4.5, 5.5,
// 6.5625).
//
// Activations are quantized as for QMatMul4 (qmatmul.h: per row and 32-block to int8, sa =
// amax / 127), so every integer dot product below is exact, and each output takes these float
// steps, in this order, per 32-block b of K (d, dmin: the block's fp16 fields as fp32; sc, m:
// its sub-block scale and min as integers; dot: sum of code * q over the 32-block):
//   Q8_0, Q4_0  acc = fma(float(dot(code - zp)), d * sa[b], acc)           zp 0 (int8), 8
//   Q4_K, Q5_K  acc = fma(float(dot(code)), (d * sc) * sa[b], acc)
//               acc = fma(-(dmin * m), qsa[b], acc)                       qsa = float(sum q) * sa
//   Q6_K        acc = fma(float(I), d * sa[b], acc)   with the two 16-sub-blocks summed in int32:
//               I = sc[2j] * dot16(code - 32) + sc[2j + 1] * dot16'(code - 32)
// then y = acc (+ bias). Q4_K / Q5_K are QMatMul4's steps on the same weights (d * sc and
// dmin * m are exact in fp32): the same bits as QMatMul4 over the exported fp32 scales.
// Nothing depends on M, the thread split (column tiles) or the instruction set: a row computes
// the same bits in any call.
#pragma once
#include <cstddef>
#include <cstdint>

#include "qmatmul.h"

namespace specrt {

enum GgmlType { kQ4_0, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kGgmlTypes };

struct GgmlForm {
  const char* name;
  int super;      // elements of one row per ggml block
  int type_size;  // bytes of one row's block
};

inline constexpr GgmlForm kGgml[kGgmlTypes] = {
    {"Q4_0", 32, 18}, {"Q8_0", 32, 34}, {"Q4_K", 256, 144}, {"Q5_K", 256, 176}, {"Q6_K", 256, 210}};

// A record: the blocks of 16 rows (one column tile) at one block index, 16 * type_size bytes.
// Offsets within it (c: column in the tile; "codes of a 32-block" as qmatmul.h's layout: 4-bit
// codes in 4 chunks of 64 bytes, low nibbles k = 4j + i, high nibbles k = 4(j + 4) + i, at byte
// 64j + 4c + i; 8-bit codes in 8 chunks, k = 4j + i at byte 64j + 4c + i):
//   Q4_0  [0, 32) d fp16 [16]; then the 32-block's 4-bit codes (0..15, zero point 8)
//   Q8_0  [0, 32) d fp16 [16]; then 8-bit codes = the int8 weight + 128
//   Q4_K  [0, 32) d, [32, 64) dmin fp16 [16]; [64, 256) the 12 scale bytes: group g (64 bytes)
//         holds bytes 4g .. 4g + 3 of column c at 4c; then per 32-block (8): 256 bytes of codes
//   Q5_K  as Q4_K, each 32-block's 256 bytes followed by 64 of fifth bits: bit j of byte
//         4c + i is the high bit of code k = 4j + i (320 bytes a 32-block)
//   Q6_K  [0, 32) d fp16 [16]; [32, 288) int8 scales [16 sub-blocks][16 columns]; then per
//         32-block (8): 256 bytes of low nibbles, 128 of high 2 bits: bits 2u, 2u + 1 of byte
//         64h + 4c + i are code k = 4(4h + u) + i's bits 4, 5 (codes 0..63, zero point 32)
inline int64_t record_bytes(int type) { return int64_t{kTile} * kGgml[type].type_size; }

struct BlockActs {    // x quantized: M rows
  const int8_t* q;    // [M, K]
  const float* sa;    // [M, K/32]: amax / 127
  const float* qsa;   // [M, K/32]: float(sum of q over the 32-block) * sa (Q4_K, Q5_K mins)
  const int32_t* zs;  // the zero point's share of a dot: zp * sum of q over each sub-block,
                      // [M, K/16] (Q6_K) or [M, K/32] (Q8_0: 128, Q4_0: 8); null otherwise
};

struct BlockWeights {
  const uint8_t* blocks;  // [N/16, K/super, record_bytes]
  const float* bias;      // [N] or null
};

struct BlockShape {
  int64_t M, K, N;
  int type;
};

// q -> zs for `type` (the sums the zero points take); a no-op for the types without one.
void zero_sums(const int8_t* q, int64_t M, int64_t K, int type, int32_t* zs);
int64_t zero_sums_count(int64_t M, int64_t K, int type);  // zs's length

// Column tiles [t0, t1) of y for every row. Each function computes the same bits.
void ggml_ref(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1);
void ggml_avx2(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1);
// the AVX2 form with vpdpbusd (native/avx2_dot.h): VEX (AVX-VNNI) and EVEX (AVX-512 VL + VNNI) encodings
void ggml_avxvnni(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1);
void ggml_avxvnni_evex(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1);
// AMX tiles for the integer dots, then the VNNI form's float steps (qmatmul_ggml_op.cc runs it from 5 rows, Q4_0 / Q8_0 from 8)
void ggml_amx(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1);
void ggml_vnni(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1);
void ggml_neon(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1);
void ggml_dotprod(const BlockActs& a, const BlockWeights& w, const BlockShape& s, float* y, int64_t t0, int64_t t1);

}  // namespace specrt
