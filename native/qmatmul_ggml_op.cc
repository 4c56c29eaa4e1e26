// specrt.QMatMulGGML: y = x @ W.T over a GGUF tensor's own blocks (qmatmul_ggml.h).
//   inputs:  x float [..., K]; blocks uint8 [N/16, K/super, 16 * type_size] (the tensor's blocks,
//            rows interleaved 16 at a time: export/kernel_blocks.py); bias float [N] (optional)
//   attrs:   K, N, type ("Q4_0", "Q8_0", "Q4_K", "Q5_K" or "Q6_K");  output: y float [..., N]
// Work is split over column tiles, 8 a chunk, on onnxruntime's intra-op pool, as QMatMul4's.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ort_glue.h"
#include "qmatmul_ggml.h"

namespace specrt {
namespace {

struct Kernel {
  int64_t K, N;
  int type, isa;
};

struct Job {
  const BlockActs* a;
  const BlockWeights* w;
  BlockShape s;
  float* y;
  int isa;
};

constexpr int64_t kChunkTiles = 8;
// The AMX form from this many rows, below it the VNNI form (the same bits). Measured in the
// coder target's whole call on 2 threads (docs/benchmarks.md §52): the k-quants' AMX form is
// 0.87x the VNNI form's time at 5 rows and 0.82x at 8, about even at 4, slower at 2; Q4_0's
// cheaper float step keeps VNNI ahead to 6 rows (per call, one thread: 1.08x at 5, 0.93x at 8).
constexpr int64_t kAmxMinRows = 5, kAmxMinRowsLegacy = 8;

bool amx_rows(const BlockShape& s) {
  return s.M >= (s.type == kQ4_0 || s.type == kQ8_0 ? kAmxMinRowsLegacy : kAmxMinRows);
}

void run_chunk(void* p, size_t i) {
  const Job& j = *static_cast<Job*>(p);
  const int64_t t0 = static_cast<int64_t>(i) * kChunkTiles, t1 = std::min(t0 + kChunkTiles, j.s.N / kTile);
#if defined(__aarch64__)
  (j.isa == kDotprod ? ggml_dotprod : j.isa == kNeon ? ggml_neon : ggml_ref)(*j.a, *j.w, j.s, j.y, t0, t1);
#else
  (j.isa == kAmx && amx_rows(j.s) ? ggml_amx
   : j.isa >= kVnni     ? ggml_vnni
   : j.isa == kAvxVnni ? (avxvnni_vex() ? ggml_avxvnni : ggml_avxvnni_evex)
   : j.isa == kAvx2    ? ggml_avx2
                       : ggml_ref)(*j.a, *j.w, j.s, j.y, t0, t1);
#endif
}

OrtStatus* fail(const std::string& msg) { return specrt::fail("QMatMulGGML", msg); }

// The call's activations, quantized, with the sums the weights' type needs.
struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> sa, qsa;
  std::vector<int32_t> zs;

  BlockActs make(const float* x, int64_t M, int64_t K, int type, int isa) {
    q.resize(static_cast<size_t>(M * K));
    sa.resize(static_cast<size_t>(M * (K / kQBlock)));
    quantizer(isa)(x, M, K, q.data(), sa.data());
    if (type == kQ4_K || type == kQ5_K) {
      qsa.resize(sa.size());
      block_sums(q.data(), sa.data(), M, K, kQBlock, qsa.data());
    }
    zs.resize(static_cast<size_t>(zero_sums_count(M, K, type)));
    zero_sums(q.data(), M, K, type, zs.data());
    return {q.data(), sa.data(), qsa.empty() ? nullptr : qsa.data(), zs.empty() ? nullptr : zs.data()};
  }
};

OrtStatus* compute(const Kernel& k, OrtKernelContext* ctx) {
  const OrtValue *x, *blocks, *bias = nullptr;
  std::vector<int64_t> dx, dw, db;
  size_t n_in = 0;
  SPECRT_TRY(g_api->KernelContext_GetInputCount(ctx, &n_in));
  SPECRT_TRY(input(ctx, 0, &x, &dx));
  SPECRT_TRY(input(ctx, 1, &blocks, &dw));
  if (n_in > 2) SPECRT_TRY(input(ctx, 2, &bias, &db));
  const int64_t tiles = k.N / kTile, per_tile = k.K / kGgml[k.type].super;
  if (dx.empty() || dx.back() != k.K) return fail("x's last dimension must be K = " + std::to_string(k.K));
  if (count(dw) != tiles * per_tile * record_bytes(k.type))
    return fail("blocks must hold N/16 * K/" + std::to_string(kGgml[k.type].super) + " * " +
                std::to_string(record_bytes(k.type)) + " bytes (" + kGgml[k.type].name + ")");
  if (bias && count(db) != k.N) return fail("bias must hold N values");
  const int64_t M = count(dx) / k.K;
  std::vector<int64_t> dy(dx);
  dy.back() = k.N;
  OrtValue* yv = nullptr;
  SPECRT_TRY(g_api->KernelContext_GetOutput(ctx, 0, dy.data(), dy.size(), &yv));
  float* y = nullptr;
  SPECRT_TRY(g_api->GetTensorMutableData(yv, reinterpret_cast<void**>(&y)));
  if (M == 0) return nullptr;

  const float* xp;
  BlockWeights w{};
  SPECRT_TRY(data(x, &xp));
  SPECRT_TRY(data(blocks, &w.blocks));
  if (bias) SPECRT_TRY(data(bias, &w.bias));
  Quantized qx;
  const BlockActs a = qx.make(xp, M, k.K, k.type, k.isa);
  Job job{&a, &w, {M, k.K, k.N, k.type}, y, k.isa};
  return g_api->KernelContext_ParallelFor(ctx, run_chunk, static_cast<size_t>((tiles + kChunkTiles - 1) / kChunkTiles),
                                          0, &job);
}

OrtStatus* type_attr(const OrtKernelInfo* info, int* type) {
  size_t size = 0;
  SPECRT_TRY(g_api->KernelInfoGetAttribute_string(info, "type", nullptr, &size));
  std::string name(size, '\0');
  SPECRT_TRY(g_api->KernelInfoGetAttribute_string(info, "type", name.data(), &size));
  name.resize(std::strlen(name.c_str()));
  for (int t = 0; t < kGgmlTypes; ++t)
    if (name == kGgml[t].name) {
      *type = t;
      return nullptr;
    }
  return fail("type must be Q4_0, Q8_0, Q4_K, Q5_K or Q6_K, not '" + name + "'");
}

OrtStatus* ORT_API_CALL create(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** out) {
  int64_t K = 0, N = 0;
  int type = 0;
  SPECRT_TRY(g_api->KernelInfoGetAttribute_int64(info, "K", &K));
  SPECRT_TRY(g_api->KernelInfoGetAttribute_int64(info, "N", &N));
  SPECRT_TRY(type_attr(info, &type));
  if (K <= 0 || N <= 0 || K % kGgml[type].super || N % kTile)
    return fail("K must be a multiple of " + std::to_string(kGgml[type].super) + " (" + kGgml[type].name +
                ") and N of 16");
  // the initializers against K and N when the session is built: a bad bundle is refused at load
  int64_t blocks = -1, bias = -1;
  SPECRT_TRY(constant_count(info, 1, &blocks));
  SPECRT_TRY(constant_count(info, 2, &bias));
  const int64_t want = N / kTile * (K / kGgml[type].super) * record_bytes(type);
  if (blocks >= 0 && blocks != want)
    return fail("blocks must hold N/16 * K/" + std::to_string(kGgml[type].super) + " * " +
                std::to_string(record_bytes(type)) + " bytes (" + kGgml[type].name + ", K = " + std::to_string(K) +
                ", N = " + std::to_string(N) + ": " + std::to_string(want) + ", the weight holds " +
                std::to_string(blocks) + ")");
  if (bias >= 0 && bias != N) return fail("bias must hold N values");
  *out = new Kernel{K, N, type, best_isa()};
  return nullptr;
}

// inputs x, blocks, bias (optional) -> y
CustomOp g_op = custom_op<Kernel, compute>(
    {"QMatMulGGML", 3, 1, {kF32, kU8, kF32}, {kF32}, {kRequired, kRequired, kOptional}, {kRequired}, 1},
    create);  // outlives every session

}  // namespace

OrtCustomOp* qmatmul_ggml_op() { return &g_op.op; }

}  // namespace specrt
