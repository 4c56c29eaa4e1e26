// onnxruntime sessions as the Python runtime builds them (runtime/backends/ort.py
// `session_options`), and the 2 MiB-page move after loading (runtime/bundle/hugepages.py).
#pragma once

#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <set>
#include <string>

namespace specrt {

struct SessionConfig {
  int threads = 0;              // intra-op threads (0: every core)
  std::string kernels_library;  // libspecrt_kernels.so to register ("" = none)
};

// The process's onnxruntime environment (one for every handle; onnxruntime keeps one anyway).
Ort::Env& ort_env();

// Draft and target sessions alternate on the same cores: each has its own pool whose workers
// spin (they pick up the next kernel without a wake-up) and stop spinning when a run ends, so
// the idle session does not steal the cores. Prepacking is serial (docs/design.md).
Ort::SessionOptions session_options(const SessionConfig& config);

// 2 MiB-aligned page numbers fully inside private anonymous read-write mappings.
std::set<uintptr_t> anonymous_pages();
// madvise(MADV_COLLAPSE) on each page, for at most budget_s seconds -> bytes collapsed (0 where
// the kernel cannot).
size_t collapse_pages(const std::set<uintptr_t>& pages, double budget_s = 3.0);

}  // namespace specrt
