// The C API's boundary: `guard(body)` runs body, turning every exception into a specrt_status
// and this thread's last-error message (specrt_last_error), so nothing leaves the library as an
// exception or an abort.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <new>
#include <string>

#include "error.h"
#include "specrt.h"

namespace specrt {

inline std::string& last_error() {
  thread_local std::string message;
  return message;
}

template <typename F>
specrt_status guard(F&& body) {
  auto set = [](specrt_status status, const std::string& message) {
    last_error() = message;
    return status;
  };
  last_error().clear();
  try {
    body();
    return SPECRT_OK;
  } catch (const Error& e) {
    return set(e.status(), e.what());
  } catch (const Ort::Exception& e) {
    return set(SPECRT_ERR_RUNTIME, std::string("onnxruntime: ") + e.what());
  } catch (const std::bad_alloc&) {
    return set(SPECRT_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return set(SPECRT_ERR_INTERNAL, e.what());
  } catch (...) {
    return set(SPECRT_ERR_INTERNAL, "unknown exception");
  }
}

}  // namespace specrt
