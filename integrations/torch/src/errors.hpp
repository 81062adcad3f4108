// gvmalloc's errors as PyTorch's: every failure leaves the backend as a
// c10::Error (RuntimeError in Python) whose message starts with "gvmalloc:",
// except running out of memory, which is c10::OutOfMemoryError
// (torch.OutOfMemoryError) and raised where the facts for its message are.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace gvm::torch_backend {

[[noreturn]] inline void fail(const std::string& message) {
  TORCH_CHECK(false, message);
  throw std::logic_error("unreachable");  // TORCH_CHECK(false) has thrown
}

// Runs f(); a gvmalloc or standard exception becomes a c10::Error saying
// what was being done. c10 errors pass through unchanged.
template <class F>
auto torch_errors(const char* doing, F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    // gvmalloc's own messages already start with "gvmalloc".
    if (what.rfind("gvmalloc", 0) == 0) fail(what);
    fail(std::string("gvmalloc: ") + doing + ": " + what);
  }
}

}  // namespace gvm::torch_backend
