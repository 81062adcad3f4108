#include "gvm/vmm/driver.hpp"

namespace gvm::vmm {

const char* call_name(Call c) noexcept {
  switch (c) {
#define GVM_VMM_NAME(name, cu_name) \
  case Call::name:                  \
    return cu_name;
    GVM_VMM_DRIVER_CALLS(GVM_VMM_NAME)
#undef GVM_VMM_NAME
    case Call::count_: break;
  }
  return "?";
}

}  // namespace gvm::vmm
