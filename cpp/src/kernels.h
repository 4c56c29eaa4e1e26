// specrt's own onnxruntime operators (native/, `make kernels`: libspecrt_kernels.so;
// runtime/kernels/__init__.py is the Python side). The packed graphs on those operators
// (`*.kernels.onnx`) need the library registered with their sessions.
#pragma once

#include <string>

namespace specrt {

// The library to use: `given` if not empty, else $SPECRT_KERNELS, else libspecrt_kernels.so
// beside libspecrt.so. "" when that file does not exist.
std::string find_kernels_library(const std::string& given);

// The instruction set the library runs QMatMul with on this CPU: a fast form's name ("amx", "vnni",
// "avxvnni", "avx2"; "dotprod", "neon": native/isa.h) or "ref" (the portable definition, far
// slower than onnxruntime's MatMulNBits). Throws Error (UNSUPPORTED)
// when the library cannot be loaded.
std::string kernels_isa(const std::string& library);

}  // namespace specrt
