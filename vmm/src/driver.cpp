#include "gvm/vmm/driver.hpp"

#include <type_traits>

#include "gvm/vmm/forwarding_driver.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace gvm::vmm {

// The forwarding base forwards every entry point (else it would be abstract).
static_assert(!std::is_abstract_v<ForwardingDriver>);

const char* call_name(Call c) noexcept {
  switch (c) {
#define GVM_VMM_NAME(name, cu_name, params, args) \
  case Call::name:                                \
    return cu_name;
    GVM_VMM_DRIVER_CALLS(GVM_VMM_NAME)
    GVM_VMM_TEST_CALLS(GVM_VMM_NAME)
#undef GVM_VMM_NAME
    case Call::count_: break;
  }
  return "?";
}

}  // namespace gvm::vmm
