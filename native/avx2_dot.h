// The AVX2 forms' u8 x s8 dot, and their entry points' names: one source (qmatmul_avx2.cc,
// qmatmul_ggml_avx2.cc, avx2_tile.h), three objects (Makefile):
//   (no SPECRT_AVXVNNI)  the AVX2 form (`avx2`): vpmaddubsw pairs summed in int16 (as many as
//                        cannot saturate), widened by vpmaddwd
//   SPECRT_AVXVNNI=1     the AVX-VNNI form (`avxvnni`, `-mavxvnni`): 256-bit vpdpbusd in its VEX
//                        encoding (Intel Alder Lake and later clients, AMD Zen 5), four u8 x s8
//                        products added into int32 a lane, no saturation
//   SPECRT_AVXVNNI=2     the same form with vpdpbusd in its EVEX encoding (AVX-512 VL + VNNI: the
//                        same results), so that the AVX-512 hosts, which lack AVX-VNNI, prove its
//                        bits and time it. Inline assembly in an object built for AVX2 alone: the
//                        compiler uses nothing else of AVX-512 (no ymm16-31, no other EVEX
//                        instruction), so the code is the VEX object's in another encoding.
// With vpdpbusd no sum saturates, so the integer dots need no grouping, 8-bit codes are taken as
// stored (no code - 128) and Q6_K's two sub-block dots are each one int32.
//
// Included only by AVX2 objects, with internal linkage.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace specrt {
namespace {

#if defined(SPECRT_AVXVNNI)
constexpr bool kDpbusd = true;
// acc + in each int32 lane the sum of its 4 products u[i] (u8) x s[i] (s8), exact
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if SPECRT_AVXVNNI == 2
  __asm__("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "xm"(s));
  return acc;
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
#else
constexpr bool kDpbusd = false;
inline __m256i dpbusd(__m256i acc, __m256i, __m256i) { return acc; }  // never called (if constexpr)
#endif

// The dot of n code vectors v (u8; vector j for k = 4j .. 4j + 3) with a row's int8 activations q
// (4 a column), exact: in two chains (even and odd j), so that one row's dots are not bound by
// vpdpbusd's latency (4-5 cycles, against vpaddw's 1 in the AVX2 form)
inline __m256i dpbusd_dot(const __m256i* v, const int32_t* q, int n) {
  __m256i a = _mm256_setzero_si256(), b = a;
  for (int j = 0; j + 1 < n; j += 2)
    a = dpbusd(a, v[j], _mm256_set1_epi32(q[j])), b = dpbusd(b, v[j + 1], _mm256_set1_epi32(q[j + 1]));
  if (n % 2) a = dpbusd(a, v[n - 1], _mm256_set1_epi32(q[n - 1]));
  return _mm256_add_epi32(a, b);
}

}  // namespace
}  // namespace specrt

// name_avx2, name_avxvnni or name_avxvnni_evex: the entry point of the object being built
#if !defined(SPECRT_AVXVNNI)
#define SPECRT_AVX2_FORM(name) name##_avx2
#elif SPECRT_AVXVNNI == 2
#define SPECRT_AVX2_FORM(name) name##_avxvnni_evex
#else
#define SPECRT_AVX2_FORM(name) name##_avxvnni
#endif
