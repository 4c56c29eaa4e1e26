// The x86 forms this CPU runs: isa.h's decision over its own cpuid and xgetbv, AMX's tile state
// asked of the kernel where the rest says AMX. One reading for the library (ort_ops.cc) and the
// C++ forms check (tests/native/kernel_forms.cc).
#pragma once
#if !defined(__aarch64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

#include "isa.h"

namespace specrt {

inline uint64_t xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return static_cast<uint64_t>(hi) << 32 | lo;
}

inline X86Forms cpu_forms() {
  CpuId id;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return x86_forms(id);
  id.ecx1 = c;
  if (c & (1u << 27)) id.xcr0 = xcr0();  // OSXSAVE: xgetbv exists
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    id.ebx7 = b, id.ecx7 = c, id.edx7 = d;
    if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) id.eax7_1 = a;
  }
  // AMX's tile data must be asked of the kernel (once a process: asking again is harmless)
  CpuId asked = id;
  asked.amx_granted = true;
  if (x86_forms(asked).amx)
    id.amx_granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return x86_forms(id);
}

}  // namespace specrt
#endif
