// Simulated time: what each driver call would have cost on a GPU, so a
// replay on the simulator can say where the driver time goes (SimDriver::
// simulated_ns). Nothing waits for it; it is only added up, per call.
//
// The figures are the medians measured on one H200 for 2 MiB in
// docs/measurements.md ("Driver calls"); a call with no figure costs 0 here
// rather than a guess. Costs do not grow with the size of the call.
#pragma once

#include <cstdint>

#include "gvm/vmm/driver.hpp"

namespace gvm::vmm::sim {

inline constexpr std::uint64_t kUs = 1000;

// cudaDeviceEnablePeerAccess: 9-12 ms per direction with 2 GiB of cudaMalloc
// memory live. Disabling was not measured: taken as the same.
inline constexpr std::uint64_t kPeerToggleNs = 10'500 * kUs;
// cuMemSetAccess over 2 MiB: owner and one peer, first grant, 1.0 ms; a
// PROT_NONE revoke of a peer 58 us (measured over 1 GiB); owner only, 42-714
// us over 2 MiB (no stable median), 138-147 us over 64 MiB: 140 us.
inline constexpr std::uint64_t kPeerGrantNs = 1'000 * kUs;
inline constexpr std::uint64_t kPeerRevokeNs = 58 * kUs;
inline constexpr std::uint64_t kOwnerAccessNs = 140 * kUs;

// The cost of one call of `c` that is not cuMemSetAccess (whose cost depends
// on what it changes: SimDriver::mem_set_access charges it).
constexpr std::uint64_t call_cost_ns(Call c) noexcept {
  switch (c) {
    case Call::address_reserve: return 2'700;     // 1 TiB: 2.7 us
    case Call::address_free: return 3'100;        // 3.1 us
    case Call::mem_create: return 16 * kUs;       // 13-19 us
    case Call::mem_map: return 1'500;             // 1-2 us
    case Call::mem_unmap: return 58 * kUs;        // 48-69 us
    case Call::mem_release: return 64 * kUs;      // 22-206 us over 2 MiB; 61-67 us over 64 MiB
    case Call::mem_alloc: return 71 * kUs;        // cudaMalloc 2 MiB
    case Call::mem_free: return 53 * kUs;         // cudaFree 2 MiB
    case Call::enable_peer_access: return kPeerToggleNs;
    case Call::disable_peer_access: return kPeerToggleNs;
    default: return 0;
  }
}

// Per-range peer access on a GPU below compute capability 8.0 (P40, V100,
// T4) is emulated by the driver and behaves like the global peer toggle
// (docs/peer-access.md, "The policy"): a cuMemSetAccess
// that changes a peer's access costs a toggle per changed peer and races
// in-flight peer work the way cuCtxDisablePeerAccess does.
constexpr bool emulates_peer_access(int cc_major) noexcept {
  return cc_major < 8;
}

}  // namespace gvm::vmm::sim
