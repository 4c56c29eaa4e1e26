#include "session.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace specrt {

Ort::Env& ort_env() {
  static Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "specrt");
  return env;
}

Ort::SessionOptions session_options(const SessionConfig& config) {
  Ort::SessionOptions so;
  int threads = config.threads > 0 ? config.threads : static_cast<int>(std::thread::hardware_concurrency());
  so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
  so.SetExecutionMode(ExecutionMode::ORT_SEQUENTIAL);
  // onnxruntime caches an allocation plan per distinct set of input shapes; the bundle graph's
  // attention_mask grows with the context, so that cache would grow with every new length
  // (docs/cpp.md, "Memory")
  so.DisableMemPattern();
  so.SetLogSeverityLevel(3);
  so.SetIntraOpNumThreads(threads > 0 ? threads : 1);
  so.SetInterOpNumThreads(1);
  so.AddConfigEntry("session.force_spinning_stop", "1");
  so.AddConfigEntry("session.intra_op.allow_spinning", "1");
  so.AddConfigEntry("session.prepack.enable_parallel", "0");
  if (!config.kernels_library.empty()) so.RegisterCustomOpsLibrary(config.kernels_library.c_str());
  return so;
}

namespace {
constexpr uintptr_t kHuge = uintptr_t(2) << 20;
constexpr int kMadvCollapse = 25;
}  // namespace

std::set<uintptr_t> anonymous_pages() {
  std::set<uintptr_t> pages;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, path;
    in >> range >> perms >> offset >> dev >> inode;
    std::getline(in, path);
    auto first = path.find_first_not_of(' ');
    path = first == std::string::npos ? "" : path.substr(first);
    if (perms.size() < 4 || perms[0] != 'r' || perms[1] != 'w' || perms[3] != 'p') continue;
    if (!path.empty() && path.rfind("[heap", 0) != 0) continue;  // file-backed or special
    auto dash = range.find('-');
    uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16), hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    for (uintptr_t p = (lo + kHuge - 1) / kHuge; p < hi / kHuge; ++p) pages.insert(p);
  }
  return pages;
}

size_t collapse_pages(const std::set<uintptr_t>& pages, double budget_s) {
  size_t done = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(budget_s);
  bool first = true;
  for (uintptr_t p : pages) {
    if (std::chrono::steady_clock::now() > deadline) break;
    if (madvise(reinterpret_cast<void*>(p * kHuge), kHuge, kMadvCollapse) == 0) {
      done += kHuge;
    } else if (first && errno == EINVAL) {
      return 0;  // the kernel lacks MADV_COLLAPSE
    }
    first = false;
  }
  return done;
}

}  // namespace specrt
