// allocator_adapter.hpp says why this file exists. The allocator is the
// process's (gvm::process_allocator()), the one the C ABI serves.
#include "allocator_adapter.hpp"

#include <optional>
#include <string>
#include <utility>

#include "gvm/allocator.hpp"
#include "gvm/errors.hpp"
#include "gvm/process_allocator.hpp"

namespace gvm::torch_backend {

namespace {

// Asked at every call, not kept: it is valid only until gvm_shutdown(), and
// one atomic load.
Allocator& gvm() {
  return process_allocator();
}

}  // namespace

AllocatorAdapter& AllocatorAdapter::instance() {
  // Deliberately never destroyed: PyTorch frees tensors from static
  // destructors that may run after ours.
  static AllocatorAdapter* a = new AllocatorAdapter();
  return *a;
}

void* AllocatorAdapter::recorded(void* ptr, std::size_t bytes, int device) {
  try {
    live_.insert(ptr, LiveRequest{bytes, device});
  } catch (...) {
    gvm().deallocate(ptr);  // the block is nobody's: back it goes
    throw;
  }
  return ptr;
}

void* AllocatorAdapter::allocate(std::size_t bytes, int device, void* stream, PoolId pool) {
  return recorded(gvm().allocate(bytes, device, stream, pool), bytes, device);
}

void* AllocatorAdapter::allocate_at(void* addr, std::size_t bytes, void* stream, PoolId pool) {
  void* p = gvm().allocate_at(addr, bytes, stream, pool);
  return recorded(p, bytes, gvm().device_of(p));
}

FreedBlock AllocatorAdapter::deallocate(void* ptr) {
  const std::optional<LiveRequest> r = live_.take(ptr);
  if (!r) {
    throw usage_error(
        "free of an address gvmalloc's PyTorch backend did not hand out (or a double free)");
  }
  try {
    gvm().deallocate(ptr);
  } catch (...) {
    live_.insert(ptr, *r);  // nothing changed: the block is still live
    throw;
  }
  return FreedBlock{r->requested, r->device};
}

void AllocatorAdapter::record_stream(void* ptr, void* stream, int stream_device) {
  gvm().record_stream(ptr, stream, stream_device);
}

PoolId AllocatorAdapter::create_pool(int device) {
  return gvm().create_pool(device);
}
void AllocatorAdapter::release_pool(PoolId pool) {
  gvm().release_pool(pool);
}
void AllocatorAdapter::begin_capture(PoolId pool) {
  gvm().begin_capture(pool);
}
void AllocatorAdapter::end_capture(PoolId pool) {
  gvm().end_capture(pool);
}

void AllocatorAdapter::trim(int device) {
  gvm().trim(device);
}
void AllocatorAdapter::trim_pool(PoolId pool) {
  gvm().trim_pool(pool);
}
DeviceStats AllocatorAdapter::device_stats(int device) const {
  return gvm().device_stats(device);
}
std::size_t AllocatorAdapter::reserved_bytes(int device) const {
  return gvm().reserved_bytes(device);
}
std::size_t AllocatorAdapter::largest_cached_block(int device) const {
  return gvm().largest_cached_block(device);
}
void AllocatorAdapter::set_memory_fraction(int device, double fraction) {
  gvm().set_memory_fraction(device, fraction);
}
double AllocatorAdapter::memory_fraction(int device) const {
  return gvm().memory_fraction(device);
}
void AllocatorAdapter::reset_peak_stats(int device) {
  gvm().reset_peak_stats(device);
}

std::vector<SegmentView> AllocatorAdapter::memory_map(int device) const {
  std::vector<SegmentView> out;
  for (const auto& s : gvm().memory_map(device)) {
    SegmentView v;
    v.device = s.device;
    v.addr = static_cast<std::uintptr_t>(s.addr);
    v.size = s.size;
    v.scratch = s.scratch;
    v.pool = static_cast<PoolId>(s.pool);
    v.blocks.reserve(s.blocks.size());
    for (const auto& b : s.blocks) {
      v.blocks.push_back(BlockView{static_cast<std::uintptr_t>(b.addr), b.size, b.requested,
                                   b.allocated, b.small, b.stream});
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::string AllocatorAdapter::config_text() const {
  return to_string(gvm().config());
}

std::size_t AllocatorAdapter::live_blocks() const {
  return live_.size();
}

}  // namespace gvm::torch_backend
