// onnxruntime custom-op library: domain "specrt", ops QMatMul4 and QMatMul8 (qmatmul.h; QMatMulGGML
// and PackedAttention register here from their own files), against
// onnxruntime's C API version 21 (headers from Debian's libonnxruntime-dev 1.21; newer runtimes
// accept it).
//   inputs:  x float [..., K], codes uint8 [N/16, K/block, 16 * block * bits / 8],
//            scale float [N/16, K/block, 16], min float [N/16, K/block, 16] (optional),
//            bias float [N] (optional)
//   attrs:   K, N; QMatMul8: block_size (16 or 32; QMatMul4's is 32);  output: y float [..., N]
// Work is split over column tiles with onnxruntime's intra-op pool (KernelContext_ParallelFor).
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_forms.h"
#include "ort_glue.h"
#include "qmatmul.h"

#define SPECRT_EXPORT extern "C" __attribute__((visibility("default")))

namespace specrt {

const OrtApi* g_api = nullptr;

namespace {

#if defined(__aarch64__)
int detect() {  // Advanced SIMD is part of ARMv8-A; sdot is the dot-product extension (ASIMDDP)
  return getauxval(AT_HWCAP) & HWCAP_ASIMDDP ? kDotprod : kNeon;
}
bool runs_here(int) { return true; }  // each form below the best
#else
const X86Forms& here() {
  static const X86Forms f = cpu_forms();
  return f;
}

int detect() { return best_form(here()); }
bool runs_here(int isa) { return runs(here(), isa); }
#endif

}  // namespace

#if defined(__aarch64__)
Quantizer quantizer(int) { return quantize; }
#else
Quantizer quantizer(int isa) { return isa >= kVnni ? quantize_avx512 : isa >= kAvx2 ? quantize_avx2 : quantize; }
bool avxvnni_vex() { return here().avx_vnni; }
#endif

int best_isa() {
  static const int found = detect();
  return lowered(found, std::getenv("SPECRT_KERNELS_ISA"), runs_here);
}

namespace {

struct Kernel {
  int64_t K, N;
  int bits, block, isa;
};

struct Job {
  const Activations* a;
  const Weights* w;
  Shape s;
  float* y;
  int64_t tiles_per_chunk;
  int isa;
};

constexpr int64_t kAmxMinRows = 6;  // below it the VNNI form is as fast or faster (docs/benchmarks.md §53)

void run_chunk(void* p, size_t i) {
  const Job& j = *static_cast<Job*>(p);
  const int64_t t0 = static_cast<int64_t>(i) * j.tiles_per_chunk;
  const int64_t t1 = std::min(t0 + j.tiles_per_chunk, j.s.N / kTile);
#if defined(__aarch64__)
  (j.isa == kDotprod ? matmul_dotprod : j.isa == kNeon ? matmul_neon : matmul_ref)(*j.a, *j.w, j.s, j.y, t0, t1);
#else
  if (j.isa == kAmx && j.s.M >= kAmxMinRows)
    matmul_amx(*j.a, *j.w, j.s, j.y, t0, t1);
  else if (j.isa >= kVnni)
    matmul_vnni(*j.a, *j.w, j.s, j.y, t0, t1);
  else if (j.isa == kAvxVnni)
    (avxvnni_vex() ? matmul_avxvnni : matmul_avxvnni_evex)(*j.a, *j.w, j.s, j.y, t0, t1);
  else if (j.isa == kAvx2)
    matmul_avx2(*j.a, *j.w, j.s, j.y, t0, t1);
  else
    matmul_ref(*j.a, *j.w, j.s, j.y, t0, t1);
#endif
}

OrtStatus* fail(const std::string& msg) { return specrt::fail("QMatMul", msg); }

#define TRY SPECRT_TRY

// The sizes compute() requires of the weights, checked at session creation where they are
// initializers (they always are in specrt's graphs) and again in every call.
OrtStatus* check_weights(const OrtKernelInfo* info, const Shape& s) {
  const int64_t cells = s.N / kTile * (s.K / s.block), want[] = {cells * tile_bytes(s), cells * kTile, cells * kTile, s.N};
  const char* const what[] = {"codes must hold N/16 * K/block * 16 * block * bits/8 bytes",
                              "scale must hold N/16 * K/block * 16 values", "min must hold N/16 * K/block * 16 values",
                              "bias must hold N values"};
  for (size_t i = 1; i <= 4; ++i) {
    int64_t n = -1;
    TRY(constant_count(info, i, &n));
    if (n >= 0 && n != want[i - 1])
      return fail(std::string(what[i - 1]) + " (K = " + std::to_string(s.K) + ", N = " + std::to_string(s.N) +
                  ": " + std::to_string(want[i - 1]) + ", the weight holds " + std::to_string(n) + ")");
  }
  return nullptr;
}

OrtStatus* compute(const Kernel& k, OrtKernelContext* ctx) {
  const OrtValue *x, *codes, *scale, *min = nullptr, *bias = nullptr;
  std::vector<int64_t> dx, dc, ds, dm, db;
  size_t n_in = 0;
  TRY(g_api->KernelContext_GetInputCount(ctx, &n_in));
  TRY(input(ctx, 0, &x, &dx));
  TRY(input(ctx, 1, &codes, &dc));
  TRY(input(ctx, 2, &scale, &ds));
  if (n_in > 3) TRY(input(ctx, 3, &min, &dm));
  if (n_in > 4) TRY(input(ctx, 4, &bias, &db));
  const Shape shape{0, k.K, k.N, k.bits, k.block};
  const int64_t K = k.K, N = k.N, tiles = N / kTile, nb = K / k.block;
  if (dx.empty() || dx.back() != K) return fail("x's last dimension must be K = " + std::to_string(K));
  if (count(dc) != tiles * nb * tile_bytes(shape)) return fail("codes must hold N/16 * K/block * 16 * block * bits/8 bytes");
  if (count(ds) != tiles * nb * kTile) return fail("scale must hold N/16 * K/block * 16 values");
  if (min && count(dm) != tiles * nb * kTile) return fail("min must hold N/16 * K/block * 16 values");
  if (bias && count(db) != N) return fail("bias must hold N values");
  const int64_t M = count(dx) / K;
  std::vector<int64_t> dy(dx);
  dy.back() = N;
  OrtValue* yv = nullptr;
  TRY(g_api->KernelContext_GetOutput(ctx, 0, dy.data(), dy.size(), &yv));
  float* y = nullptr;
  TRY(g_api->GetTensorMutableData(yv, reinterpret_cast<void**>(&y)));
  if (M == 0) return nullptr;

  const float* xp;
  Weights w{};
  TRY(data(x, &xp));
  TRY(data(codes, &w.codes));
  TRY(data(scale, &w.scale));
  if (min) TRY(data(min, &w.min));
  if (bias) TRY(data(bias, &w.bias));
  std::vector<int8_t> q(static_cast<size_t>(M * K));
  std::vector<float> sa(static_cast<size_t>(M * (K / kQBlock))), qsa(static_cast<size_t>(M * nb));
  quantizer(k.isa)(xp, M, K, q.data(), sa.data());
  if (min) block_sums(q.data(), sa.data(), M, K, k.block, qsa.data());
  const Activations a{q.data(), sa.data(), qsa.data()};
  Job job{&a, &w, {M, K, N, k.bits, k.block}, y, 8, k.isa};  // 8 tiles (128 columns) a chunk: tile pairs
  return g_api->KernelContext_ParallelFor(ctx, run_chunk, static_cast<size_t>((tiles + 7) / 8), 0, &job);
}

OrtStatus* ORT_API_CALL create(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info, void** out) {
  int64_t K = 0, N = 0, block = 32;
  const int bits = std::strcmp(spec_of(op).name, "QMatMul4") == 0 ? 4 : 8;
  TRY(g_api->KernelInfoGetAttribute_int64(info, "K", &K));
  TRY(g_api->KernelInfoGetAttribute_int64(info, "N", &N));
  if (bits == 8) TRY(g_api->KernelInfoGetAttribute_int64(info, "block_size", &block));
  if (block != 32 && block != 16) return fail("block_size must be 16 or 32");
  if (K <= 0 || N <= 0 || K % kQBlock || N % kTile) return fail("K must be a multiple of 32 and N of 16");
  TRY(check_weights(info, Shape{0, K, N, bits, static_cast<int>(block)}));
  *out = new Kernel{K, N, bits, static_cast<int>(block), best_isa()};
  return nullptr;
}

// the callbacks base_op gives every op: its spec's, or the library's common answers
const char* ORT_API_CALL provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
const char* ORT_API_CALL name(const OrtCustomOp* op) { return spec_of(op).name; }
ONNXTensorElementDataType ORT_API_CALL in_type(const OrtCustomOp* op, size_t i) { return spec_of(op).in_type[i]; }
ONNXTensorElementDataType ORT_API_CALL out_type(const OrtCustomOp* op, size_t i) { return spec_of(op).out_type[i]; }
size_t ORT_API_CALL n_inputs(const OrtCustomOp* op) { return spec_of(op).inputs; }
size_t ORT_API_CALL n_outputs(const OrtCustomOp* op) { return spec_of(op).outputs; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL in_kind(const OrtCustomOp* op, size_t i) { return spec_of(op).in_kind[i]; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL out_kind(const OrtCustomOp* op, size_t i) { return spec_of(op).out_kind[i]; }
int ORT_API_CALL variadic_min(const OrtCustomOp* op) { return spec_of(op).variadic_min; }
OrtMemType ORT_API_CALL in_mem(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL one(const OrtCustomOp*) { return 1; }
int ORT_API_CALL start_version(const OrtCustomOp*) { return 1; }
int ORT_API_CALL end_version(const OrtCustomOp*) { return 1 << 30; }

}  // namespace

CustomOp base_op(const OpSpec& spec, CreateKernel create) {
  CustomOp c;
  std::memset(&c.op, 0, sizeof c.op);  // callbacks left unset stay null
  c.spec = spec;
  OrtCustomOp& op = c.op;
  op.version = ORT_API_VERSION;
  op.CreateKernelV2 = create;
  op.GetName = name;
  op.GetExecutionProviderType = provider;
  op.GetInputType = in_type;
  op.GetInputTypeCount = n_inputs;
  op.GetOutputType = out_type;
  op.GetOutputTypeCount = n_outputs;
  op.GetInputCharacteristic = in_kind;
  op.GetOutputCharacteristic = out_kind;
  op.GetInputMemoryType = in_mem;
  op.GetVariadicInputMinArity = variadic_min;
  op.GetVariadicInputHomogeneity = one;
  op.GetVariadicOutputMinArity = variadic_min;
  op.GetVariadicOutputHomogeneity = one;
  op.GetStartVersion = start_version;
  op.GetEndVersion = end_version;
  return c;
}

namespace {

// inputs x, codes, scale, min (optional), bias (optional) -> y
constexpr OpSpec qmatmul_spec(const char* name) {
  return {name, 5, 1, {kF32, kU8, kF32, kF32, kF32}, {kF32}, {kRequired, kRequired, kRequired, kOptional, kOptional},
          {kRequired}, 1};
}
CustomOp g_qmatmul4 = custom_op<Kernel, compute>(qmatmul_spec("QMatMul4"), create);  // outlive every session
CustomOp g_qmatmul8 = custom_op<Kernel, compute>(qmatmul_spec("QMatMul8"), create);
OrtCustomOpDomain* g_domain = nullptr;

}  // namespace
}  // namespace specrt

using namespace specrt;

SPECRT_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (!api) return nullptr;  // a runtime older than the headers: nothing registered, sessions fail on the op
  g_api = api;
  if (!g_domain) {
    TRY(api->CreateCustomOpDomain("specrt", &g_domain));
    TRY(api->CustomOpDomain_Add(g_domain, &g_qmatmul4.op));
    TRY(api->CustomOpDomain_Add(g_domain, &g_qmatmul8.op));
    TRY(api->CustomOpDomain_Add(g_domain, packed_attention_op()));
    TRY(api->CustomOpDomain_Add(g_domain, qmatmul_ggml_op()));
  }
  return api->AddCustomOpDomain(options, g_domain);
}

// The instruction set the operators run with here: "amx", "vnni", "avxvnni", "avx2", "dotprod", "neon"
// or "ref".
SPECRT_EXPORT const char* specrt_kernels_isa() { return kIsaNames[best_isa()]; }
