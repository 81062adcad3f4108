// Peer policy: how `peer` may reach memory of `owner`, per ordered pair.
//
//   per_allocation  VMM on both, compute capability >= 8.0 on both, and
//                   cuDeviceCanAccessPeer: only the owner's scratch buffer is
//                   granted to the peer (cuMemSetAccess per chunk).
//   global          a P2P path but compute capability < 8.0 (Tesla P40, V100,
//                   T4): the driver emulates per-range peer access there and
//                   it behaves like the global toggle, so context peer access
//                   is enabled once, behind the fence, and never toggled while
//                   work may be in flight. VMM scratch chunks are still granted
//                   with cuMemSetAccess, which VMM memory needs in any mode.
//   none            no P2P path: copies are staged by the driver, no access
//                   change at all.
#pragma once

#include "gvm/config.hpp"
#include "gvm/vmm/device_caps.hpp"

namespace gvm::detail {

// The automatic choice for `peer` reaching `owner`'s memory.
PeerPolicy choose_peer_policy(const vmm::DeviceCaps& owner, const vmm::DeviceCaps& peer);

// `requested` (from the config or set_peer_policy) where the pair can have
// it; automatic means choose_peer_policy. Without a P2P path the answer is
// always none. Forcing per_allocation or global on a pair with a P2P path is
// allowed (global on Ampere+ is how the pre-Ampere path is tested on real
// hardware); per_allocation needs VMM on the owner, else global.
PeerPolicy effective_peer_policy(PeerPolicy requested, const vmm::DeviceCaps& owner,
                                 const vmm::DeviceCaps& peer);

}  // namespace gvm::detail
