// Attention over a packed call's lanes (op specrt.PackedAttention, one node per layer): every
// lane's new K/V rows written in place into its own buffer, then every token's attention over
// its own lane's rows. One query row (a token and a head) is defined by its position and the
// rows before it only, never by the call:
//   q, k     rotated (non-interleaved halves): x1 * cos - x2 * sin, x2 * cos + x1 * sin
//   scores   s_j = dot(q, K_j) * scale; dot: one fma chain over d = 0 .. D - 1 from 0
//   softmax  online over chunks of kChunk positions from position 0 (absolute boundaries), the
//            last one ending at the query's own position: per chunk the max m', alpha =
//            exp(m - m'), e_j = exp(s_j - m'), l = l * alpha + sum(e) (16 lanes, lane l adding
//            e_j for j = l, l + 16, ... in order, then the lanes in a fixed tree: l + 8, + 4, + 2, + 1),
//            acc = acc * alpha, acc += e_j * V_j (fma, j ascending); out = acc / l
//   exp      one polynomial (exp_def), 0 below -80
// So a row computes the same bits alone or beside any other rows, at any width, with any thread
// split, in the portable form and the AVX2, AVX-512 and NEON forms (docs/design.md "Our own kernel").
#pragma once
#include <cstdint>

namespace specrt {

constexpr int kChunk = 64;    // positions per softmax chunk
constexpr int kQueryBlock = 16;  // a work unit's tokens (one lane, one KV head)

struct AttnCall {
  int64_t heads, kv_heads, head_dim, half;  // half: cos/sin columns (head_dim / 2)
  float scale;
  const float* qkv;  // [N, (heads + 2 kv_heads) * head_dim]: q, k, v of each packed token
  const float* cos;  // [positions, half]
  const float* sin;
  int64_t positions;
  float* out;  // [N, heads * head_dim]
  int64_t lanes;
  float* const* k;  // per lane [kv_heads, rows, head_dim] (written in place)
  float* const* v;
  const int64_t* rows;         // per lane: its buffer's rows
  const int64_t* first;        // per lane: its first position in this call
  const int64_t* offset;       // per lane: its first entry in `token` / `target`
  const int64_t* width;        // per lane: its entries
  const int64_t* token;        // per lane entry: the packed token whose q/k/v it holds
  const int64_t* target;       // per lane entry: the packed token whose output it is, or -1
};

// exp as defined above (scalar; the SIMD forms compute the same bits).
float exp_def(float x);
void rotate(const float* x, const float* cos, const float* sin, int64_t half, float* y);

// Lane `lane`'s entries -> rotated K and V rows at their positions.
void write_kv(const AttnCall& c, int64_t lane);

// Lane `lane`, KV head `g`, entries [e0, e1): the outputs of those that have a target.
void attend_ref(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1);
void attend_avx2(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1);
void attend_avx512(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1);
void attend_neon(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1);

}  // namespace specrt
