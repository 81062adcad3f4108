// Which device profile this binary runs the shared AllocatorSuite under: one
// binary per profile (GVM_SUITE_PROFILE, set in CMakeLists.txt), so that
// `ctest -L profile-<name>` selects it.
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {
extern const vmm::Profile kSuiteProfile;
const vmm::Profile kSuiteProfile = vmm::Profile::GVM_SUITE_PROFILE;
}  // namespace gvm::test
