// HookDriver: forwards every call to another Driver, first running a hook
// with the call's name. Tests use it to stop a thread at an exact point (a
// driver call another thread's work must interleave with) without timing
// luck. Every hook runs on the calling thread, outside any lock of the
// driver underneath.
#pragma once

#include <functional>
#include <utility>

#include "gvm/vmm/forwarding_driver.hpp"

namespace gvm::test {

class HookDriver final : public vmm::ForwardingDriver {
 public:
  using ForwardingDriver::ForwardingDriver;
  // Runs before each call (nullptr: none). Set before other threads call.
  void set_hook(std::function<void(vmm::Call)> hook) { hook_ = std::move(hook); }

 protected:
  vmm::Result intercept(vmm::Call call, vmm::ForwardedCall forward) override {
    if (hook_) hook_(call);
    return forward();
  }

 private:
  std::function<void(vmm::Call)> hook_;
};

}  // namespace gvm::test
