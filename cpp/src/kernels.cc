#include "kernels.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

#include "error.h"

namespace specrt {

namespace fs = std::filesystem;

std::string find_kernels_library(const std::string& given) {
  std::string path = given;
  if (path.empty()) {
    const char* env = std::getenv("SPECRT_KERNELS");
    if (env && *env) path = env;
  }
  if (path.empty()) {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&find_kernels_library), &self) && self.dli_fname)
      path = (fs::path(self.dli_fname).parent_path() / "libspecrt_kernels.so").string();
  }
  return !path.empty() && fs::is_regular_file(path) ? path : "";
}

std::string kernels_isa(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) fail(SPECRT_ERR_UNSUPPORTED, "cannot load specrt's kernel library " + library + ": " + dlerror());
  using IsaFn = const char* (*)();
  auto isa = reinterpret_cast<IsaFn>(dlsym(lib, "specrt_kernels_isa"));
  std::string out = isa ? isa() : "";
  dlclose(lib);
  if (out.empty()) fail(SPECRT_ERR_UNSUPPORTED, library + " is not specrt's kernel library (no specrt_kernels_isa)");
  return out;
}

}  // namespace specrt
