// StickyDriver: a SimDriver seen through a context that dies on cue.
//
// SimDriver's fail_call() makes one call fail and changes nothing else; a
// real sticky error (launch_failed, illegal_address) makes every later call
// fail too. StickyDriver forwards every call to the SimDriver until the k-th
// call of one entry point after arm(); that call and every call after it
// return `result` without reaching the simulator, until revive(). The
// simulator's own bookkeeping (live counters) stays truthful, so a leak left
// by the allocator's reaction to the dead context shows once revived.
#pragma once

#include "gvm/vmm/forwarding_driver.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {

class StickyDriver final : public vmm::ForwardingDriver {
 public:
  explicit StickyDriver(vmm::SimDriver& sim) : ForwardingDriver(sim) {}

  // From now on, the k-th call (1 = the next) of `call` kills the context.
  void arm(vmm::Call call, int k, vmm::Result result) {
    trigger_ = call;
    remaining_ = k;
    result_ = result;
    armed_ = true;
  }
  void revive() { armed_ = dead_ = false; }
  bool dead() const { return dead_; }

  const char* name() const noexcept override { return "sim-sticky"; }

 protected:
  vmm::Result intercept(vmm::Call call, vmm::ForwardedCall forward) override {
    if (dead_) return result_;
    if (armed_ && call == trigger_ && --remaining_ == 0) {
      dead_ = true;
      return result_;
    }
    return forward();
  }

 private:
  vmm::Call trigger_ = vmm::Call::count_;
  int remaining_ = 0;
  vmm::Result result_ = vmm::Result::launch_failed;
  bool armed_ = false;
  bool dead_ = false;
};

}  // namespace gvm::test
