// native/isa.h's decision on CPUs this host is not (`make kernels-isa`,
// tests/runtime/kernels/test_isa.py): which forms each CPU runs, which best_isa() takes, and what
// SPECRT_KERNELS_ISA can lower it to, from the cpuid / xgetbv bits each CPU reports. Above all: no
// CPU without AVX-VNNI is given the VEX vpdpbusd, and none without AVX-512 VL + VNNI its EVEX
// form. Prints one line; exits 1 at the first wrong answer.
#include <cstdio>

#include "isa.h"

using namespace specrt;

#if defined(__aarch64__)
int main() {
  std::printf("isa_choice: an x86-64 decision, nothing to check on ARM64\n");
  return 0;
}
#else
namespace {

// the bits (Intel SDM vol. 2, CPUID; xgetbv's XCR0)
constexpr uint32_t kFma = 1u << 12, kOsxsave = 1u << 27, kAvx = 1u << 28, kF16c = 1u << 29;  // leaf 1 ECX
constexpr uint32_t kAvx2Bit = 1u << 5, kF = 1u << 16, kBw = 1u << 30, kVl = 1u << 31;            // leaf 7 EBX
constexpr uint32_t kVnniBit = 1u << 11;                                                     // leaf 7 ECX
constexpr uint32_t kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;                                // leaf 7 EDX
constexpr uint32_t kAvxVnniBit = 1u << 4, kAvx512Bf16 = 1u << 5;                            // leaf 7.1 EAX
constexpr uint64_t kYmm = 0x7, kZmm = 0xE7, kTiles = 0x60000;                               // XCR0

constexpr uint32_t kV3 = kFma | kOsxsave | kAvx | kF16c;  // x86-64-v3's leaf 1 (with AVX2 in leaf 7)

struct Case {
  const char* cpu;
  CpuId id;
  int best;
  bool runs[5];  // ref, avx2, avxvnni, vnni, amx
  bool vex;      // kAvxVnni by AVX-VNNI's VEX encoding
};

CpuId id(uint32_t ecx1, uint32_t ebx7, uint32_t ecx7, uint32_t edx7, uint32_t eax7_1, uint64_t xcr0, bool amx = false) {
  CpuId c;
  c.ecx1 = ecx1, c.ebx7 = ebx7, c.ecx7 = ecx7, c.edx7 = edx7, c.eax7_1 = eax7_1, c.xcr0 = xcr0, c.amx_granted = amx;
  return c;
}

const Case kCases[] = {
    {"Sandy Bridge (AVX, no AVX2)", id(kOsxsave | kAvx, 0, 0, 0, 0, kYmm), kRef, {1, 0, 0, 0, 0}, false},
    {"Haswell / Zen 2-3", id(kV3, kAvx2Bit, 0, 0, 0, kYmm), kAvx2, {1, 1, 0, 0, 0}, false},
    {"Haswell, the OS saving no ymm state", id(kV3, kAvx2Bit, 0, 0, 0, 0x3), kRef, {1, 0, 0, 0, 0}, false},
    {"Haswell bits without OSXSAVE", id(kV3 & ~kOsxsave, kAvx2Bit, 0, 0, 0, kYmm), kRef, {1, 0, 0, 0, 0}, false},
    {"Alder Lake / Meteor Lake / Arrow Lake", id(kV3, kAvx2Bit, 0, 0, kAvxVnniBit, kYmm), kAvxVnni, {1, 1, 1, 0, 0}, true},
    {"AVX-VNNI without AVX2 (no such CPU)", id(kV3, 0, 0, 0, kAvxVnniBit, kYmm), kRef, {1, 0, 0, 0, 0}, false},
    {"Zen 4 (this host)", id(kV3, kAvx2Bit | kF | kBw | kVl, kVnniBit, 0, kAvx512Bf16, kZmm), kVnni, {1, 1, 1, 1, 0}, false},
    {"Zen 4, the OS saving no zmm state", id(kV3, kAvx2Bit | kF | kBw | kVl, kVnniBit, 0, kAvx512Bf16, kYmm), kAvx2,
     {1, 1, 0, 0, 0}, false},
    {"Cascade Lake (AVX-512 VNNI, no AVX-VNNI)", id(kV3, kAvx2Bit | kF | kBw | kVl, kVnniBit, 0, 0, kZmm), kVnni,
     {1, 1, 1, 1, 0}, false},
    {"AVX-512 VNNI without VL (no such CPU)", id(kV3, kAvx2Bit | kF | kBw, kVnniBit, 0, 0, kZmm), kVnni, {1, 1, 0, 1, 0}, false},
    {"Skylake-X (AVX-512, no VNNI)", id(kV3, kAvx2Bit | kF | kBw | kVl, 0, 0, 0, kZmm), kAvx2, {1, 1, 0, 0, 0}, false},
    {"Zen 5 (AVX-512 and AVX-VNNI)", id(kV3, kAvx2Bit | kF | kBw | kVl, kVnniBit, 0, kAvxVnniBit | kAvx512Bf16, kZmm), kVnni,
     {1, 1, 1, 1, 0}, true},
    {"Sapphire Rapids, AMX granted", id(kV3, kAvx2Bit | kF | kBw | kVl, kVnniBit, kAmxTile | kAmxInt8, kAvxVnniBit, kZmm | kTiles, true),
     kAmx, {1, 1, 1, 1, 1}, true},
    {"Sapphire Rapids, AMX refused", id(kV3, kAvx2Bit | kF | kBw | kVl, kVnniBit, kAmxTile | kAmxInt8, kAvxVnniBit, kZmm | kTiles, false),
     kVnni, {1, 1, 1, 1, 0}, true},
    {"Sapphire Rapids, the OS saving no tile state", id(kV3, kAvx2Bit | kF | kBw | kVl, kVnniBit, kAmxTile | kAmxInt8, kAvxVnniBit, kZmm, true),
     kVnni, {1, 1, 1, 1, 0}, true},
};

int failures = 0;

void expect(bool ok, const char* cpu, const char* what) {
  if (!ok && failures++ < 10) std::fprintf(stderr, "isa_choice: %s: %s\n", cpu, what);
}

}  // namespace

int main() {
  int checks = 0;
  for (const Case& c : kCases) {
    const X86Forms f = x86_forms(c.id);
    const int best = best_form(f);
    expect(best == c.best, c.cpu, "best_isa's form");
    expect(f.avx_vnni == c.vex, c.cpu, "kAvxVnni's encoding (VEX only with AVX-VNNI)");
    expect(!f.avx_vnni || c.id.eax7_1 & kAvxVnniBit, c.cpu, "the VEX vpdpbusd without AVX-VNNI");
    expect(!(runs(f, kAvxVnni) && !f.avx_vnni) || (c.id.ebx7 & kVl && c.id.ecx7 & kVnniBit), c.cpu,
           "the EVEX vpdpbusd without AVX-512 VL + VNNI");
    checks += 3;
    for (int isa = kRef; isa <= kAmx; ++isa, ++checks) {
      expect(runs(f, isa) == c.runs[isa], c.cpu, kIsaNames[isa]);
      expect(best >= isa || !runs(f, isa), c.cpu, "a form it runs above the best");
      // SPECRT_KERNELS_ISA=<name>: that form where it is below the best and runs here, else the best
      const int want = isa <= best && runs(f, isa) ? isa : best;
      expect(lowered(best, kIsaNames[isa], [&](int i) { return runs(f, i); }) == want, c.cpu, "SPECRT_KERNELS_ISA's choice");
    }
    expect(lowered(best, "sse2", [&](int i) { return runs(f, i); }) == best, c.cpu, "an unknown name");
    expect(lowered(best, nullptr, [&](int i) { return runs(f, i); }) == best, c.cpu, "no SPECRT_KERNELS_ISA");
  }
  std::printf("isa_choice: %d CPUs, %d checks, %s\n", static_cast<int>(sizeof kCases / sizeof kCases[0]), checks,
              failures ? "WRONG answers" : "every answer as expected");
  return failures ? 1 : 0;
}
#endif
