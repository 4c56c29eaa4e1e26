/* Peak int8 multiply-accumulate rates of one core: AVX-512 VNNI (vpdpbusd) and AMX (tdpbusd),
 * independent accumulators, no memory traffic (docs/benchmarks.md §26).
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vnni -mamx-tile -mamx-int8 tools/isa_peak.c -o /tmp/isa_peak && /tmp/isa_peak
 * AMX runs only where Linux grants it (arch_prctl ARCH_REQ_XCOMP_PERM); elsewhere it is skipped. */
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
  __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
  __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
  long n = 100000000;
  double t = now();
  for (long i = 0; i < n; ++i) {  /* 8 independent chains in registers */
    c0 = _mm512_dpbusd_epi32(c0, a, b), c1 = _mm512_dpbusd_epi32(c1, a, b);
    c2 = _mm512_dpbusd_epi32(c2, a, b), c3 = _mm512_dpbusd_epi32(c3, a, b);
    c4 = _mm512_dpbusd_epi32(c4, a, b), c5 = _mm512_dpbusd_epi32(c5, a, b);
    c6 = _mm512_dpbusd_epi32(c6, a, b), c7 = _mm512_dpbusd_epi32(c7, a, b);
  }
  t = now() - t;
  int r[16];
  __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                               _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
  _mm512_storeu_si512(r, s);
  printf("AVX-512 VNNI: %.0f GMAC/s per core (%d)\n", n * 8.0 * 64 / t / 1e9, r[0]);
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    printf("AMX: not granted here\n");
    return 0;
  }
  struct { unsigned char palette, start, res[14]; unsigned short colsb[16]; unsigned char rows[16]; } cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; ++i) cfg.colsb[i] = 64, cfg.rows[i] = 16;
  _tile_loadconfig(&cfg);
  static char A[16 * 64], B[16 * 64];
  static int C[16 * 16];
  memset(A, 1, sizeof A), memset(B, 1, sizeof B);
  _tile_loadd(4, A, 64);
  _tile_loadd(5, B, 64);
  _tile_loadd(6, A, 64);
  _tile_loadd(7, B, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  long m = 10000000;
  t = now();
  for (long i = 0; i < m; ++i) {
    _tile_dpbusd(0, 4, 5);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 6, 5);
    _tile_dpbusd(3, 6, 7);
  }
  t = now() - t;
  _tile_stored(0, C, 64);
  _tile_release();
  printf("AMX: %.0f GMAC/s per core (%d)\n", m * 4.0 * 16 * 16 * 64 / t / 1e9, C[0]);
  return 0;
}
