// gvm::Allocator: devices, dispatch to the small or large path, and the
// thread-local shortcut to a stream's cache.
#include "gvm/allocator.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "counting_driver.hpp"
#include "device_heap.hpp"
#include "fence.hpp"

namespace gvm {
namespace {

// Requests above this are not sizes but bugs (a negative ssize_t seen as
// unsigned, say): no GPU has 128 TiB.
constexpr std::size_t kAbsurdBytes = std::size_t{1} << 47;

std::atomic<std::uint64_t> next_allocator_id{1};

// The last (allocator, device, stream) -> cache lookup of this thread. The
// allocator id is never reused, so a stale slot can never match.
struct CacheSlot {
  std::uint64_t owner = 0;
  int device = -1;
  vmm::StreamHandle stream = nullptr;
  detail::StreamCache* cache = nullptr;
};
thread_local CacheSlot tls_cache_slot;

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

class Allocator::Impl {
 public:
  Impl(vmm::Driver& driver, Config config)
      : driver_(driver),
        config_(std::move(config)),
        caps_(vmm::read_all_device_caps(driver_)),
        fence_(driver_, static_cast<int>(caps_.size()), config_.fence_enabled),
        heaps_(caps_.size()),
        owned_(caps_.size()),
        id_(next_allocator_id.fetch_add(1)) {}

  void check_device(int device, const char* what) const {
    if (device < 0 || static_cast<std::size_t>(device) >= caps_.size())
      throw usage_error(std::string("gvmalloc: ") + what + ": device " + std::to_string(device) +
                        " does not exist (" + std::to_string(caps_.size()) + " device" +
                        (caps_.size() == 1 ? "" : "s") + ")");
  }

  detail::DeviceHeap& heap(int device) {
    detail::DeviceHeap* h = heaps_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
    if (h != nullptr) return *h;
    std::lock_guard<std::mutex> guard(heaps_lock_);
    auto& slot = owned_[static_cast<std::size_t>(device)];
    if (!slot) {
      slot = std::make_unique<detail::DeviceHeap>(
          driver_, caps_[static_cast<std::size_t>(device)], config_, fence_,
          detail::DeviceHeap::Kind::arena,
          std::vector<vmm::AccessDesc>{{device, vmm::Access::read_write}});
      heaps_[static_cast<std::size_t>(device)].store(slot.get(), std::memory_order_release);
    }
    return *slot;
  }

  detail::DeviceHeap* existing_heap(int device) const {
    return heaps_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  }

  detail::StreamCache& cache(detail::DeviceHeap& h, int device, vmm::StreamHandle stream) {
    CacheSlot& slot = tls_cache_slot;
    if (slot.owner == id_ && slot.device == device && slot.stream == stream) [[likely]]
      return *slot.cache;
    detail::StreamCache& c = h.cache_for(stream);
    slot = CacheSlot{id_, device, stream, &c};
    return c;
  }

  // The device whose heap holds addr, or -1.
  int owner_of(std::uintptr_t addr) const {
    for (std::size_t d = 0; d < heaps_.size(); ++d)
      if (auto* h = existing_heap(static_cast<int>(d)); h != nullptr && h->owns(addr))
        return static_cast<int>(d);
    return -1;
  }

  detail::CountingDriver driver_;
  Config config_;
  std::vector<vmm::DeviceCaps> caps_;
  detail::Fence fence_;
  std::mutex heaps_lock_;
  std::vector<std::atomic<detail::DeviceHeap*>> heaps_;
  // Declared last: heaps are destroyed (fenced, unmapped) before the rest.
  std::vector<std::unique_ptr<detail::DeviceHeap>> owned_;
  const std::uint64_t id_;
};

Allocator::Allocator(vmm::Driver& driver, Config config)
    : impl_(std::make_unique<Impl>(driver, std::move(config))) {}

Allocator::~Allocator() = default;

void* Allocator::allocate(std::size_t bytes, int device, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  im.check_device(device, "allocate");
  if (bytes == 0)
    throw usage_error("gvmalloc: allocate(0 bytes) on device " + std::to_string(device) +
                      ": a block must have at least 1 byte");
  if (bytes > kAbsurdBytes)
    throw usage_error("gvmalloc: allocate(" + std::to_string(bytes) + " bytes) on device " +
                      std::to_string(device) +
                      ": not a size any GPU can hold (a negative size converted to unsigned?)");
  const vmm::DeviceCaps& caps = im.caps_[static_cast<std::size_t>(device)];
  if (bytes > caps.total_memory)
    throw out_of_memory("gvmalloc: out of memory on device " + std::to_string(device) + " (" +
                        caps.name + "): tried to allocate " + detail::format_bytes(bytes) +
                        ", more than the device's " + detail::format_bytes(caps.total_memory));
  detail::DeviceHeap& h = im.heap(device);
  if (bytes <= h.small_max()) return h.allocate_small(im.cache(h, device, stream), bytes);
  return h.allocate_large(bytes, stream);
}

void Allocator::deallocate(void* ptr, std::size_t bytes, int device, vmm::StreamHandle stream) {
  if (ptr == nullptr) return;  // like cudaFree(nullptr)
  Impl& im = *impl_;
  im.check_device(device, "deallocate");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  detail::DeviceHeap* h = im.existing_heap(device);
  if (h == nullptr || !h->owns(addr)) {
    const int owner = im.owner_of(addr);
    if (owner >= 0)
      throw usage_error("gvmalloc: deallocate(" + hex(ptr) + ") names device " +
                        std::to_string(device) + ", but the block belongs to device " +
                        std::to_string(owner));
    throw usage_error("gvmalloc: deallocate(" + hex(ptr) + ") on device " + std::to_string(device) +
                      ": not a pointer gvmalloc gave out");
  }
  h->deallocate(addr, bytes, stream);
}

void Allocator::record_stream(void* ptr, vmm::StreamHandle stream) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const int owner = impl_->owner_of(addr);
  if (owner < 0)
    throw usage_error("gvmalloc: record_stream(" + hex(ptr) + "): not a pointer gvmalloc gave out");
  impl_->existing_heap(owner)->record_stream(addr, stream);
}

void Allocator::trim(int device) {
  Impl& im = *impl_;
  if (device != -1) im.check_device(device, "trim");
  for (std::size_t d = 0; d < im.caps_.size(); ++d) {
    if (device != -1 && static_cast<int>(d) != device) continue;
    if (auto* h = im.existing_heap(static_cast<int>(d)); h != nullptr) h->trim();
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
  if (auto* h = impl_->existing_heap(device); h != nullptr) return h->stats();
  DeviceStats s;
  s.device = device;
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

bool Allocator::check_invariants(std::string* why) const {
  for (int d = 0; d < device_count(); ++d)
    if (auto* h = impl_->existing_heap(d); h != nullptr && !h->check_invariants(why)) return false;
  return true;
}

}  // namespace gvm
