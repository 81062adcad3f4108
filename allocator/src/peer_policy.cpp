#include "peer_policy.hpp"

namespace gvm::detail {
namespace {

bool can_reach(const vmm::DeviceCaps& owner, const vmm::DeviceCaps& peer) {
  // cuDeviceCanAccessPeer(peer, owner): can `peer` access `owner`'s memory.
  const auto o = static_cast<std::size_t>(owner.device);
  return owner.device != peer.device && o < peer.can_access_peer.size() && peer.can_access_peer[o];
}

}  // namespace

PeerPolicy choose_peer_policy(const vmm::DeviceCaps& owner, const vmm::DeviceCaps& peer) {
  if (!can_reach(owner, peer)) return PeerPolicy::none;
  if (owner.vmm && peer.vmm && owner.cc_major >= 8 && peer.cc_major >= 8)
    return PeerPolicy::per_allocation;
  return PeerPolicy::global;
}

PeerPolicy effective_peer_policy(PeerPolicy requested, const vmm::DeviceCaps& owner,
                                 const vmm::DeviceCaps& peer) {
  if (!can_reach(owner, peer)) return PeerPolicy::none;
  switch (requested) {
    case PeerPolicy::automatic: return choose_peer_policy(owner, peer);
    case PeerPolicy::per_allocation: return owner.vmm ? PeerPolicy::per_allocation : PeerPolicy::global;
    case PeerPolicy::global: return PeerPolicy::global;
    case PeerPolicy::none: return PeerPolicy::none;
  }
  return PeerPolicy::none;
}

}  // namespace gvm::detail
