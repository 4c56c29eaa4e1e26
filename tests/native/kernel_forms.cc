// The kernels' fast forms against their portable definitions, bit for bit, without onnxruntime:
// for the ARM64 forms, cross-compiled and run under qemu-aarch64 (`make kernels-arm64`), and
// natively on x86-64. Random shapes; QMatMulGGML (every type) and QMatMul4/8 at 1 .. 64 rows, in
// one call, row by row and split over 2 threads; PackedAttention at every head size the fast forms
// are built for, 1 .. 7 query heads a KV head, contexts across the softmax's chunk boundaries, on 1
// and 2 threads. Prints one line per form; exits 1 at the first difference
// (with --expect-mismatch: 0 only if some form differs, for a library built with SPECRT_MUTANT).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attention.h"
#include "cpu_forms.h"
#include "qmatmul.h"
#include "qmatmul_ggml.h"

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

using namespace specrt;

namespace {

using GgmlFn = void (*)(const BlockActs&, const BlockWeights&, const BlockShape&, float*, int64_t, int64_t);
using MatFn = void (*)(const Activations&, const Weights&, const Shape&, float*, int64_t, int64_t);
using AttnFn = void (*)(const AttnCall&, int64_t, int64_t, int64_t, int64_t);

struct Form {
  const char* name;
  GgmlFn ggml;
  MatFn mat;
  AttnFn attn;
};

// The forms this CPU runs; each form it cannot run is printed as skipped, with why. The AVX-VNNI
// forms (the AVX2 sources with vpdpbusd: native/avx2_dot.h) have no attention of their own (the
// AVX2 one's: its dots are fp32), nor has AMX (the VNNI one's), so attn is null there.
std::vector<Form> forms_here() {
  std::vector<Form> f;
  [[maybe_unused]] auto skip = [](const char* form, const char* why) { std::printf("kernel_forms: %s: skipped, %s\n", form, why); };
#if defined(__aarch64__)
  f.push_back({"neon", ggml_neon, matmul_neon, attend_neon});
  if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) f.push_back({"dotprod", ggml_dotprod, matmul_dotprod, attend_neon});
#else
  const X86Forms cpu = cpu_forms();  // the library's own reading (native/cpu_forms.h)
  if (cpu.avx2) f.push_back({"avx2", ggml_avx2, matmul_avx2, attend_avx2});
  if (cpu.avx_vnni)
    f.push_back({"avxvnni", ggml_avxvnni, matmul_avxvnni, nullptr});
  else
    skip("avxvnni", "this CPU has no AVX-VNNI (the VEX vpdpbusd)");
  if (cpu.avx512vl_vnni)
    f.push_back({"avxvnni-evex", ggml_avxvnni_evex, matmul_avxvnni_evex, nullptr});
  else
    skip("avxvnni-evex", "this CPU has no AVX-512 VL + VNNI (the EVEX vpdpbusd on 256 bits)");
  if (cpu.vnni) f.push_back({"vnni", ggml_vnni, matmul_vnni, attend_avx512});
  // AMX: the tile forms of QMatMulGGML and QMatMul4/8 at every row count (the library runs them
  // from 5, 6 or 8 rows: qmatmul_ggml_op.cc, ort_ops.cc; a narrower call is still theirs to get
  // right); attention is the VNNI form's
  if (cpu.amx)
    f.push_back({"amx", ggml_amx, matmul_amx, nullptr});
  else
    skip("amx", "this CPU has no AMX int8, or the kernel did not grant its tile state");
#endif
  return f;
}

std::mt19937 rng(52);
int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
float normal() { return std::normal_distribution<float>(0.f, 1.f)(rng); }

void half(uint8_t* p) {  // a random finite fp16 of either sign, magnitude 2^-10 .. 2^-3
  const uint16_t h = static_cast<uint16_t>(uniform(0, 1) << 15 | uniform(5, 12) << 10 | uniform(0, 1023));
  p[0] = h & 0xFF, p[1] = h >> 8;
}

struct Acts {  // M rows of x quantized, with every sum a weight type needs
  int64_t M, K;
  std::vector<int8_t> q;
  std::vector<float> sa, qsa, qsa16;
  std::vector<int32_t> zs;
  Acts(int64_t M_, int64_t K_, int type) : M(M_), K(K_), q(M_ * K_), sa(M_ * K_ / 32), qsa(sa.size()), qsa16(M_ * K_ / 16) {
    std::vector<float> x(M * K);
    for (float& v : x) v = normal();
    for (int64_t m = 0; m < M; ++m) x[m * K + 5] *= 40;  // an outlier channel
    quantize(x.data(), M, K, q.data(), sa.data());
    block_sums(q.data(), sa.data(), M, K, 32, qsa.data());
    block_sums(q.data(), sa.data(), M, K, 16, qsa16.data());
    zs.resize(type >= 0 ? zero_sums_count(M, K, type) : 0);
    if (type >= 0) zero_sums(q.data(), M, K, type, zs.data());
  }
};

int failures = 0;

bool same(const float* want, const float* got, size_t n, const std::string& what) {
  if (std::memcmp(want, got, n * sizeof(float)) == 0) return true;
  if (failures++ < 5) std::fprintf(stderr, "differs: %s\n", what.c_str());
  return false;
}

// rows(m0, m, y, t0, t1): a call of rows [m0, m0 + m), tiles [t0, t1) into y ([m, N]). Checks
// all M rows at once, every row alone, row blocks at both ends, and 2 threads over the tiles.
int check_calls(int64_t M, int64_t N, const std::function<void(int64_t, int64_t, float*, int64_t, int64_t)>& ref,
                const std::function<void(int64_t, int64_t, float*, int64_t, int64_t)>& form, const std::string& what) {
  const int64_t T = N / kTile;
  std::vector<float> want(M * N), y(M * N);
  ref(0, M, want.data(), 0, T);
  int cases = 0;
  form(0, M, y.data(), 0, T);
  cases += same(want.data(), y.data(), M * N, what + " all rows");
  for (int64_t m = 0; m < M; ++m) {
    form(m, 1, y.data() + m * N, 0, T);
  }
  cases += same(want.data(), y.data(), M * N, what + " row by row");
  for (int64_t m : {2, 3, 4, 5, 7, 9, 17}) {
    if (m > M) break;
    for (int64_t start : {int64_t{0}, M - m}) {
      std::vector<float> part(m * N);
      form(start, m, part.data(), 0, T);
      cases += same(want.data() + start * N, part.data(), m * N, what + " rows " + std::to_string(start) + "+" +
                    std::to_string(m));
    }
  }
  std::fill(y.begin(), y.end(), 0.f);
  const int64_t mid = uniform(0, static_cast<int>(T));
  std::thread a([&] { form(0, M, y.data(), 0, mid); });
  std::thread b([&] { form(0, M, y.data(), mid, T); });
  a.join(), b.join();
  cases += same(want.data(), y.data(), M * N, what + " 2 threads");
  return cases;
}

int check_ggml(const Form& f) {
  int cases = 0;
  for (int type = 0; type < kGgmlTypes; ++type)
    for (int rep = 0; rep < 3; ++rep) {
      const int super = kGgml[type].super;
      const int64_t K = super * (super == 32 ? uniform(1, 25) : uniform(1, 3)), N = kTile * uniform(1, 7);
      const int64_t M = rep == 0 ? 64 : uniform(1, 64);
      std::vector<uint8_t> blocks(N / kTile * (K / super) * record_bytes(type));
      for (uint8_t& b : blocks) b = static_cast<uint8_t>(uniform(0, 255));
      for (size_t r = 0; r < blocks.size(); r += record_bytes(type))  // the fp16 fields finite
        for (int c = 0; c < (type == kQ4_K || type == kQ5_K ? 32 : 16); ++c) half(&blocks[r + 2 * c]);
      std::vector<float> bias(N);
      for (float& v : bias) v = normal();
      const Acts x(M, K, type);
      const int64_t nq = K / 32, nz = x.zs.size() / M;
      const BlockWeights w{blocks.data(), rep == 1 ? nullptr : bias.data()};
      auto call = [&](GgmlFn fn) {
        return [&, fn](int64_t m0, int64_t m, float* y, int64_t t0, int64_t t1) {
          const BlockActs a{x.q.data() + m0 * K, x.sa.data() + m0 * nq, x.qsa.data() + m0 * nq,
                            nz ? x.zs.data() + m0 * nz : nullptr};
          fn(a, w, BlockShape{m, K, N, type}, y, t0, t1);
        };
      };
      cases += check_calls(M, N, call(ggml_ref), call(f.ggml),
                           std::string(f.name) + " QMatMulGGML " + kGgml[type].name + " K " + std::to_string(K));
    }
  return cases;
}

int check_qmatmul(const Form& f) {
  int cases = 0;
  const int fmts[3][2] = {{4, 32}, {8, 16}, {8, 32}};
  for (const auto& fmt : fmts)
    for (int rep = 0; rep < 3; ++rep) {
      const int bits = fmt[0], block = fmt[1];
      const int64_t K = 32 * uniform(1, 12), N = kTile * uniform(1, 7), M = rep == 0 ? 64 : uniform(1, 64), nb = K / block;
      const Shape shape{0, K, N, bits, block};
      std::vector<uint8_t> codes(N / kTile * nb * tile_bytes(shape));
      for (uint8_t& b : codes) b = static_cast<uint8_t>(uniform(0, 255));
      std::vector<float> scale(N * nb), mins(N * nb), bias(N);
      for (float& v : scale) v = std::abs(normal()) * 0.02f;
      for (float& v : mins) v = -std::abs(normal()) * 0.1f;
      for (float& v : bias) v = normal();
      const Acts x(M, K, -1);
      const Weights w{codes.data(), scale.data(), rep == 1 ? nullptr : mins.data(), rep == 2 ? nullptr : bias.data()};
      const std::vector<float>& qsa = block == 16 ? x.qsa16 : x.qsa;
      auto call = [&](MatFn fn) {
        return [&, fn](int64_t m0, int64_t m, float* y, int64_t t0, int64_t t1) {
          const Activations a{x.q.data() + m0 * K, x.sa.data() + m0 * (K / 32), qsa.data() + m0 * nb};
          fn(a, w, Shape{m, K, N, bits, block}, y, t0, t1);
        };
      };
      cases += check_calls(M, N, call(matmul_ref), call(f.mat),
                           std::string(f.name) + " QMatMul" + std::to_string(bits) + "/" + std::to_string(block));
    }
  return cases;
}

// One lane per context, each with `width` new tokens; H heads over G KV heads of size D.
int check_attention(const Form& f) {
  int cases = 0;
  // head sizes the fast forms are built for, with 1 .. 7 query heads a KV head (the forms' blocks
  // of same-position queries, whole and split; each V weighing's leftover vectors)
  const int64_t shapes[][2] = {{64, 2}, {64, 6}, {128, 2}, {128, 6}, {32, 14}, {80, 12}, {96, 8}, {256, 4}};
  for (const auto& [D, H] : shapes) {
    const int64_t G = 2, rows = 700, positions = 1024;
    const std::vector<int64_t> ctx = {0, 1, 62, 63, 64, 65, 127, 300, 640};
    const int64_t R = ctx.size();
    std::vector<int64_t> first, offset, width, token, target;
    int64_t n = 0;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t w = uniform(1, 5);
      first.push_back(ctx[r]), offset.push_back(n), width.push_back(w);
      for (int64_t e = 0; e < w; ++e) token.push_back(n + e), target.push_back(n + e);
      n += w;
    }
    std::vector<float> qkv(n * (H + 2 * G) * D), cosv(positions * D / 2), sinv(positions * D / 2);
    for (float& v : qkv) v = normal();
    for (int64_t p = 0; p < positions; ++p)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double ang = p / std::pow(10000.0, 2.0 * i / D);
        cosv[p * D / 2 + i] = static_cast<float>(std::cos(ang)), sinv[p * D / 2 + i] = static_cast<float>(std::sin(ang));
      }
    std::vector<std::vector<float>> K(R, std::vector<float>(G * rows * D)), V = K;
    for (auto* kv : {&K, &V})
      for (auto& buf : *kv)
        for (float& v : buf) v = normal();
    std::vector<float*> kp, vp;
    std::vector<int64_t> rws(R, rows);
    for (int64_t r = 0; r < R; ++r) kp.push_back(K[r].data()), vp.push_back(V[r].data());
    std::vector<float> want(n * H * D), got(n * H * D);
    AttnCall c{H, G, D, D / 2, 1.f / std::sqrt(static_cast<float>(D)), qkv.data(), cosv.data(), sinv.data(), positions,
               want.data(), R, kp.data(), vp.data(), rws.data(), first.data(), offset.data(), width.data(),
               token.data(), target.data()};
    for (int64_t r = 0; r < R; ++r) write_kv(c, r);
    auto all = [&](AttnFn fn, float* out, int threads) {
      c.out = out;
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          int64_t u = 0;
          for (int64_t r = 0; r < R; ++r)
            for (int64_t g = 0; g < G; ++g, ++u)
              if (u % threads == t) fn(c, r, g, 0, width[r]);
        });
      for (auto& th : pool) th.join();
    };
    all(attend_ref, want.data(), 1);
    for (int threads : {1, 2}) {
      std::fill(got.begin(), got.end(), 0.f);
      all(f.attn, got.data(), threads);
      cases += same(want.data(), got.data(), got.size(),
                    std::string(f.name) + " PackedAttention D " + std::to_string(D) + " threads " + std::to_string(threads));
    }
    // each lane's last token alone (a one-entry call at its position) is its row in the wide call
    for (int64_t r = 0; r < R; ++r) {
      const int64_t e = width[r] - 1;
      std::vector<float> one(n * H * D);
      c.out = one.data();
      f.attn(c, r, 0, e, e + 1), f.attn(c, r, 1, e, e + 1);
      const int64_t o = target[offset[r] + e] * H * D;
      cases += same(want.data() + o, one.data() + o, H * D,
                    std::string(f.name) + " PackedAttention one token, context " + std::to_string(ctx[r]));
    }
  }
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  const bool expect_mismatch = argc > 1 && std::strcmp(argv[1], "--expect-mismatch") == 0;
  const std::vector<Form> forms = forms_here();
  if (forms.empty()) {
    std::fprintf(stderr, "kernel_forms: this CPU runs no fast form\n");
    return 1;
  }
  for (const Form& f : forms) {
    const int before = failures;
    const int cases = check_ggml(f) + check_qmatmul(f) + (f.attn ? check_attention(f) : 0);
    std::printf("kernel_forms: %s: %d calls, %s\n", f.name, cases,
                failures == before ? "every one the portable form's bits" : "DIFFERENT bits");
  }
  if (expect_mismatch) return failures ? 0 : 1;
  return failures ? 1 : 0;
}
