// What the library's operators share: the onnxruntime API (set when the library registers),
// status helpers, tensor access and the instruction set chosen for this CPU.
#pragma once
#include <onnxruntime_c_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "isa.h"

namespace specrt {

extern const OrtApi* g_api;

// The best form the CPU has (isa.h's Isa), lowered by SPECRT_KERNELS_ISA=<the name of a form the
// CPU runs> (tests compare the forms).
int best_isa();
#if !defined(__aarch64__)
// kAvxVnni's objects here: VEX (the CPU has AVX-VNNI) or EVEX (only AVX-512 VL + VNNI's encoding)
bool avxvnni_vex();
#endif

// x -> its int8 blocks (qmatmul.h's quantize) in the form for `isa`: the same bits in each.
using Quantizer = void (*)(const float* x, int64_t M, int64_t K, int8_t* q, float* sa);
Quantizer quantizer(int isa);

#define SPECRT_TRY(expr)     \
  do {                       \
    OrtStatus* _st = (expr); \
    if (_st) return _st;     \
  } while (0)

inline OrtStatus* fail(const char* op, const std::string& msg) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, ("specrt " + std::string(op) + ": " + msg).c_str());
}

// Input i -> its value and dims; a null value when the optional input is absent.
inline OrtStatus* input(OrtKernelContext* ctx, size_t i, const OrtValue** v, std::vector<int64_t>* dims) {
  SPECRT_TRY(g_api->KernelContext_GetInput(ctx, i, v));
  if (!*v) return nullptr;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  SPECRT_TRY(g_api->GetTensorTypeAndShape(*v, &info));
  size_t rank = 0;
  OrtStatus* st = g_api->GetDimensionsCount(info, &rank);
  if (!st) dims->resize(rank), st = g_api->GetDimensions(info, dims->data(), rank);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  return st;
}

// Elements of input i when the session holds it as a constant (an initializer), else -1: lets an
// operator check its weights against its attributes when the session is built, so a bundle whose
// node and weights disagree is refused at load rather than in its first call.
inline OrtStatus* constant_count(const OrtKernelInfo* info, size_t i, int64_t* n) {
  *n = -1;
  size_t inputs = 0;
  SPECRT_TRY(g_api->KernelInfo_GetInputCount(info, &inputs));
  if (i >= inputs) return nullptr;
  int is_constant = 0;
  const OrtValue* v = nullptr;
  SPECRT_TRY(g_api->KernelInfoGetConstantInput_tensor(info, i, &is_constant, &v));
  if (!is_constant || !v) return nullptr;
  OrtTensorTypeAndShapeInfo* shape = nullptr;
  SPECRT_TRY(g_api->GetTensorTypeAndShape(v, &shape));
  size_t elements = 0;
  OrtStatus* st = g_api->GetTensorShapeElementCount(shape, &elements);
  g_api->ReleaseTensorTypeAndShapeInfo(shape);
  if (!st) *n = static_cast<int64_t>(elements);
  return st;
}

inline int64_t count(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

template <typename T>
OrtStatus* data(const OrtValue* v, T** out) {
  void* p = nullptr;
  SPECRT_TRY(g_api->GetTensorMutableData(const_cast<OrtValue*>(v), &p));
  *out = static_cast<T*>(p);
  return nullptr;
}

// An operator's signature: its name, each input's and output's element type and kind, and the
// least count of a variadic group (inputs and outputs alike). Plain arrays: it sits beside the
// OrtCustomOp in CustomOp, where the callbacks read it back from the op pointer they are given.
constexpr int kMaxInputs = 8, kMaxOutputs = 2;
struct OpSpec {
  const char* name;
  size_t inputs, outputs;
  ONNXTensorElementDataType in_type[kMaxInputs], out_type[kMaxOutputs];
  OrtCustomOpInputOutputCharacteristic in_kind[kMaxInputs], out_kind[kMaxOutputs];
  int variadic_min;
};
constexpr auto kF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, kU8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
               kI32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, kI64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
constexpr auto kRequired = INPUT_OUTPUT_REQUIRED, kOptional = INPUT_OUTPUT_OPTIONAL, kVariadic = INPUT_OUTPUT_VARIADIC;

struct CustomOp {  // op first: the OrtCustomOp* onnxruntime passes back is this object's address
  OrtCustomOp op;
  OpSpec spec;
};
inline const OpSpec& spec_of(const OrtCustomOp* op) { return reinterpret_cast<const CustomOp*>(op)->spec; }

using CreateKernel = OrtStatus*(ORT_API_CALL*)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void**);

// The callbacks every op of the library shares (CPU, any opset version, variadic groups
// homogeneous; name, types and kinds from its spec), `create` making its kernels.
CustomOp base_op(const OpSpec& spec, CreateKernel create);

// base_op() running kernels of type K (made by `create`) with compute(K, ctx): both compute entry
// points (the older one drops a failure's status) and the kernel's deletion. Keep the result in a
// global that outlives every session, and register &result.op.
template <typename K, OrtStatus* (*Compute)(const K&, OrtKernelContext*)>
CustomOp custom_op(const OpSpec& spec, CreateKernel create) {
  struct Calls {
    static OrtStatus* ORT_API_CALL v2(void* k, OrtKernelContext* ctx) { return Compute(*static_cast<K*>(k), ctx); }
    static void ORT_API_CALL v1(void* k, OrtKernelContext* ctx) {
      if (OrtStatus* st = Compute(*static_cast<K*>(k), ctx)) g_api->ReleaseStatus(st);
    }
    static void ORT_API_CALL destroy(void* k) { delete static_cast<K*>(k); }
  };
  CustomOp c = base_op(spec, create);
  c.op.KernelComputeV2 = Calls::v2;
  c.op.KernelCompute = Calls::v1;
  c.op.KernelDestroy = Calls::destroy;
  return c;
}

OrtCustomOp* packed_attention_op();  // attention_op.cc
OrtCustomOp* qmatmul_ggml_op();      // qmatmul_ggml_op.cc

}  // namespace specrt
