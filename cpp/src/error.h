// The library's one exception type: a specrt_status and a message. Everything inside throws it
// (or lets onnxruntime's and the standard library's exceptions through); the C API (c_api.cc)
// turns each into a status and the thread's last-error message, so nothing leaves the library
// as an exception or an abort.
#pragma once

#include <stdexcept>
#include <string>

#include "specrt.h"

namespace specrt {

class Error : public std::runtime_error {
 public:
  Error(specrt_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  specrt_status status() const { return status_; }

 private:
  specrt_status status_;
};

[[noreturn]] inline void fail(specrt_status status, const std::string& message) { throw Error(status, message); }

}  // namespace specrt
