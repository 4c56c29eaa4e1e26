// The kernels' instruction-set forms and which of them a CPU runs, as pure functions of what the
// CPU reports (ort_ops.cc reads it; tests/native/isa_choice.cc checks the decision on CPUs this
// host is not).
#pragma once
#include <cstdint>
#include <cstring>

namespace specrt {

// The forms of this architecture, lowest first. x86-64: kAvx2 is AVX2 with FMA and F16C
// (x86-64-v3), kAvxVnni that with vpdpbusd on 256 bits (AVX-VNNI; on AVX-512 hosts the same
// instruction's EVEX encoding), kVnni AVX-512 F/BW with VNNI, kAmx that with AMX (QMatMul4/8's
// wide calls). ARM64: kNeon is ARMv8-A's Advanced SIMD, kDotprod that with the dot-product
// extension (sdot).
#if defined(__aarch64__)
enum Isa { kRef = 0, kNeon = 1, kDotprod = 2 };
inline constexpr const char* kIsaNames[] = {"ref", "neon", "dotprod"};
#else
enum Isa { kRef = 0, kAvx2 = 1, kAvxVnni = 2, kVnni = 3, kAmx = 4 };
inline constexpr const char* kIsaNames[] = {"ref", "avx2", "avxvnni", "vnni", "amx"};

// What cpuid and xgetbv say (the bits the forms need).
struct CpuId {
  uint32_t ecx1 = 0;                       // leaf 1: ECX
  uint32_t ebx7 = 0, ecx7 = 0, edx7 = 0;   // leaf 7, subleaf 0
  uint32_t eax7_1 = 0;                     // leaf 7, subleaf 1: EAX (0 where the CPU has no subleaf 1)
  uint64_t xcr0 = 0;                       // XGETBV(0): the register state the OS saves (0 without OSXSAVE)
  bool amx_granted = false;                // arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) succeeded
};

struct X86Forms {
  bool avx2, avx_vnni, avx512vl_vnni, vnni, amx;
};

inline X86Forms x86_forms(const CpuId& c) {
  auto bit = [](uint32_t r, int i) { return (r >> i & 1u) != 0; };
  const bool osxsave = bit(c.ecx1, 27), ymm = osxsave && (c.xcr0 & 0x6) == 0x6, zmm = osxsave && (c.xcr0 & 0xE6) == 0xE6;
  X86Forms f{};
  f.avx2 = ymm && bit(c.ecx1, 12) && bit(c.ecx1, 28) && bit(c.ecx1, 29) && bit(c.ebx7, 5);  // FMA, AVX, F16C, AVX2
  f.avx_vnni = f.avx2 && bit(c.eax7_1, 4);
  f.vnni = f.avx2 && zmm && bit(c.ebx7, 16) && bit(c.ebx7, 30) && bit(c.ecx7, 11);  // AVX-512 F, BW, VNNI
  f.avx512vl_vnni = f.vnni && bit(c.ebx7, 31);                                       // and VL: 256-bit EVEX
  f.amx = f.vnni && bit(c.edx7, 24) && bit(c.edx7, 25) && (c.xcr0 & 0x60000) == 0x60000 && c.amx_granted;
  return f;
}

// Whether the CPU runs form `isa` (kAvxVnni: by AVX-VNNI, or by AVX-512 VL + VNNI's encoding).
inline bool runs(const X86Forms& f, int isa) {
  switch (isa) {
    case kRef: return true;
    case kAvx2: return f.avx2;
    case kAvxVnni: return f.avx_vnni || f.avx512vl_vnni;
    case kVnni: return f.vnni;
    case kAmx: return f.amx;
    default: return false;
  }
}

// The form best_isa() takes: the highest the CPU runs, but kAvxVnni only by AVX-VNNI itself (an
// AVX-512 host takes kVnni; its EVEX form of kAvxVnni is there to be asked for by name).
inline int best_form(const X86Forms& f) {
  return f.amx ? kAmx : f.vnni ? kVnni : f.avx_vnni ? kAvxVnni : f.avx2 ? kAvx2 : kRef;
}
#endif

// SPECRT_KERNELS_ISA=want: the form of that name where it is below `best` and runs(form) (the CPU
// runs it), else `best` (a name above it, unknown or not run here changes nothing).
template <class Runs>
int lowered(int best, const char* want, Runs runs) {
  for (int i = 0; want && i < best; ++i)
    if (std::strcmp(want, kIsaNames[i]) == 0 && runs(i)) return i;
  return best;
}

}  // namespace specrt
