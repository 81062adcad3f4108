// gvm::Allocator: the C++ API - argument checks, then the stream's heap (the
// cached paths) or the device heap and the peer-access part.
#include "gvm/allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "allocator_impl.hpp"
#include "peer_policy.hpp"

namespace gvm {
namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::vector<detail::StreamRegistry*> raw(const std::vector<std::unique_ptr<detail::StreamRegistry>>& v) {
  std::vector<detail::StreamRegistry*> out;
  for (const auto& r : v) out.push_back(r.get());
  return out;
}

// The least memory of any device (the hot path's one compare; with no device
// every call is refused before it, by check_device).
std::size_t smallest_memory(const std::vector<vmm::DeviceCaps>& caps) {
  std::size_t least = std::numeric_limits<std::size_t>::max();
  for (const vmm::DeviceCaps& c : caps) least = std::min(least, c.total_memory);
  return least;
}

std::vector<std::unique_ptr<detail::StreamRegistry>> make_registries(std::size_t n) {
  std::vector<std::unique_ptr<detail::StreamRegistry>> out;
  for (std::size_t d = 0; d < n; ++d)
    out.push_back(std::make_unique<detail::StreamRegistry>(static_cast<int>(d)));
  return out;
}

// The devices as the peer policy sees them: vmm is what gvmalloc really uses
// (with no_vmm the scratch is cuMemAlloc memory, which only context peer
// access reaches).
std::vector<vmm::DeviceCaps> policy_caps(std::vector<vmm::DeviceCaps> caps, const Config& c) {
  if (c.force_no_vmm)
    for (auto& x : caps) x.vmm = false;
  return caps;
}

void check_size(std::size_t bytes, int device, const char* what) {
  if (bytes == 0)
    throw usage_error(std::string("gvmalloc: ") + what + "(0 bytes) on device " +
                      std::to_string(device) + ": a block must have at least 1 byte");
  if (bytes > detail::kAbsurdBytes)
    throw usage_error(std::string("gvmalloc: ") + what + "(" + std::to_string(bytes) +
                      " bytes) on device " + std::to_string(device) +
                      ": not a size any GPU can hold (a negative size converted to unsigned?)");
}

}  // namespace

// ------------------------------------------------------------------ Impl --

Allocator::Impl::Impl(vmm::Driver& driver, Config config)
    : driver_(driver),
      config_(std::move(config)),
      caps_(vmm::read_all_device_caps(driver_)),
      device_count_(caps_.size()),
      smallest_memory_(smallest_memory(caps_)),
      registries_(make_registries(caps_.size())),
      tracker_(driver_, raw(registries_), config_.fence_enabled),
      devices_(caps_.size()),
      owned_(caps_.size()),
      peers_(driver_, policy_caps(caps_, config_), config_, tracker_,
             [this](int d) -> detail::DeviceHeap& { return device(d); }),
      id_(detail::next_allocator_id.fetch_add(1)) {}

Allocator::Impl::~Impl() {
  std::uint64_t all = 0;
  for (std::size_t d = 0; d < caps_.size() && d < 64; ++d) all |= std::uint64_t{1} << d;
  try {
    tracker_.fence_devices(all);
  } catch (...) {
    // A dead context: nothing queued runs again; unmapping is all that is left.
  }
  for (auto& d : owned_) d.reset();
}

void Allocator::Impl::throw_no_such_device(int device, const char* what) const {
  throw usage_error(std::string("gvmalloc: ") + what + ": device " + std::to_string(device) +
                    " does not exist (" + std::to_string(caps_.size()) + " device" +
                    (caps_.size() == 1 ? "" : "s") + ")");
}

void Allocator::Impl::check_fits_device_slow(std::size_t bytes, int device) const {
  const vmm::DeviceCaps& caps = caps_[static_cast<std::size_t>(device)];
  if (bytes <= caps.total_memory) return;
  throw out_of_memory("gvmalloc: out of memory on device " + std::to_string(device) + " (" +
                      caps.name + "): tried to allocate " + detail::format_bytes(bytes) +
                      ", more than the device's " + detail::format_bytes(caps.total_memory));
}

detail::DeviceHeap& Allocator::Impl::device(int d) {
  if (detail::DeviceHeap* h = existing(d); h != nullptr) return *h;
  std::lock_guard<std::mutex> guard(devices_lock_);
  auto& slot = owned_[static_cast<std::size_t>(d)];
  if (!slot) {
    const vmm::DeviceCaps& c = caps_[static_cast<std::size_t>(d)];
    slot = std::make_unique<detail::DeviceHeap>(driver_, c, config_, tracker_,
                                                *registries_[static_cast<std::size_t>(d)],
                                                c.vmm && !config_.force_no_vmm);
    devices_[static_cast<std::size_t>(d)].store(slot.get(), std::memory_order_release);
  }
  return *slot;
}

detail::Heap& Allocator::Impl::heap_slow(int device, vmm::StreamHandle stream, std::uint64_t gen) {
  detail::DeviceHeap& d = this->device(device);
  detail::Heap& h = d.heap_for(d.streams().get(stream));
  detail::tls_heap_slot = detail::HeapSlot{id_, gen, device, stream, &h};
  return h;
}

int Allocator::Impl::owner_of(std::uintptr_t addr) const {
  for (std::size_t d = 0; d < devices_.size(); ++d)
    if (heap_holding(static_cast<int>(d), addr) != nullptr) return static_cast<int>(d);
  return -1;
}

detail::Heap* Allocator::Impl::heap_holding(int device, std::uintptr_t addr) const {
  const detail::DeviceHeap* d = existing(device);
  if (d == nullptr) return nullptr;
  if (detail::Heap* h = d->owner_of(addr); h != nullptr) return h;
  for (detail::Heap* h : d->heaps())
    if (h->holds(addr)) return h;
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
                      " " + hex(reinterpret_cast<const void*>(addr)) + " " + why);
  };
  if (owner != device)
    say("belongs to device " + std::to_string(owner) + ", not device " + std::to_string(device));
  // kAbsurdBytes first: addr + bytes must not wrap in the block test.
  if (bytes > detail::kAbsurdBytes || !heap_holding(owner, addr)->is_live_block(addr, bytes))
    say("is not inside one live block for the whole range");
}

detail::Heap& Allocator::Impl::pool_heap(PoolId pool, const char* what, int* device) {
  int d = -1;
  {
    std::lock_guard<std::mutex> guard(pools_mu_);
    auto it = pool_device_.find(pool);
    if (it != pool_device_.end()) d = it->second;
  }
  if (d < 0)
    throw usage_error(std::string("gvmalloc: ") + what + ": pool " + std::to_string(pool) +
                      " does not exist (make one with create_pool)");
  if (device != nullptr) *device = d;
  return this->device(d).pool(pool);
}

bool Allocator::Impl::any_capture() const {
  for (std::size_t d = 0; d < devices_.size(); ++d)
    if (const detail::DeviceHeap* h = existing(static_cast<int>(d)); h != nullptr && h->capturing())
      return true;
  return false;
}

void Allocator::Impl::forget_stream(vmm::StreamHandle stream) {
  bool any = false;
  for (auto& r : registries_) any = r->retire(stream) || any;
  if (any) generation_.fetch_add(1, std::memory_order_acq_rel);
}

// ------------------------------------------------------------- Allocator --

Allocator::Allocator(vmm::Driver& driver, Config config)
    : impl_(std::make_unique<Impl>(driver, std::move(config))) {}

Allocator::~Allocator() = default;

void* Allocator::allocate(std::size_t bytes, int device, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  im.check_device(device, "allocate");
  // One compare for both: 0 wraps around to the largest size.
  if (bytes - 1 >= detail::kAbsurdBytes) [[unlikely]]
    check_size(bytes, device, "allocate");
  im.check_fits_device(bytes, device);
  detail::Heap& h = im.heap(device, stream);
  if (bytes <= h.span_route_max()) [[likely]]
    return h.allocate_small(bytes);
  return h.allocate_unspanned(bytes);
}

// ------------------------------------------------ pools, capture, per device --

void* Allocator::allocate(std::size_t bytes, int device, vmm::StreamHandle stream, PoolId pool) {
  if (pool == 0) return allocate(bytes, device, stream);
  Impl& im = *impl_;
  im.check_device(device, "allocate");
  if (bytes - 1 >= detail::kAbsurdBytes) check_size(bytes, device, "allocate");
  int owner = -1;
  detail::Heap& h = im.pool_heap(pool, "allocate", &owner);
  if (owner != device)
    throw usage_error("gvmalloc: allocate(" + std::to_string(bytes) + " bytes) on device " +
                      std::to_string(device) + ": pool " + std::to_string(pool) +
                      " belongs to device " + std::to_string(owner));
  if (h.released())
    throw usage_error("gvmalloc: allocate: pool " + std::to_string(pool) + " was released");
  im.check_fits_device(bytes, device);
  return h.allocate_large(bytes, im.stream_state(device, stream));
}

std::size_t Allocator::deallocate(void* ptr) {
  if (ptr == nullptr) return 0;
  Impl& im = *impl_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  for (int d = 0; d < device_count(); ++d) {
    std::size_t requested = 0;
    if (detail::DeviceHeap* h = im.existing(d);
        h != nullptr && h->deallocate(addr, kUnknownSize, nullptr, true, &requested))
      return requested;
  }
  const int owner = im.owner_of(addr);
  if (owner >= 0)
    throw usage_error("gvmalloc: deallocate(" + hex(ptr) + ") on device " + std::to_string(owner) +
                      ": not a live block (already freed, or an interior pointer)");
  throw usage_error("gvmalloc: deallocate(" + hex(ptr) + "): not a pointer gvmalloc gave out");
}

int Allocator::device_of(const void* ptr) const {
  return impl_->owner_of(reinterpret_cast<std::uintptr_t>(ptr));
}

void* Allocator::allocate_at(void* addr, std::size_t bytes, vmm::StreamHandle stream, PoolId pool) {
  Impl& im = *impl_;
  int device = -1;
  detail::Heap& h = im.pool_heap(pool, "allocate_at", &device);
  if (bytes - 1 >= detail::kAbsurdBytes) check_size(bytes, device, "allocate_at");
  if (reinterpret_cast<std::uintptr_t>(addr) % kBlockAlignment != 0)
    throw usage_error("gvmalloc: allocate_at(" + hex(addr) + "): not a block address (" +
                      std::to_string(kBlockAlignment) + "-byte aligned)");
  return h.allocate_at(reinterpret_cast<std::uintptr_t>(addr), bytes, im.stream_state(device, stream));
}

PoolId Allocator::create_pool(int device) {
  Impl& im = *impl_;
  im.check_device(device, "create_pool");
  const PoolId id = im.next_pool_.fetch_add(1);
  (void)im.device(device).pool(id);
  std::lock_guard<std::mutex> guard(im.pools_mu_);
  im.pool_device_.emplace(id, device);
  return id;
}

void Allocator::release_pool(PoolId pool) {
  Impl& im = *impl_;
  detail::Heap& h = im.pool_heap(pool, "release_pool");
  if (h.capturing())
    throw usage_error("gvmalloc: release_pool: pool " + std::to_string(pool) +
                      " is being captured into");
  if (h.device_heap().capturing()) {
    h.release_pool_later();  // gives memory back from the next free after the capture
    return;
  }
  h.release_pool();
}

void Allocator::trim_pool(PoolId pool) {
  Impl& im = *impl_;
  detail::Heap& h = im.pool_heap(pool, "trim_pool");
  if (h.device_heap().capturing())
    throw usage_error("gvmalloc: trim_pool(" + std::to_string(pool) +
                      "): a CUDA graph capture is under way, and giving memory back needs a "
                      "synchronisation the capture forbids on every device; trim after it ends");
  (void)h.release_cached(0, true);
  h.drop_unused_regions();
}

void Allocator::begin_capture(PoolId pool) {
  Impl& im = *impl_;
  detail::Heap& h = im.pool_heap(pool, "begin_capture");
  if (h.released())
    throw usage_error("gvmalloc: begin_capture: pool " + std::to_string(pool) + " was released");
  h.capture(+1);
  h.device_heap().begin_capture();
}

void Allocator::end_capture(PoolId pool) {
  Impl& im = *impl_;
  detail::Heap& h = im.pool_heap(pool, "end_capture");
  if (!h.capturing())
    throw usage_error("gvmalloc: end_capture: no capture into pool " + std::to_string(pool) +
                      " is under way");
  h.capture(-1);
  h.device_heap().end_capture();
}

void Allocator::set_memory_fraction(int device, double fraction) {
  Impl& im = *impl_;
  im.check_device(device, "set_memory_fraction");
  if (!(fraction > 0.0 && fraction <= 1.0))
    throw usage_error("gvmalloc: set_memory_fraction(" + std::to_string(fraction) + ") on device " +
                      std::to_string(device) + ": the fraction must be in (0, 1]");
  im.device(device).policy().set_fraction(fraction);
}

double Allocator::memory_fraction(int device) const {
  impl_->check_device(device, "memory_fraction");
  const detail::DeviceHeap* h = impl_->existing(device);
  return h != nullptr ? h->policy().fraction() : impl_->config_.memory_fraction;
}

void Allocator::reset_peak_stats(int device) {
  impl_->check_device(device, "reset_peak_stats");
  if (detail::DeviceHeap* h = impl_->existing(device); h != nullptr) h->reset_peaks();
}

std::size_t Allocator::largest_cached_block(int device) const {
  impl_->check_device(device, "largest_cached_block");
  const detail::DeviceHeap* d = impl_->existing(device);
  if (d == nullptr) return 0;
  std::size_t best = 0;
  for (const detail::Heap* h : d->heaps())
    if (h->kind() == detail::Heap::Kind::stream) best = std::max(best, h->largest_cached_block());
  return best;
}

void Allocator::deallocate(void* ptr, std::size_t bytes, int device, vmm::StreamHandle stream) {
  if (ptr == nullptr) return;  // like cudaFree(nullptr)
  Impl& im = *impl_;
  im.check_device(device, "deallocate");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  // The fast path asks the page map which heap holds the address (no lock);
  // the ownership search below only runs to word an error.
  if (detail::DeviceHeap* d = im.existing(device); d != nullptr && d->free(addr, bytes, stream))
    return;
  const int owner = im.owner_of(addr);
  if (owner >= 0 && owner != device)
    throw usage_error("gvmalloc: deallocate(" + hex(ptr) + ") names device " +
                      std::to_string(device) + ", but the block belongs to device " +
                      std::to_string(owner));
  if (owner == device)
    throw usage_error("gvmalloc: deallocate(" + hex(ptr) + ") on device " + std::to_string(device) +
                      ": not a live block (already freed, or an interior pointer)");
  throw usage_error("gvmalloc: deallocate(" + hex(ptr) + ") on device " + std::to_string(device) +
                    ": not a pointer gvmalloc gave out");
}

void Allocator::record_stream(void* ptr, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const int owner = im.owner_of(addr);
  if (owner < 0)
    throw usage_error("gvmalloc: record_stream(" + hex(ptr) + "): not a pointer gvmalloc gave out");
  if (!im.device(owner).record_stream(addr, im.stream_state(owner, stream)))
    throw usage_error("gvmalloc: record_stream(" + hex(ptr) + "): not a live block");
}

void Allocator::forget_stream(vmm::StreamHandle stream) { impl_->forget_stream(stream); }

void Allocator::trim(int device) {
  Impl& im = *impl_;
  if (device != -1) im.check_device(device, "trim");
  for (std::size_t d = 0; d < im.caps_.size(); ++d) {
    if (device != -1 && static_cast<int>(d) != device) continue;
    if (auto* h = im.existing(static_cast<int>(d)); h != nullptr && h->capturing())
      throw usage_error("gvmalloc: trim on device " + std::to_string(d) +
                        ": a CUDA graph capture is under way, and giving memory back needs a "
                        "synchronisation the capture forbids on every device; trim after it "
                        "ends");
  }
  // Under the shared policy lock: a scratch release fences under the policy
  // whose grants it may drop.
  std::shared_lock<std::shared_mutex> guard(im.peers_.lock());
  for (std::size_t d = 0; d < im.caps_.size(); ++d) {
    if (device != -1 && static_cast<int>(d) != device) continue;
    if (auto* h = im.existing(static_cast<int>(d)); h != nullptr) h->trim();
  }
}

int Allocator::device_count() const noexcept { return static_cast<int>(impl_->caps_.size()); }

const vmm::DeviceCaps& Allocator::caps(int device) const {
  impl_->check_device(device, "caps");
  return impl_->caps_[static_cast<std::size_t>(device)];
}

const Config& Allocator::config() const noexcept { return impl_->config_; }

DeviceStats Allocator::device_stats(int device) const {
  impl_->check_device(device, "device_stats");
  if (auto* h = impl_->existing(device); h != nullptr) return h->stats();
  DeviceStats s;
  s.device = device;
  return s;
}

std::size_t Allocator::reserved_bytes(int device) const {
  impl_->check_device(device, "reserved_bytes");
  const auto* h = impl_->existing(device);
  return h == nullptr ? 0 : h->reserved();
}

Stats Allocator::stats() const {
  Stats s;
  for (int d = 0; d < device_count(); ++d) s.devices.push_back(device_stats(d));
  const vmm::CallCounts counts = impl_->driver_.snapshot();
  s.driver.calls = counts.calls;
  s.driver.nanoseconds = counts.nanoseconds;
  return s;
}

std::string Allocator::snapshot_json() const {
  std::string j = to_json(stats());
  // Append the config (its text is keys, numbers and words: nothing to escape).
  if (!j.empty() && j.back() == '}') {
    j.pop_back();
    j += ",\"config\":\"" + to_string(impl_->config_) + "\"}";
  }
  return j;
}

std::vector<SegmentInfo> Allocator::memory_map(int device) const {
  impl_->check_device(device, "memory_map");
  std::vector<SegmentInfo> out;
  if (auto* h = impl_->existing(device); h != nullptr) h->memory_map(out);
  return out;
}

bool Allocator::check_invariants(std::string* why) const {
  for (int d = 0; d < device_count(); ++d)
    if (auto* h = impl_->existing(d); h != nullptr && !h->check(why)) return false;
  return true;
}

// ---------------------------------------------------------- peer scratch --

void* Allocator::scratch_allocate(std::size_t bytes, int device, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  im.check_device(device, "scratch_allocate");
  check_size(bytes, device, "scratch_allocate");
  if (bytes > im.caps_[static_cast<std::size_t>(device)].total_memory)
    throw out_of_memory("gvmalloc: out of memory on device " + std::to_string(device) +
                        ": scratch_allocate(" + detail::format_bytes(bytes) +
                        ") is more than the device's memory");
  detail::Heap& h = im.peers_.scratch(device);
  detail::StreamState& s = im.stream_state(device, stream);
  // Growth grants new chunks to the current policy's peers.
  std::shared_lock<std::shared_mutex> guard(im.peers_.lock());
  return h.allocate_large(bytes, s);
}

void Allocator::scratch_deallocate(void* ptr, std::size_t bytes, int device,
                                   vmm::StreamHandle stream) {
  deallocate(ptr, bytes, device, stream);
}

void Allocator::record_stream(void* ptr, vmm::StreamHandle stream, int stream_device) {
  Impl& im = *impl_;
  im.check_device(stream_device, "record_stream");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const int owner = im.owner_of(addr);
  if (owner < 0)
    throw usage_error("gvmalloc: record_stream(" + hex(ptr) +
                      "): not a pointer gvmalloc gave out");
  if (owner == stream_device) {
    if (!im.device(owner).record_stream(addr, im.stream_state(owner, stream)))
      throw usage_error("gvmalloc: record_stream(" + hex(ptr) + "): not a live block");
    return;
  }
  im.device(owner).note_use(addr, im.stream_state(stream_device, stream));
}

PeerPolicy Allocator::peer_policy(int owner, int peer) const {
  impl_->check_device(owner, "peer_policy");
  impl_->check_device(peer, "peer_policy");
  std::shared_lock<std::shared_mutex> guard(impl_->peers_.lock());
  return impl_->peers_.policy(owner, peer);
}

void Allocator::set_peer_policy(PeerPolicy policy) {
  if (impl_->any_capture())
    throw usage_error(
        "gvmalloc: set_peer_policy: a CUDA graph capture is under way, and a policy switch "
        "needs a fence the capture forbids; switch after it ends");
  impl_->peers_.set_policy(policy);
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
    detail::StreamState& user = im.stream_state(dst_device, stream);
    // Decided, noted and queued under one policy: a switch waits for all
    // three (it takes the lock exclusively), and then its fence sees the copy.
    std::shared_lock<std::shared_mutex> guard(im.peers_.lock());
    // Direct when dst_device (whose stream runs the copy) was let into the
    // source: it lies in src_device's scratch and the pair's policy grants it.
    detail::DeviceHeap* sd = im.existing(src_device);
    detail::Heap* scratch = sd == nullptr ? nullptr : sd->existing_scratch();
    const bool direct = im.peers_.policy(src_device, dst_device) != PeerPolicy::none &&
                        scratch != nullptr && scratch->is_live_block(s, bytes);
    // dst_device's stream touches src_device's memory either way (a staged
    // copy too): a fence before that memory is unmapped or its access
    // changes must wait for it.
    if (detail::DeviceHeap* d0 = im.existing(src_device); d0 != nullptr) d0->note_use(s, user);
    if (direct) {
      r = im.driver_.memcpy_async(dst_device, d, s, bytes, stream);
    } else {
      call = "cuMemcpyPeerAsync";
      r = im.driver_.memcpy_peer_async(d, dst_device, s, src_device, bytes, stream);
    }
  }
  if (r != vmm::Result::success)
    throw vmm::DriverError(r, std::string(call) + " in peer_copy(" + std::to_string(bytes) +
                                  " bytes, device " + std::to_string(src_device) + " -> " +
                                  std::to_string(dst_device) + ")");
}

bool Allocator::is_peer_copy_direct(const void* src, int src_device, int dst_device) const {
  Impl& im = *impl_;
  im.check_device(dst_device, "is_peer_copy_direct");
  im.check_device(src_device, "is_peer_copy_direct");
  std::shared_lock<std::shared_mutex> guard(im.peers_.lock());
  detail::DeviceHeap* sd = im.existing(src_device);
  detail::Heap* scratch = sd == nullptr ? nullptr : sd->existing_scratch();
  return src_device != dst_device && im.peers_.policy(src_device, dst_device) != PeerPolicy::none &&
         scratch != nullptr && scratch->is_live_block(reinterpret_cast<std::uintptr_t>(src), 1);
}

}  // namespace gvm
