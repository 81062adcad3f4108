// Uses the installed library through both of its interfaces on a simulated
// H200 (no GPU needed): the C++ API and the C ABI. Prints "consumer ok" and
// exits 0, or says what went wrong and exits 1.
#include <cstdio>
#include <exception>

#include "gvm/allocator.hpp"
#include "gvm/gvm.h"
#include "gvm/vmm/sim_driver.hpp"

static_assert(__cplusplus >= 202002L, "gvmalloc::gvmalloc must bring C++20 with it");

int main() {
  try {
    auto driver = gvm::vmm::SimDriver::uniform(gvm::vmm::Profile::h200, 1);
    gvm::Allocator allocator(*driver, gvm::Config{});
    void* p = allocator.allocate(1 << 20, 0, nullptr);
    allocator.deallocate(p, 1 << 20, 0, nullptr);
    if (allocator.device_stats(0).allocations != 1) {
      std::fprintf(stderr, "consumer: the C++ API counted no allocation\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  if (gvm_init_simulated("h200", 1, nullptr) != GVM_OK) {
    std::fprintf(stderr, "consumer: gvm_init_simulated: %s\n", gvm_last_error());
    return 1;
  }
  void* q = gvm_malloc(4096, 0, nullptr);
  const bool ok = q != nullptr && gvm_free(q, 4096, 0, nullptr) == GVM_OK;
  if (!ok) std::fprintf(stderr, "consumer: the C ABI failed: %s\n", gvm_last_error());
  gvm_shutdown();
  if (!ok) return 1;
  std::printf("consumer ok\n");
  return 0;
}
