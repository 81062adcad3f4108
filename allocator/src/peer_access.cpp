// gvm::Allocator: the peer scratch buffers, the peer policy and peer copies.
//
// Peer access is granted to one scratch reservation per device and to
// nothing else; every change of who may touch it (a grant, a revoke, a
// context peer-access toggle) happens behind the fence (fence.hpp).
#include <algorithm>
#include <string>

#include "allocator_impl.hpp"

namespace gvm {

void Allocator::Impl::init_peer_policy() {
  requested_policy_ = config_.peer_policy;
  const std::size_t n = caps_.size();
  for (std::size_t o = 0; o < n; ++o)
    for (std::size_t p = 0; p < n; ++p)
      policy_[o * n + p] =
          o == p ? PeerPolicy::none : detail::effective_peer_policy(requested_policy_, caps_[o], caps_[p]);
}

std::vector<vmm::AccessDesc> Allocator::Impl::scratch_access(int owner) const {
  std::vector<vmm::AccessDesc> access{{owner, vmm::Access::read_write}};
  for (int p = 0; p < static_cast<int>(caps_.size()); ++p) {
    const PeerPolicy pol = policy(owner, p);
    // VMM memory needs a grant whatever the policy; `global` adds the
    // context toggle for classic memory and for the pre-Ampere driver.
    if (pol == PeerPolicy::per_allocation || pol == PeerPolicy::global)
      access.push_back({p, vmm::Access::read_write});
  }
  return access;
}

void Allocator::Impl::enable_global(int peer, int owner) {
  char& state = global_enabled_[static_cast<std::size_t>(peer) * caps_.size() +
                                static_cast<std::size_t>(owner)];
  if (state != 0) return;
  // Enabled once, and only with both devices drained: a toggle is not
  // ordered with transfers in flight (MEASUREMENTS.md, 20 of 20 failures).
  fence_.wait_devices({peer, owner});
  const vmm::Result r = driver_.enable_peer_access(peer, owner);
  if (r == vmm::Result::peer_access_already_enabled) {
    state = 2;  // the runtime (or the application) did it; never ours to undo
    return;
  }
  if (r != vmm::Result::success)
    throw vmm::DriverError(r, "cuCtxEnablePeerAccess(device " + std::to_string(peer) +
                                  " -> device " + std::to_string(owner) + ")");
  state = 1;
}

detail::DeviceHeap& Allocator::Impl::scratch(int device) {
  if (auto* h = existing_scratch(device); h != nullptr) return *h;
  std::lock_guard<std::mutex> guard(policy_lock_);
  auto& slot = owned_scratch_[static_cast<std::size_t>(device)];
  if (!slot) {
    for (int p = 0; p < static_cast<int>(caps_.size()); ++p)
      if (policy(device, p) == PeerPolicy::global) enable_global(p, device);
    slot = std::make_unique<detail::DeviceHeap>(driver_, caps_[static_cast<std::size_t>(device)],
                                                config_, fence_, detail::DeviceHeap::Kind::scratch,
                                                scratch_access(device));
    scratch_[static_cast<std::size_t>(device)].store(slot.get(), std::memory_order_release);
  }
  return *slot;
}

detail::DeviceHeap* Allocator::Impl::heap_holding(int device, std::uintptr_t addr) const {
  if (auto* h = existing_heap(device); h != nullptr && h->owns(addr)) return h;
  if (auto* h = existing_scratch(device); h != nullptr && h->owns(addr)) return h;
  return nullptr;
}

void Allocator::Impl::check_copy_side(std::uintptr_t addr, std::size_t bytes, int device,
                                      const char* side) const {
  // Memory gvmalloc did not hand out is the caller's business; a range in
  // gvmalloc's memory must lie inside one live block of the named device. A
  // copy that runs past its block reaches unmapped memory (or another
  // block): on the device that is an illegal address, which kills the
  // context for every stream, so it is refused here.
  const int owner = owner_of(addr);
  if (owner < 0) return;
  const auto say = [&](const std::string& why) {
    throw usage_error("gvmalloc: peer_copy(" + std::to_string(bytes) + " bytes): the " + side +
                      " " + std::to_string(addr) + " " + why);
  };
  if (owner != device)
    say("belongs to device " + std::to_string(owner) + ", not device " + std::to_string(device));
  // kAbsurdBytes first: addr + bytes must not wrap in the block test.
  if (bytes > detail::kAbsurdBytes || !heap_holding(owner, addr)->is_live_block(addr, bytes))
    say("is not inside one live block for the whole range");
}

void* Allocator::scratch_allocate(std::size_t bytes, int device, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  im.check_device(device, "scratch_allocate");
  if (bytes == 0)
    throw usage_error("gvmalloc: scratch_allocate(0 bytes) on device " + std::to_string(device) +
                      ": a block must have at least 1 byte");
  if (bytes > detail::kAbsurdBytes)
    throw usage_error("gvmalloc: scratch_allocate(" + std::to_string(bytes) + " bytes) on device " +
                      std::to_string(device) +
                      ": not a size any GPU can hold (a negative size converted to unsigned?)");
  if (bytes > im.caps_[static_cast<std::size_t>(device)].total_memory)
    throw out_of_memory("gvmalloc: out of memory on device " + std::to_string(device) +
                        ": scratch_allocate(" + detail::format_bytes(bytes) +
                        ") is more than the device's memory");
  return im.scratch(device).allocate_large(bytes, stream);
}

void Allocator::scratch_deallocate(void* ptr, std::size_t bytes, int device,
                                   vmm::StreamHandle stream) {
  deallocate(ptr, bytes, device, stream);
}

void Allocator::record_stream(void* ptr, vmm::StreamHandle stream, int stream_device) {
  Impl& im = *impl_;
  im.check_device(stream_device, "record_stream");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  for (int d = 0; d < device_count(); ++d) {
    detail::DeviceHeap* h = im.heap_holding(d, addr);
    if (h == nullptr) continue;
    if (d == stream_device) {
      h->record_stream(addr, stream);
    } else {
      h->note_use(addr, detail::StreamRef{stream_device, stream});
    }
    return;
  }
  throw usage_error("gvmalloc: record_stream(" + std::to_string(addr) +
                    "): not a pointer gvmalloc gave out");
}

PeerPolicy Allocator::peer_policy(int owner, int peer) const {
  impl_->check_device(owner, "peer_policy");
  impl_->check_device(peer, "peer_policy");
  std::lock_guard<std::mutex> guard(impl_->policy_lock_);
  return impl_->policy(owner, peer);
}

void Allocator::set_peer_policy(PeerPolicy requested) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> guard(im.policy_lock_);
  const std::size_t n = im.caps_.size();
  std::vector<PeerPolicy> next(n * n, PeerPolicy::none);
  for (std::size_t o = 0; o < n; ++o)
    for (std::size_t p = 0; p < n; ++p)
      if (o != p) next[o * n + p] = detail::effective_peer_policy(requested, im.caps_[o], im.caps_[p]);
  im.requested_policy_ = requested;
  if (next == im.policy_) return;

  // The fence, before anything changes: every device that may touch a
  // scratch buffer now (the owners and their current peers), or - with
  // scratch_fence:tracked - the streams known to have used them.
  std::vector<int> devices;
  std::vector<detail::StreamRef> streams;
  bool whole_devices = false;
  auto add_device = [&](int d) {
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  };
  for (std::size_t o = 0; o < n; ++o) {
    for (std::size_t p = 0; p < n; ++p) {
      if (next[o * n + p] == im.policy_[o * n + p]) continue;
      if (im.policy_[o * n + p] == PeerPolicy::global) {
        // A global toggle acts on the whole context: drain both devices.
        whole_devices = true;
        add_device(static_cast<int>(o));
        add_device(static_cast<int>(p));
      }
    }
    detail::DeviceHeap* h = im.existing_scratch(static_cast<int>(o));
    if (h == nullptr) continue;
    for (const auto& a : h->access()) add_device(a.device);
    bool heap_whole = false;
    for (const auto& r : h->streams_touching(&heap_whole)) streams.push_back(r);
    whole_devices = whole_devices || heap_whole;
  }
  if (whole_devices) {
    im.fence_.wait_devices(devices);
  } else {
    im.fence_.wait(streams);
  }

  // Context toggles leaving `global` (only those this allocator made).
  for (std::size_t o = 0; o < n; ++o) {
    for (std::size_t p = 0; p < n; ++p) {
      char& state = im.global_enabled_[p * n + o];
      if (im.policy_[o * n + p] == PeerPolicy::global && next[o * n + p] != PeerPolicy::global &&
          state == 1) {
        const vmm::Result r = im.driver_.disable_peer_access(static_cast<int>(p), static_cast<int>(o));
        if (r != vmm::Result::success && r != vmm::Result::peer_access_not_enabled)
          throw vmm::DriverError(r, "cuCtxDisablePeerAccess(device " + std::to_string(p) +
                                        " -> device " + std::to_string(o) + ")");
        state = 0;
      }
    }
  }
  im.policy_ = next;
  for (std::size_t o = 0; o < n; ++o) {
    detail::DeviceHeap* h = im.existing_scratch(static_cast<int>(o));
    if (h == nullptr) continue;
    for (std::size_t p = 0; p < n; ++p)
      if (im.policy(static_cast<int>(o), static_cast<int>(p)) == PeerPolicy::global)
        im.enable_global(static_cast<int>(p), static_cast<int>(o));
    h->set_access(im.scratch_access(static_cast<int>(o)));
  }
}

void Allocator::peer_copy(void* dst, int dst_device, const void* src, int src_device,
                          std::size_t bytes, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  im.check_device(dst_device, "peer_copy");
  im.check_device(src_device, "peer_copy");
  if (bytes == 0) return;
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  im.check_copy_side(s, bytes, src_device, "source");
  im.check_copy_side(d, bytes, dst_device, "destination");
  vmm::Result r;
  const char* call = "cuMemcpyAsync";  // named in the message
  if (src_device == dst_device) {
    r = im.driver_.memcpy_async(dst_device, d, s, bytes, stream);
  } else {
    // Direct when dst_device (whose stream runs the copy) was let into the
    // source: it lies in src_device's scratch and the pair's policy grants it.
    bool direct = false;
    {
      std::lock_guard<std::mutex> guard(im.policy_lock_);
      const PeerPolicy pol = im.policy(src_device, dst_device);
      detail::DeviceHeap* sh = im.existing_scratch(src_device);
      direct = pol != PeerPolicy::none && sh != nullptr && sh->is_live_block(s, bytes);
    }
    if (direct) {
      im.existing_scratch(src_device)->note_use(s, detail::StreamRef{dst_device, stream});
      r = im.driver_.memcpy_async(dst_device, d, s, bytes, stream);
    } else {
      call = "cuMemcpyPeerAsync";
      r = im.driver_.memcpy_peer_async(d, dst_device, s, src_device, bytes, stream);
    }
  }
  if (r != vmm::Result::success)
    throw vmm::DriverError(r, std::string(call) + " in peer_copy(" + std::to_string(bytes) +
                                  " bytes, device " +
                                  std::to_string(src_device) + " -> " +
                                  std::to_string(dst_device) + ")");
}

bool Allocator::is_peer_copy_direct(const void* src, int src_device, int dst_device) const {
  Impl& im = *impl_;
  im.check_device(dst_device, "is_peer_copy_direct");
  im.check_device(src_device, "is_peer_copy_direct");
  std::lock_guard<std::mutex> guard(im.policy_lock_);
  detail::DeviceHeap* sh = im.existing_scratch(src_device);
  return src_device != dst_device && im.policy(src_device, dst_device) != PeerPolicy::none &&
         sh != nullptr && sh->is_live_block(reinterpret_cast<std::uintptr_t>(src), 1);
}

}  // namespace gvm
