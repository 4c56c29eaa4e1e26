// What the fast forms of attend_ref (attention_x86.cc, attention_avx2.cc, attention_neon.cc)
// share around their chunk kernels (attention_chunk.h): gathering a work unit's queries (rotated
// q, a zeroed accumulator), grouping queries of one position into blocks, walking the 64-key
// chunks up to the last position (each chunk prepared once, e.g. transposed, then every block
// reaching it), and out = acc / l. The caller supplies the chunk's preparation and a block's
// chunk step. No number is computed here but the final division (IEEE, the same in any width).
//
// Included only by the forms' objects, and everything here has internal linkage: each object
// compiles its own copy for its instruction set (one shared inline function would be the copy of
// whichever form's flags the linker met first, and could run AVX-512 code on an AVX2 CPU).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention.h"

namespace specrt {
namespace {

struct Query {
  const float* q;  // rotated, D
  float* acc;      // D
  float* out;
  int64_t p;
  float m, l;
};

// Calls f(std::integral_constant<int, D>{}) for the head sizes the fast forms are built for
// (32 .. 256); false for any other.
template <class F>
bool with_head_dim(int64_t D, F&& f) {
  switch (D) {
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 80: f(std::integral_constant<int, 80>{}); return true;
    case 96: f(std::integral_constant<int, 96>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    case 256: f(std::integral_constant<int, 256>{}); return true;
    default: return false;
  }
}

// Queries in blocks of up to Block of one position (they are gathered token by token), every
// block walking the chunks up to its position; chunk after chunk, so K/V rows stay in cache.
// prepare(c0, last) readies chunk c0 once; chunk(block, n, c0) runs a block of n queries over it.
template <int Block, class Prepare, class Chunk>
void walk_chunks(std::vector<Query>& qs, int64_t D, Prepare&& prepare, Chunk&& chunk) {
  std::vector<std::pair<size_t, int>> blocks;
  for (size_t i = 0; i < qs.size();) {
    int n = 1;
    while (n < Block && i + n < qs.size() && qs[i + n].p == qs[i].p) ++n;
    blocks.emplace_back(i, n);
    i += n;
  }
  int64_t last = 0;
  for (const Query& x : qs) last = std::max(last, x.p);
  for (int64_t c0 = 0; c0 <= last; c0 += kChunk) {
    prepare(c0, last);
    for (const auto& [i, n] : blocks)
      if (qs[i].p >= c0) chunk(&qs[i], n, c0);
  }
  for (Query& x : qs)
    for (int64_t d = 0; d < D; ++d) x.out[d] = x.acc[d] / x.l;
}

// Lane `lane`, KV head g, entries [e0, e1) (attend_ref's contract): every query with a target,
// then walk(head_dim as an integral_constant, queries, K, V) of the form; attend_ref for a head
// size the forms are not built for.
template <class Walk>
void attend_form(const AttnCall& c, int64_t lane, int64_t g, int64_t e0, int64_t e1, Walk&& walk) {
  const int64_t D = c.head_dim, H = c.heads, G = c.kv_heads, stride = (H + 2 * G) * D, rows = c.rows[lane];
  const int64_t per = H / G;
  std::vector<float> buf(static_cast<size_t>(2 * (e1 - e0) * per * D));
  std::vector<Query> qs;
  qs.reserve(static_cast<size_t>((e1 - e0) * per));
  for (int64_t en = e0; en < e1; ++en) {
    const int64_t out = c.target[c.offset[lane] + en];
    if (out < 0) continue;
    const float* t = c.qkv + c.token[c.offset[lane] + en] * stride;
    const int64_t p = c.first[lane] + en;
    for (int64_t h = g * per; h < (g + 1) * per; ++h) {
      float* q = buf.data() + 2 * qs.size() * D;
      rotate(t + h * D, c.cos + p * c.half, c.sin + p * c.half, c.half, q);
      std::fill(q + D, q + 2 * D, 0.f);
      qs.push_back({q, q + D, c.out + out * H * D + h * D, p, -std::numeric_limits<float>::infinity(), 0.f});
    }
  }
  if (qs.empty()) return;
  const float* K = c.k[lane] + g * rows * D;
  const float* V = c.v[lane] + g * rows * D;
  if (!with_head_dim(D, [&](auto d) { walk(d, qs, K, V); })) attend_ref(c, lane, g, e0, e1);
}

}  // namespace
}  // namespace specrt
