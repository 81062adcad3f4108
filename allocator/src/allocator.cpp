// gvm::Allocator: devices, dispatch to the small or large path, and the
// thread-local shortcut to a stream's cache.
#include "gvm/allocator.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "allocator_impl.hpp"

namespace gvm {
namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

Allocator::Allocator(vmm::Driver& driver, Config config)
    : impl_(std::make_unique<Impl>(driver, std::move(config))) {}

Allocator::~Allocator() = default;

void* Allocator::allocate(std::size_t bytes, int device, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  im.check_device(device, "allocate");
  if (bytes == 0)
    throw usage_error("gvmalloc: allocate(0 bytes) on device " + std::to_string(device) +
                      ": a block must have at least 1 byte");
  if (bytes > detail::kAbsurdBytes)
    throw usage_error("gvmalloc: allocate(" + std::to_string(bytes) + " bytes) on device " +
                      std::to_string(device) +
                      ": not a size any GPU can hold (a negative size converted to unsigned?)");
  const vmm::DeviceCaps& caps = im.caps_[static_cast<std::size_t>(device)];
  if (bytes > caps.total_memory)
    throw out_of_memory("gvmalloc: out of memory on device " + std::to_string(device) + " (" +
                        caps.name + "): tried to allocate " + detail::format_bytes(bytes) +
                        ", more than the device's " + detail::format_bytes(caps.total_memory));
  detail::DeviceHeap& h = im.heap(device);
  auto once = [&] {
    if (bytes <= h.small_max()) return h.allocate_small(im.cache(h, device, stream), bytes);
    return h.allocate_large(bytes, stream);
  };
  try {
    return once();
  } catch (const out_of_memory&) {
    // The reserve cap counts the scratch too: its cached chunks go back
    // (behind the fence) before the arena gives up. Outside the arena's
    // locks, so that no heap's lock is held while another's is taken.
    if (!im.release_other_heap(device, &h)) throw;
    return once();
  }
}

void Allocator::deallocate(void* ptr, std::size_t bytes, int device, vmm::StreamHandle stream) {
  if (ptr == nullptr) return;  // like cudaFree(nullptr)
  Impl& im = *impl_;
  im.check_device(device, "deallocate");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  // The fast path asks the heaps directly (a page-map lookup, no lock for a
  // small block); the ownership search below only runs to word an error.
  if (auto* h = im.existing_heap(device); h != nullptr && h->deallocate(addr, bytes, stream)) return;
  if (auto* h = im.existing_scratch(device); h != nullptr && h->deallocate(addr, bytes, stream))
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
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const int owner = impl_->owner_of(addr);
  if (owner < 0)
    throw usage_error("gvmalloc: record_stream(" + hex(ptr) + "): not a pointer gvmalloc gave out");
  impl_->heap_holding(owner, addr)->record_stream(addr, stream);
}

void Allocator::trim(int device) {
  Impl& im = *impl_;
  if (device != -1) im.check_device(device, "trim");
  for (std::size_t d = 0; d < im.caps_.size(); ++d) {
    if (device != -1 && static_cast<int>(d) != device) continue;
    if (auto* h = im.existing_heap(static_cast<int>(d)); h != nullptr) h->trim();
    if (auto* h = im.existing_scratch(static_cast<int>(d)); h != nullptr) h->trim();
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
  DeviceStats s;
  s.device = device;
  if (auto* h = impl_->existing_heap(device); h != nullptr) s = h->stats();
  if (auto* h = impl_->existing_scratch(device); h != nullptr) {
    // The scratch buffer's memory is part of the device's totals.
    const DeviceStats x = h->stats();
    s.live_bytes += x.live_bytes;
    s.reserved_bytes += x.reserved_bytes;
    s.cached_bytes += x.cached_bytes;
    s.peak_live_bytes += x.peak_live_bytes;
    s.peak_reserved_bytes += x.peak_reserved_bytes;
    s.scratch_reserved_bytes = x.reserved_bytes;
    s.allocations += x.allocations;
    s.frees += x.frees;
    s.cache_hits += x.cache_hits;
    s.chunks_mapped += x.chunks_mapped;
    s.chunks_unmapped += x.chunks_unmapped;
    s.oom_retries += x.oom_retries;
    s.fences += x.fences;
    s.cross_stream_waits += x.cross_stream_waits;
  }
  return s;
}

Stats Allocator::stats() const {
  Stats s;
  for (int d = 0; d < device_count(); ++d) s.devices.push_back(device_stats(d));
  s.driver = impl_->driver_.snapshot();
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
  if (auto* h = impl_->existing_heap(device); h != nullptr) h->memory_map(out);
  if (auto* h = impl_->existing_scratch(device); h != nullptr) h->memory_map(out);
  return out;
}

bool Allocator::check_invariants(std::string* why) const {
  for (int d = 0; d < device_count(); ++d)
    if (auto* h = impl_->existing_heap(d); h != nullptr && !h->check_invariants(why)) return false;
  for (int d = 0; d < device_count(); ++d)
    if (auto* h = impl_->existing_scratch(d); h != nullptr && !h->check_invariants(why)) return false;
  return true;
}

}  // namespace gvm
