// allocator_adapter.hpp says why this file exists. Each function below asks,
// at compile time, whether gvm::Allocator has the member the backend wants
// (a concept on the allocator type: a missing member makes it false, not an
// error) and calls it when it does. The allocator is the process's
// (gvm::process_allocator()), the one the C ABI serves.
//
// With -DGVM_TORCH_REQUIRE_FULL_API=1 (CMake option of the same name) a
// missing member is a compile error instead: for the build that must use
// all of it.
#include "allocator_adapter.hpp"

#include <concepts>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "allocator_api.hpp"
#include "block_table.hpp"
#include "gvm/allocator.hpp"
#include "gvm/errors.hpp"
#include "gvm/process_allocator.hpp"

#ifndef GVM_TORCH_REQUIRE_FULL_API
#define GVM_TORCH_REQUIRE_FULL_API 0
#endif

namespace gvm::torch_backend {

namespace {

using Underlying = Allocator;
// Asked at every call, not kept: it is valid only until gvm_shutdown(), and
// one atomic load.
Underlying& underlying() {
  return process_allocator();
}

constexpr bool kPoolAllocate = has_pool_allocate<Underlying>;
constexpr bool kCapture = has_capture<Underlying>;
constexpr bool kPtrDeallocate = has_ptr_deallocate<Underlying>;
constexpr bool kMemoryFraction = has_memory_fraction<Underlying>;
constexpr bool kResetPeak = has_reset_peak<Underlying>;
constexpr bool kLargestCached = has_largest_cached<Underlying>;
constexpr bool kMemoryMap = has_memory_map<Underlying>;
constexpr bool kAllocateAt = has_allocate_at<Underlying>;
constexpr bool kTrimPool = has_trim_pool<Underlying>;

#if GVM_TORCH_REQUIRE_FULL_API
static_assert(kPoolAllocate && kCapture && kPtrDeallocate && kMemoryFraction && kResetPeak &&
                  kLargestCached && kMemoryMap,
              "gvm::Allocator lacks part of the API the PyTorch backend uses (see capabilities)");
#endif

[[noreturn]] void unavailable(const char* what, const char* needs) {
  throw api_unavailable(std::string("gvmalloc's PyTorch backend: ") + what +
                        " needs gvm::Allocator::" + needs +
                        ", which this gvmalloc build does not have yet (docs/pytorch.md, "
                        "\"What the backend needs from the allocator\")");
}

// ---- each operation, for an allocator type U -------------------------------

template <class U>
void* allocate_in(U& u, std::size_t bytes, int device, void* stream, PoolId pool) {
  if constexpr (has_pool_allocate<U>) {
    return u.allocate(bytes, device, stream, pool);
  } else {
    if (pool != 0)
      unavailable("allocating in a private pool (CUDA graphs, MemPool)",
                  "allocate(bytes, device, stream, pool)");
    return u.allocate(bytes, device, stream);
  }
}

template <class U>
PoolId create_pool_in(U& u, int device) {
  if constexpr (has_pool_allocate<U>) {
    return u.create_pool(device);
  } else {
    (void)u;
    (void)device;
    unavailable("a private pool (CUDA graphs, MemPool)", "create_pool");
  }
}

template <class U>
void release_pool_in(U& u, PoolId pool) {
  if constexpr (has_pool_allocate<U>) {
    u.release_pool(pool);
  } else {
    (void)u;
    (void)pool;
    unavailable("releasing a private pool", "release_pool");
  }
}

template <class U>
void begin_capture_in(U& u, PoolId pool) {
  if constexpr (has_capture<U>) {
    u.begin_capture(pool);
  } else {
    (void)u;
    (void)pool;
    unavailable("CUDA graph capture", "begin_capture");
  }
}

template <class U>
void end_capture_in(U& u, PoolId pool) {
  if constexpr (has_capture<U>) {
    u.end_capture(pool);
  } else {
    (void)u;
    (void)pool;
    unavailable("CUDA graph capture", "end_capture");
  }
}

template <class U>
void* allocate_at_in(U& u, void* addr, std::size_t bytes, void* stream, PoolId pool) {
  if constexpr (has_allocate_at<U>) {
    return u.allocate_at(addr, bytes, stream, pool);
  } else {
    (void)u, (void)addr, (void)bytes, (void)stream, (void)pool;
    unavailable("restoring a pool checkpoint (torch.compile mode=\"reduce-overhead\" re-recording)",
                "allocate_at(addr, bytes, stream, pool)");
  }
}

template <class U>
void trim_pool_in(U& u, PoolId pool, int device) {
  if constexpr (has_trim_pool<U>) {
    (void)device;
    u.trim_pool(pool);
  } else {
    // Without a per-pool trim the device's whole cache goes: more than was
    // asked, never less (memory only; nothing live is touched).
    (void)pool;
    u.trim(device);
  }
}

template <class U>
std::size_t largest_cached_in(const U& u, int device) {
  if constexpr (has_largest_cached<U>) {
    return u.largest_cached_block(device);
  } else {
    (void)u;
    (void)device;
    return 0;  // the caller's guess (the device's free memory) stands alone
  }
}

template <class U>
void set_fraction_in(U& u, int device, double fraction) {
  if constexpr (has_memory_fraction<U>) {
    u.set_memory_fraction(device, fraction);
  } else {
    (void)u, (void)device, (void)fraction;
    unavailable("torch.cuda.set_per_process_memory_fraction", "set_memory_fraction");
  }
}

template <class U>
double fraction_in(const U& u, int device) {
  if constexpr (has_memory_fraction<U>) {
    return u.memory_fraction(device);
  } else {
    (void)u;
    (void)device;
    return 0.0;
  }
}

template <class U>
void reset_peak_in(U& u, int device) {
  if constexpr (has_reset_peak<U>) {
    u.reset_peak_stats(device);
  } else {
    (void)u;
    (void)device;  // the backend resets its own peaks; gvmalloc's reserved peak stays
  }
}

template <class U>
void* allocate_tracked(U& u, BlockTable& table, std::size_t bytes, int device, void* stream,
                       PoolId pool) {
  void* p = allocate_in(u, bytes, device, stream, pool);
  if constexpr (!has_ptr_deallocate<U>) {
    try {
      table.insert(p, BlockRecord{bytes, device, stream, nullptr, {}});
    } catch (...) {
      u.deallocate(p, bytes, device, stream);
      throw;
    }
  } else {
    (void)table;
  }
  return p;
}

template <class U>
FreedBlock deallocate_tracked(U& u, BlockTable& table, void* ptr) {
  if constexpr (has_ptr_deallocate<U>) {
    (void)table;
    const int device = u.device_of(ptr);
    if (device < 0) throw usage_error("free of an address gvmalloc did not hand out");
    return FreedBlock{u.deallocate(ptr), device};
  } else {
    auto r = table.take(ptr);
    if (!r) {
      throw usage_error(
          "free of an address gvmalloc's PyTorch backend did not hand out (or a double free)");
    }
    try {
      u.deallocate(ptr, r->requested, r->device, r->stream);
    } catch (...) {
      table.insert(ptr, *r);  // nothing changed: the block is still live
      throw;
    }
    return FreedBlock{r->requested, r->device};
  }
}

template <class U>
std::vector<SegmentView> memory_map_in(const U& u, int device) {
  if constexpr (has_memory_map<U>) {
    std::vector<SegmentView> out;
    for (const auto& s : u.memory_map(device)) {
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
  } else {
    (void)u;
    (void)device;
    unavailable("a memory snapshot (torch.cuda.memory._snapshot, pool checkpoints)", "memory_map");
  }
}

template <class U>
std::string config_in(const U& u) {
  if constexpr (has_config<U>) {
    return to_string(u.config());
  } else {
    (void)u;
    return {};
  }
}

}  // namespace

// ---------------------------------------------------------------------------

std::string Capabilities::to_string() const {
  auto f = [](const char* name, bool v) { return std::string(name) + (v ? "=1" : "=0"); };
  return f("process_allocator", process_allocator) + "," + f("pool_allocate", pool_allocate) + "," +
         f("capture", capture) + "," + f("deallocate_by_ptr", deallocate_by_ptr) + "," +
         f("memory_fraction", memory_fraction) + "," + f("reset_peak", reset_peak) + "," +
         f("largest_cached", largest_cached) + "," + f("memory_map", memory_map) + "," +
         f("allocate_at", allocate_at) + "," + f("trim_pool", trim_pool);
}

class AllocatorAdapter::Impl {
 public:
  static Underlying& u() { return underlying(); }
  BlockTable table;  // only when the allocator cannot look a block up (kPtrDeallocate false)
};

AllocatorAdapter& AllocatorAdapter::instance() {
  // Deliberately never destroyed: PyTorch frees tensors from static
  // destructors that may run after ours.
  static AllocatorAdapter* a = new AllocatorAdapter();
  return *a;
}

AllocatorAdapter::AllocatorAdapter() : impl_(new Impl()) {}

Capabilities AllocatorAdapter::capabilities() noexcept {
  Capabilities c;
  c.process_allocator = true;
  c.pool_allocate = kPoolAllocate;
  c.capture = kCapture;
  c.deallocate_by_ptr = kPtrDeallocate;
  c.memory_fraction = kMemoryFraction;
  c.reset_peak = kResetPeak;
  c.largest_cached = kLargestCached;
  c.memory_map = kMemoryMap;
  c.allocate_at = kAllocateAt;
  c.trim_pool = kTrimPool;
  return c;
}

void* AllocatorAdapter::allocate(std::size_t bytes, int device, void* stream, PoolId pool) {
  return allocate_tracked(impl_->u(), impl_->table, bytes, device, stream, pool);
}

FreedBlock AllocatorAdapter::deallocate(void* ptr) {
  return deallocate_tracked(impl_->u(), impl_->table, ptr);
}

void AllocatorAdapter::record_stream(void* ptr, void* stream, int stream_device) {
  impl_->u().record_stream(ptr, stream, stream_device);
}

PoolId AllocatorAdapter::create_pool(int device) {
  return create_pool_in(impl_->u(), device);
}
void AllocatorAdapter::release_pool(PoolId pool) {
  release_pool_in(impl_->u(), pool);
}
void AllocatorAdapter::begin_capture(PoolId pool) {
  begin_capture_in(impl_->u(), pool);
}
void AllocatorAdapter::end_capture(PoolId pool) {
  end_capture_in(impl_->u(), pool);
}

void* AllocatorAdapter::allocate_at(void* addr, std::size_t bytes, void* stream, PoolId pool) {
  return allocate_at_in(impl_->u(), addr, bytes, stream, pool);
}

void AllocatorAdapter::trim(int device) {
  impl_->u().trim(device);
}
void AllocatorAdapter::trim_pool(PoolId pool, int device) {
  trim_pool_in(impl_->u(), pool, device);
}
DeviceStats AllocatorAdapter::device_stats(int device) const {
  return impl_->u().device_stats(device);
}

std::size_t AllocatorAdapter::largest_cached_block(int device) const {
  return largest_cached_in(impl_->u(), device);
}

void AllocatorAdapter::set_memory_fraction(int device, double fraction) {
  set_fraction_in(impl_->u(), device, fraction);
}

double AllocatorAdapter::memory_fraction(int device) const {
  return fraction_in(impl_->u(), device);
}
void AllocatorAdapter::reset_peak_stats(int device) {
  reset_peak_in(impl_->u(), device);
}

std::vector<SegmentView> AllocatorAdapter::memory_map(int device) const {
  return memory_map_in(impl_->u(), device);
}

std::string AllocatorAdapter::config_text() const {
  return config_in(impl_->u());
}

std::size_t AllocatorAdapter::tracked_blocks() const {
  return impl_->table.size();
}

}  // namespace gvm::torch_backend
