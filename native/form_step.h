// What the forms' drivers (qmatmul_drive.h, qmatmul_ggml_drive.h) and their loops share: the
// inlining of the per-block steps and the mutant switch. Internal linkage, as the drivers.
#pragma once

namespace specrt {
namespace {

// The per-block steps, inlined into the loops whatever gcc's size limits (the forms instantiate
// many row counts; a step left out of line costs a call a 32-block and its vectors in memory)
#define SPECRT_STEP inline __attribute__((always_inline))

#ifdef SPECRT_MUTANT  // a wrong form the tests must catch: 4-row blocks add each block's terms to acc last
constexpr bool kMutant = true;
#else
constexpr bool kMutant = false;
#endif

}  // namespace
}  // namespace specrt
