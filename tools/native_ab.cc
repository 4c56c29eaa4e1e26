// Two builds of the x86 fast forms in one process, timed interleaved (tools/native_ab.sh): each
// form's PackedAttention and QMatMulGGML at the coder's shapes, `before` (a git ref's sources,
// compiled with its entry points renamed *_before) against this tree's. One thread; for every
// case the two run alternately (A B B A ...), median ms each, and after / before. Also checks
// that both give the same bits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "attention.h"
#include "qmatmul.h"
#include "qmatmul_ggml.h"

namespace specrt {
void attend_avx2_before(const AttnCall&, int64_t, int64_t, int64_t, int64_t);
void attend_avx512_before(const AttnCall&, int64_t, int64_t, int64_t, int64_t);
void ggml_avx2_before(const BlockActs&, const BlockWeights&, const BlockShape&, float*, int64_t, int64_t);
void ggml_vnni_before(const BlockActs&, const BlockWeights&, const BlockShape&, float*, int64_t, int64_t);
void matmul_avx2_before(const Activations&, const Weights&, const Shape&, float*, int64_t, int64_t);
}  // namespace specrt

using namespace specrt;

namespace {

using AttnFn = void (*)(const AttnCall&, int64_t, int64_t, int64_t, int64_t);
using GgmlFn = void (*)(const BlockActs&, const BlockWeights&, const BlockShape&, float*, int64_t, int64_t);
using MatFn = void (*)(const Activations&, const Weights&, const Shape&, float*, int64_t, int64_t);

std::mt19937 rng(37);
float normal() { return std::normal_distribution<float>(0.f, 1.f)(rng); }

template <class F>
double ms(F&& f) {
  const auto t = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int mismatches = 0;

// a and b fill y_a and y_b; reps alternating pairs (A B, then B A); prints one table row
template <class A, class B>
void compare(const char* what, int reps, A&& a, B&& b, const std::vector<float>& ya, const std::vector<float>& yb) {
  std::vector<double> ta, tb;
  a(), b();  // warm: caches, pages, the forms' thread-local buffers
  for (int r = 0; r < reps; ++r) {
    if (r % 2) {
      tb.push_back(ms(b)), ta.push_back(ms(a));
    } else {
      ta.push_back(ms(a)), tb.push_back(ms(b));
    }
  }
  const bool same = std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)) == 0;
  mismatches += !same;
  const double ma = median(ta), mb = median(tb);
  std::printf("| %s | %.2f | %.2f | %.3f |%s\n", what, ma, mb, mb / ma, same ? "" : " DIFFERENT bits");
}

// The coder's attention (12 heads over 2 KV heads of 128) on 8 lanes of `ctx` rows, `width` new
// tokens each.
void attention(const char* form, AttnFn before, AttnFn after, int64_t ctx, int64_t width, int reps) {
  const int64_t H = 12, G = 2, D = 128, R = 8, rows = ctx + width, n = R * width;
  std::vector<int64_t> first(R, ctx), offset(R), wd(R, width), token(n), target(n), rws(R, rows);
  for (int64_t r = 0; r < R; ++r) offset[r] = r * width;
  for (int64_t i = 0; i < n; ++i) token[i] = target[i] = i;
  std::vector<float> qkv(n * (H + 2 * G) * D), cs(rows * D / 2), sn(rows * D / 2);
  for (float& v : qkv) v = normal();
  for (int64_t i = 0; i < rows * D / 2; ++i) cs[i] = std::cos(0.01f * i), sn[i] = std::sin(0.01f * i);
  std::vector<std::vector<float>> K(R, std::vector<float>(G * rows * D)), V = K;
  for (auto* kv : {&K, &V})
    for (auto& b : *kv)
      for (float& v : b) v = normal();
  std::vector<float*> kp, vp;
  for (int64_t r = 0; r < R; ++r) kp.push_back(K[r].data()), vp.push_back(V[r].data());
  std::vector<float> ya(n * H * D), yb(n * H * D);
  AttnCall c{H, G, D, D / 2, 0.088f, qkv.data(), cs.data(), sn.data(), rows, nullptr, R, kp.data(), vp.data(),
             rws.data(), first.data(), offset.data(), wd.data(), token.data(), target.data()};
  auto run = [&](AttnFn fn, std::vector<float>& y) {
    return [&, fn] {
      AttnCall cc = c;
      cc.out = y.data();
      for (int64_t r = 0; r < R; ++r)
        for (int64_t g = 0; g < G; ++g) fn(cc, r, g, 0, width);
    };
  };
  char what[96];
  std::snprintf(what, sizeof what, "%s PackedAttention 8 x %lld, context %lld", form, (long long)width, (long long)ctx);
  compare(what, reps, run(before, ya), run(after, yb), ya, yb);
}


void ggml(const char* form, GgmlFn before, GgmlFn after, int64_t K, int64_t N, int type, int64_t M, int reps) {
  std::vector<uint8_t> blocks(N / kTile * (K / kGgml[type].super) * record_bytes(type));
  for (uint8_t& b : blocks) b = static_cast<uint8_t>(rng());
  for (size_t r = 0; r < blocks.size(); r += record_bytes(type))  // finite fp16 fields: 2^-10 .. 2^-3
    for (int c = 0; c < (type == kQ4_K || type == kQ5_K ? 32 : 16); ++c) blocks[r + 2 * c + 1] = 0x14 + rng() % 16;
  std::vector<float> x(M * K), sa(M * K / 32), qsa(M * K / 32);
  for (float& v : x) v = normal();
  std::vector<int8_t> q(M * K);
  quantize(x.data(), M, K, q.data(), sa.data());
  block_sums(q.data(), sa.data(), M, K, 32, qsa.data());
  std::vector<int32_t> zs(zero_sums_count(M, K, type));
  zero_sums(q.data(), M, K, type, zs.data());
  const BlockActs a{q.data(), sa.data(), qsa.data(), zs.empty() ? nullptr : zs.data()};
  const BlockWeights w{blocks.data(), nullptr};
  std::vector<float> ya(M * N), yb(M * N);
  auto run = [&](GgmlFn fn, std::vector<float>& y) {
    return [&, fn] { fn(a, w, BlockShape{M, K, N, type}, y.data(), 0, N / kTile); };
  };
  char what[128];
  std::snprintf(what, sizeof what, "%s QMatMulGGML %s %lld x %lld, %lld rows", form, kGgml[type].name, (long long)K,
                (long long)N, (long long)M);
  compare(what, reps, run(before, ya), run(after, yb), ya, yb);
}

// QMatMul4 / QMatMul8 (bits, block) K -> N at M rows, with mins (and a bias where `bias`)
void qmatmul(const char* form, MatFn before, MatFn after, int64_t K, int64_t N, int bits, int block, bool bias,
             int64_t M, int reps) {
  const int64_t nb = K / block;
  const Shape shape{M, K, N, bits, block};
  std::vector<uint8_t> codes(N / kTile * nb * tile_bytes(shape));
  for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
  std::vector<float> scale(N * nb), mins(N * nb), bs(N), x(M * K), sa(M * K / 32), qsa(M * nb);
  for (float& v : scale) v = std::abs(normal()) * 0.02f;
  for (float& v : mins) v = -std::abs(normal()) * 0.1f;
  for (float& v : bs) v = normal();
  for (float& v : x) v = normal();
  std::vector<int8_t> q(M * K);
  quantize(x.data(), M, K, q.data(), sa.data());
  block_sums(q.data(), sa.data(), M, K, block, qsa.data());
  const Activations a{q.data(), sa.data(), qsa.data()};
  const Weights w{codes.data(), scale.data(), mins.data(), bias ? bs.data() : nullptr};
  std::vector<float> ya(M * N), yb(M * N);
  auto run = [&](MatFn fn, std::vector<float>& y) {
    return [&, fn] { fn(a, w, shape, y.data(), 0, N / kTile); };
  };
  char what[128];
  std::snprintf(what, sizeof what, "%s QMatMul%d/%d %lld x %lld, %lld rows", form, bits, block, (long long)K,
                (long long)N, (long long)M);
  compare(what, reps, run(before, ya), run(after, yb), ya, yb);
}

// QMatMulGGML at the coder target's Q4_K / Q6_K shapes (gate + up, down, q / o, the LM head)
struct GgmlShape {
  int64_t K, N;
  int type;
};
constexpr GgmlShape kTargetGgml[] = {{1536, 17920, kQ4_K}, {8960, 1536, kQ6_K}, {1536, 1536, kQ4_K}, {1536, 151936, kQ6_K}};

int reps_for(int64_t N, int reps) { return N > 100000 ? std::max(5, reps / 4) : reps; }  // the LM head: fewer

}  // namespace

int main(int argc, char** argv) {
  // `forms`: QMatMulGGML's AVX2 form, before against after, then this tree's VNNI form ("before"
  // column) against its AVX2 form, at the coder target's Q4_K / Q6_K shapes and the rows of argv[3]
  const bool forms_mode = argc > 1 && std::strcmp(argv[1], "forms") == 0;
  const bool attn = argc < 2 || std::strcmp(argv[1], "all") == 0 || std::strcmp(argv[1], "attention") == 0;
  const bool mm = argc < 2 || std::strcmp(argv[1], "all") == 0 || std::strcmp(argv[1], "ggml") == 0;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 21;
  std::vector<int64_t> rows;
  for (const char* p = argc > 3 ? argv[3] : "1,2,6,17"; *p;) {
    char* end;
    rows.push_back(std::strtoll(p, &end, 10));
    p = *end ? end + 1 : end;
  }
  std::printf("| case | before ms | after ms | after / before |\n| --- | --- | --- | --- |\n");
  if (argc > 1 && std::strcmp(argv[1], "attention-forms") == 0) {  // this tree's VNNI form ("before") against its AVX2 form
    for (int64_t ctx : {512, 2000})
      for (int64_t width : {1, 2, 4}) attention("vnni (before) / avx2 (after)", attend_avx512, attend_avx2, ctx, width, reps);
    return mismatches ? 1 : 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "qmatmul") == 0) {
    // QMatMul4's AVX2 form before against after, then this tree's VNNI form ("before" column)
    // against its AVX2 form: the coder draft's shapes (qkv with its bias, o, gate + up, down, the
    // 32,768-row head), and a QMatMul8 (Q6_K-like, blocks of 16) of the target's down projection
    const struct {
      int64_t K, N;
      int bits, block;
      bool bias;
    } shapes[] = {{896, 1152, 4, 32, true}, {896, 896, 4, 32, false}, {896, 9728, 4, 32, false},
                  {4864, 896, 4, 32, false}, {896, 32768, 4, 32, false}, {8960, 1536, 8, 16, false}};
    for (const auto& s : shapes)
      for (int64_t M : rows) {
        qmatmul("avx2", matmul_avx2_before, matmul_avx2, s.K, s.N, s.bits, s.block, s.bias, M, reps);
        qmatmul("vnni (before) / avx2 (after)", matmul_vnni, matmul_avx2, s.K, s.N, s.bits, s.block, s.bias, M, reps);
      }
    return mismatches ? 1 : 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "avxvnni") == 0) {
    // this tree's AVX2 form, then its AVX-512 VNNI form ("before" columns) against its AVX-VNNI
    // form in EVEX encoding (native/avx2_dot.h; "after"): QMatMul4 at the coder draft's shapes and
    // the target's Q4_K-like ones, QMatMulGGML at the target's Q4_K / Q6_K shapes
    const struct {
      int64_t K, N;
      bool bias;
    } q4[] = {{896, 1152, true},   {896, 896, false},   {896, 9728, false}, {4864, 896, false},
              {896, 32768, false}, {1536, 1536, false}, {1536, 8960, false}};
    for (const auto& s : q4)
      for (int64_t M : rows) {
        qmatmul("avx2 (before) / avxvnni (after)", matmul_avx2, matmul_avxvnni_evex, s.K, s.N, 4, 32, s.bias, M, reps);
        qmatmul("vnni (before) / avxvnni (after)", matmul_vnni, matmul_avxvnni_evex, s.K, s.N, 4, 32, s.bias, M, reps);
      }
    for (const auto& s : kTargetGgml)
      for (int64_t M : rows) {
        const int r = reps_for(s.N, reps);
        ggml("avx2 (before) / avxvnni (after)", ggml_avx2, ggml_avxvnni_evex, s.K, s.N, s.type, M, r);
        ggml("vnni (before) / avxvnni (after)", ggml_vnni, ggml_avxvnni_evex, s.K, s.N, s.type, M, r);
      }
    return mismatches ? 1 : 0;
  }
  if (forms_mode) {
    for (const auto& s : kTargetGgml)
      for (int64_t M : rows) {
        const int r = reps_for(s.N, reps);
        ggml("avx2", ggml_avx2_before, ggml_avx2, s.K, s.N, s.type, M, r);
        ggml("vnni (before) / avx2 (after)", ggml_vnni, ggml_avx2, s.K, s.N, s.type, M, r);
      }
    return mismatches ? 1 : 0;
  }
  const struct {
    const char* name;
    AttnFn ab, aa;
    GgmlFn gb, ga;
  } forms[] = {{"avx2", attend_avx2_before, attend_avx2, ggml_avx2_before, ggml_avx2},
               {"vnni", attend_avx512_before, attend_avx512, ggml_vnni_before, ggml_vnni}};
  for (const auto& f : forms) {
    if (attn)
      for (int64_t ctx : {512, 2000})
        for (int64_t width : {1, 4}) attention(f.name, f.ab, f.aa, ctx, width, reps);
    if (mm) {
      const struct {
        int64_t K, N;
        int type;
      } shapes[] = {{1536, 8960, kQ4_K}, {8960, 1536, kQ6_K}, {1536, 1536, kQ5_K}, {1536, 1536, kQ8_0},
                    {1536, 1536, kQ4_0}, {1536, 151936, kQ6_K}};
      for (const auto& s : shapes)
        for (int64_t M : rows)  // the LM head: fewer
          ggml(f.name, f.gb, f.ga, s.K, s.N, s.type, M, reps_for(s.N, reps));
    }
  }
  return mismatches ? 1 : 0;
}
