// ForwardingDriver: a Driver that passes every call to another one, generated
// from GVM_VMM_DRIVER_CALLS. A decorator derives from it and overrides only
// what it changes: one entry point (calling ForwardingDriver's to go on), or
// intercept(), which every forwarded call passes through (to count, time or
// fail calls wholesale; CountingDriver does).
#pragma once

#include <type_traits>
#include <utility>

#include "gvm/vmm/driver.hpp"

namespace gvm::vmm {

// A non-owning reference to the call intercept() may make: forward() runs it
// on the inner driver. Two words, no allocation (std::function could allocate
// on a path that runs per driver call).
class ForwardedCall {
 public:
  template <class F>
  explicit ForwardedCall(F& f) noexcept
      : object_(&f), run_([](void* o) { return (*static_cast<F*>(o))(); }) {}
  Result operator()() const { return run_(object_); }

 private:
  void* object_;
  Result (*run_)(void*);
};

class ForwardingDriver : public Driver {
 public:
  // `inner` must outlive this object.
  explicit ForwardingDriver(Driver& inner) noexcept : inner_(inner) {}

  Driver& inner() const noexcept { return inner_; }
  const char* name() const noexcept override { return inner_.name(); }

#define GVM_VMM_FORWARD(name, cu_name, params, args)   \
  Result name params override {                        \
    auto call = [&] { return inner_.name args; };      \
    return intercept(Call::name, ForwardedCall(call)); \
  }
  GVM_VMM_DRIVER_CALLS(GVM_VMM_FORWARD)
#undef GVM_VMM_FORWARD

 protected:
  // Every forwarded call: `call` names it, forward() makes it. The default
  // just forwards; an override may act before and after, or answer without
  // forwarding.
  virtual Result intercept(Call call, ForwardedCall forward) {
    (void)call;
    return forward();
  }

 private:
  Driver& inner_;
};

}  // namespace gvm::vmm
