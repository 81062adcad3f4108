// PyTorch's allocator interface, method by method, over the parts in
// integrations/torch/{core,src}: allocation and free, streams, statistics,
// pools, the memory layout (memory_layout.hpp), pool checkpoints
// (pool_checkpoint.hpp), history. Installing the backend is install.cpp.
#include "backend.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <limits>
#include <optional>

#include "errors.hpp"
#include "gvm/errors.hpp"
#include "memory_layout.hpp"
#include "oom_message.hpp"
#include "pool_checkpoint.hpp"
#include "size_format.hpp"

namespace gvm::torch_backend {

namespace {

MempoolKey key_of(c10::MempoolId_t id) {
  return MempoolKey{id.first, id.second};
}

int checked_device(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < History::kMaxDevices, "gvmalloc: invalid CUDA device ",
              static_cast<int>(device));
  return device;
}

std::uintptr_t address(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

void set_stat(c10::CachingAllocator::Stat& out, const StatValue& v) {
  out.current = v.current;
  out.peak = v.peak;
  out.allocated = v.allocated;
  out.freed = v.freed;
}

std::int64_t as_i64(std::uint64_t v) {
  return static_cast<std::int64_t>(v);
}

// The free and total memory of `device` (0, 0 if the runtime cannot say: an
// error is being raised when this is asked, and must stay the error raised).
// The runtime's own device calls, not c10's CUDAGuard: the guard's destructor
// asks c10 whether a primary context exists, which in a process without
// libtorch_cuda (a C++ program on libc10_cuda alone) throws - from a
// destructor, which terminates the process instead of raising the error.
std::pair<std::size_t, std::size_t> device_memory(int device) {
  int before = -1;
  if (cudaGetDevice(&before) != cudaSuccess) {
    (void)cudaGetLastError();
    return {0, 0};
  }
  if (before != device && cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {0, 0};
  }
  std::size_t free = 0;
  std::size_t total = 0;
  const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
  if (!ok) (void)cudaGetLastError();
  if (before != device && cudaSetDevice(before) != cudaSuccess) (void)cudaGetLastError();
  if (!ok) return {0, 0};
  return {free, total};
}

// The PyTorch profiler's memory view (profile_memory=True) learns every
// allocation and free from the allocator.
void report_to_profiler(void* ptr, std::int64_t delta, const CountersSnapshot& c,
                        std::size_t reserved, int device) {
  c10::reportMemoryUsageToProfiler(
      ptr, delta, static_cast<std::size_t>(c.allocated_bytes[kStatAll].current), reserved,
      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

}  // namespace

Backend& Backend::instance() {
  static Backend* b = new Backend();
  return *b;
}

Backend::Backend() : gvm_(AllocatorAdapter::instance()) {
  for (auto& d : devices_) d = std::make_unique<Device>();
}

Backend::Device& Backend::device_state(int device) {
  return *devices_[static_cast<std::size_t>(device)];
}

PoolTable::MakePool Backend::pool_maker(int device) {
  return [this, device] { return gvm_.create_pool(device); };
}

// ---- allocation ------------------------------------------------------------

c10::DataPtr Backend::allocate(size_t n) {
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  void* p = n == 0 ? nullptr : malloc(n, device, c10::cuda::getCurrentCUDAStream(device).stream());
  return {p, p, &Backend::delete_block, c10::Device(c10::DeviceType::CUDA, device)};
}

c10::DeleterFnPtr Backend::raw_deleter() const {
  return &Backend::delete_block;
}

void* Backend::raw_alloc(size_t nbytes) {
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return malloc(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* Backend::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return malloc(nbytes, device, stream);
}

void* Backend::malloc(size_t bytes, c10::DeviceIndex device_index, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  const int device = checked_device(device_index);
  Device& ds = device_state(device);
  // Stacks are gathered before anything is locked (the recorder takes
  // Python's locks).
  std::shared_ptr<c10::GatheredContext> context;
  const bool recording = history_.recording();
  if (recording) context = history_.context_for_alloc();
  Target target = ds.pools.route(stream);
  // While a capture is open on the device, every allocation may have to map
  // memory where the capture forbids it (one routed by a thread's MemPool
  // context, too), so each is made in relaxed capture mode.
  target.capture = target.capture || ds.pools.capturing();
  void* p = allocate_target(bytes, device, stream, target);
  ds.counters.on_alloc(bytes);
  if (recording) {
    history_.on_alloc(device, address(p), torch_rounded(bytes), stream, target.key,
                      std::move(context));
  }
  if (const auto* trace = c10::impl::GPUTrace::get_trace(); C10_UNLIKELY(trace != nullptr)) {
    (*trace)->trace_gpu_memory_allocation(c10::kCUDA, address(p));
  }
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    report_to_profiler(p, static_cast<std::int64_t>(torch_rounded(bytes)), ds.counters.read(),
                       gvm_.reserved_bytes(device), device);
  }
  return p;
}

void* Backend::allocate_target(size_t bytes, int device, cudaStream_t stream,
                               const Target& target) {
  try {
    if (target.custom) {
      // A MemPool with an allocator of its own: that allocator serves it.
      auto custom = std::static_pointer_cast<cca::CUDAAllocator>(target.custom);
      void* p = custom->raw_alloc_with_stream(bytes, stream);
      TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "CUDA out of memory. Tried to allocate ",
                       format_size(bytes), ": the allocator of pool (", target.key.first, ", ",
                       target.key.second, ") returned no memory");
      any_custom_.store(true, std::memory_order_relaxed);
      custom_blocks_.insert(p, BlockRecord{bytes, device, stream, target.custom, {}});
      return p;
    }
    if (target.capture) {
      // What a capture forbids (mapping memory, among others) is allowed to
      // this thread in relaxed mode, as PyTorch's allocator does around
      // cudaMalloc during capture; the allocator itself keeps away from
      // event queries and syncs while the pool is capturing.
      c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
      return gvm_.allocate(bytes, device, stream, target.pool);
    }
    return gvm_.allocate(bytes, device, stream, target.pool);
  } catch (const out_of_memory& e) {
    return allocate_after_oom(bytes, device, stream, target, e);
  } catch (const usage_error& e) {
    // gvmalloc refuses sizes no device could hold as bad input; PyTorch's
    // answer to a request larger than the GPU is an out-of-memory error.
    if (bytes > device_memory(device).second) raise_oom(bytes, device, stream, target, e.what());
    fail(std::string("gvmalloc: allocating ") + format_size(bytes) + ": " + e.what());
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.rfind("gvmalloc", 0) == 0) fail(what);
    fail("gvmalloc: allocating " + format_size(bytes) + ": " + what);
  }
}

void* Backend::allocate_after_oom(size_t bytes, int device, cudaStream_t stream,
                                  const Target& target, const std::exception& why) {
  auto attempt = [&](PoolId pool) -> void* {
    try {
      if (target.capture) {
        c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
        return gvm_.allocate(bytes, device, stream, pool);
      }
      return gvm_.allocate(bytes, device, stream, pool);
    } catch (const out_of_memory&) {
      return nullptr;
    }
  };
  // gvmalloc has already released its cache and retried. What PyTorch's
  // allocator also does before it gives up: the free-memory callbacks
  // registered with PyTorch (CUDA IPC's, for one), then the pools marked
  // use_on_oom, for a request outside every pool.
  bool freed = false;
  auto* callbacks = c10::FreeCudaMemoryCallbacksRegistry();
  for (const std::string& name : callbacks->Keys()) {
    freed = callbacks->Create(name)->Execute() || freed;
  }
  if (freed) {
    if (void* p = attempt(target.pool)) return p;
  }
  if (target.key.is_default()) {
    for (const Target& t : device_state(device).pools.use_on_oom_targets()) {
      if (t.custom) continue;
      if (void* p = attempt(t.pool)) return p;
    }
  }
  raise_oom(bytes, device, stream, target, why.what());
}

void Backend::raise_oom(size_t bytes, int device, cudaStream_t stream, const Target& target,
                        const std::string& reason) {
  Device& ds = device_state(device);
  ds.counters.on_oom();
  std::pair<std::size_t, std::size_t> memory{0, 0};
  if (target.capture) {
    c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    memory = device_memory(device);
  } else {
    memory = device_memory(device);
  }
  const auto [device_free, device_total] = memory;
  const CountersSnapshot c = ds.counters.read();
  const auto allocated = static_cast<std::size_t>(c.allocated_bytes[kStatAll].current);
  std::size_t reserved = 0;
  try {
    reserved = gvm_.device_stats(device).reserved_bytes;
  } catch (const std::exception&) {
    reserved = 0;  // the message says less; the error is still raised
  }
  if (history_.recording()) history_.on_oom(device, device_free, bytes, stream, target.key);
  if (c10::memoryProfilingEnabled()) {
    c10::reportOutOfMemoryToProfiler(
        static_cast<std::int64_t>(bytes), allocated, reserved,
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  }
  std::vector<cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard lock(observers_mutex_);
    observers = oom_observers_;
  }
  for (const auto& observer : observers) observer(device, allocated, device_total, device_free);
  OomFacts f;
  f.device = device;
  f.requested = bytes;
  f.device_total = device_total;
  f.device_free = device_free;
  f.allocated = allocated;
  f.reserved = reserved;
  f.reason = reason;
  TORCH_CHECK_WITH(OutOfMemoryError, false, oom_message(f));
  throw std::logic_error("unreachable");
}

// ---- free ------------------------------------------------------------------

void Backend::free_block(void* ptr) {
  if (ptr == nullptr) return;
  std::shared_ptr<c10::GatheredContext> context;
  const bool recording = history_.recording();
  if (recording) context = history_.context_for_free();
  if (const auto* trace = c10::impl::GPUTrace::get_trace(); C10_UNLIKELY(trace != nullptr)) {
    (*trace)->trace_gpu_memory_deallocation(c10::kCUDA, address(ptr));
  }
  if (any_custom_.load(std::memory_order_relaxed)) {
    if (auto r = custom_blocks_.take(ptr)) {
      // A pool allocator of its own frees at once: the streams the block was
      // recorded on must be done with it first.
      for (const auto& [stream, device] : r->uses) {
        (void)device;
        C10_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
      }
      std::static_pointer_cast<cca::CUDAAllocator>(r->custom)->raw_delete(ptr);
      device_state(r->device).counters.on_free(r->requested);
      if (recording)
        history_.on_free(r->device, address(ptr), torch_rounded(r->requested), r->stream,
                         std::move(context));
      return;
    }
  }
  const FreedBlock f = gvm_.deallocate(ptr);
  Device& ds = device_state(f.device);
  ds.counters.on_free(f.requested);
  if (recording)
    history_.on_free(f.device, address(ptr), torch_rounded(f.requested), nullptr,
                     std::move(context));
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    report_to_profiler(ptr, -static_cast<std::int64_t>(torch_rounded(f.requested)),
                       ds.counters.read(), gvm_.reserved_bytes(f.device), f.device);
  }
  // torch.cuda.memory.caching_allocator_enable(False): nothing stays cached.
  if (!caching_.load(std::memory_order_relaxed)) gvm_.trim(f.device);
}

void Backend::raw_delete(void* ptr) {
  try {
    free_block(ptr);
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("gvmalloc: invalid device pointer " + std::to_string(address(ptr)) + ": " + e.what());
  }
}

void Backend::delete_block(void* ptr) noexcept {
  try {
    instance().free_block(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gvmalloc: freeing a tensor's memory at 0x%llx failed: %s\n",
                 static_cast<unsigned long long>(address(ptr)), e.what());
  } catch (...) {
    std::fprintf(stderr, "gvmalloc: freeing a tensor's memory at 0x%llx failed\n",
                 static_cast<unsigned long long>(address(ptr)));
  }
}

void Backend::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

// ---- streams ---------------------------------------------------------------

void Backend::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  if (!ptr.get()) return;
  // Memory that is not ours (a tensor shared from another process, one made
  // from a pointer) is left to whoever owns it, as PyTorch's allocator does.
  if (ptr.get_deleter() != &Backend::delete_block) return;
  if (any_custom_.load(std::memory_order_relaxed) &&
      custom_blocks_.add_use(ptr.get(), stream.stream(), stream.device_index())) {
    return;
  }
  torch_errors("record_stream",
               [&] { gvm_.record_stream(ptr.get(), stream.stream(), stream.device_index()); });
}

// ---- lifecycle and settings ------------------------------------------------

bool Backend::initialized() {
  return initialized_.load(std::memory_order_acquire);
}

void Backend::init(int device_count) {
  device_count_.store(device_count, std::memory_order_relaxed);
  const double fraction = cca::CUDAAllocatorConfig::per_process_memory_fraction();
  if (fraction < 1.0) {
    // PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:f is honoured; the
    // rest of PyTorch's allocator settings are its own (gvmalloc reads GVM_CONF).
    // A failure here must not fail CUDA's start: it is said, not raised.
    try {
      for (int d = 0; d < device_count; ++d)
        setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(d));
    } catch (const c10::Error& e) {
      TORCH_WARN("gvmalloc: PYTORCH_CUDA_ALLOC_CONF's per_process_memory_fraction:", fraction,
                 " is not applied: ", e.what_without_backtrace());
    }
  }
  initialized_.store(true, std::memory_order_release);
}

double Backend::getMemoryFraction(c10::DeviceIndex device) {
  const int d = checked_device(device);
  const double f = torch_errors("memory fraction", [&] { return gvm_.memory_fraction(d); });
  return f > 0.0 ? f : 1.0;
}

void Backend::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  const int d = checked_device(device);
  TORCH_CHECK(fraction > 0.0 && fraction <= 1.0, "gvmalloc: memory fraction ", fraction,
              " is not in (0, 1] (a fraction of 0 would refuse every allocation; gvmalloc does not "
              "take it)");
  torch_errors("set_per_process_memory_fraction", [&] { gvm_.set_memory_fraction(d, fraction); });
}

void Backend::enable(bool value) {
  caching_.store(value, std::memory_order_relaxed);
}
bool Backend::isEnabled() const {
  return caching_.load(std::memory_order_relaxed);
}

void Backend::emptyCache(c10::MempoolId_t mempool_id) {
  const MempoolKey key = key_of(mempool_id);
  if (key.is_default()) {
    torch_errors("empty_cache", [&] { gvm_.trim(-1); });
    return;
  }
  const int n = device_count_.load(std::memory_order_relaxed);
  for (int d = 0; d < n; ++d) {
    if (auto t = device_state(d).pools.find(key); t && !t->custom) {
      torch_errors("empty_cache of a pool", [&] { gvm_.trim_pool(t->pool); });
    }
  }
}

void Backend::cacheInfo(c10::DeviceIndex device, size_t* largestBlock) {
  const int d = checked_device(device);
  // The largest block an allocation can get without waiting for memory to be
  // freed: the free memory of the device (the arena grows into it), or a
  // larger free block in the cache. cuDNN sizes its benchmark workspaces by it.
  if (*largestBlock == 0) *largestBlock = device_memory(d).first;
  *largestBlock = std::max(*largestBlock,
                           torch_errors("cacheInfo", [&] { return gvm_.largest_cached_block(d); }));
}

// ---- statistics ------------------------------------------------------------

cda::DeviceStats Backend::getDeviceStats(c10::DeviceIndex device) {
  const int d = checked_device(device);
  Device& ds = device_state(d);
  const CountersSnapshot c = ds.counters.read();
  const DeviceStats g = torch_errors("memory_stats", [&] { return gvm_.device_stats(d); });
  DeviceStats base;
  {
    std::lock_guard lock(ds.base_mutex);
    base = ds.base;
  }
  cda::DeviceStats s;
  for (int t = 0; t < kStatTypes; ++t) {
    const auto i = static_cast<std::size_t>(t);
    set_stat(s.allocation[i], c.allocation[i]);
    set_stat(s.allocated_bytes[i], c.allocated_bytes[i]);
    set_stat(s.requested_bytes[i], c.requested_bytes[i]);
    // A freed block is gvmalloc's at once (a reuse by another stream waits
    // inside the allocator), so nothing is active that is not allocated.
    set_stat(s.active[i], c.allocation[i]);
    set_stat(s.active_bytes[i], c.allocated_bytes[i]);
  }
  // Reserved memory and segments are gvmalloc's: one arena per device, which
  // PyTorch's tables show as the large pool (docs/pytorch.md).
  c10::CachingAllocator::Stat reserved;
  reserved.current = as_i64(g.reserved_bytes);
  reserved.peak = std::max(as_i64(g.peak_reserved_bytes), reserved.current);
  s.reserved_bytes[kStatAll] = reserved;
  s.reserved_bytes[kStatLarge] = reserved;
  c10::CachingAllocator::Stat segments;
  segments.current = as_i64(g.chunks_mapped) - as_i64(g.chunks_unmapped);
  std::int64_t peak = ds.segment_peak.load(std::memory_order_relaxed);
  while (segments.current > peak && !ds.segment_peak.compare_exchange_weak(
                                        peak, segments.current, std::memory_order_relaxed)) {
  }
  segments.peak = std::max(peak, segments.current);
  segments.allocated = as_i64(g.chunks_mapped - base.chunks_mapped);
  segments.freed = as_i64(g.chunks_unmapped - base.chunks_unmapped);
  s.segment[kStatAll] = segments;
  s.segment[kStatLarge] = segments;
  s.num_alloc_retries = as_i64(g.oom_retries - base.oom_retries);
  s.num_ooms = c.num_ooms;
  s.num_sync_all_streams = as_i64(g.fences - base.fences);
  s.num_device_alloc = as_i64(g.chunks_mapped - base.chunks_mapped);
  s.num_device_free = as_i64(g.chunks_unmapped - base.chunks_unmapped);
  s.max_split_size = -1;  // PyTorch's "no limit": gvmalloc never refuses to split a block
  return s;
}

void Backend::resetAccumulatedStats(c10::DeviceIndex device) {
  const int d = checked_device(device);
  Device& ds = device_state(d);
  const DeviceStats g =
      torch_errors("reset_accumulated_memory_stats", [&] { return gvm_.device_stats(d); });
  ds.counters.reset_accumulated();
  std::lock_guard lock(ds.base_mutex);
  ds.base = g;
}

void Backend::resetPeakStats(c10::DeviceIndex device) {
  const int d = checked_device(device);
  Device& ds = device_state(d);
  ds.counters.reset_peak();
  torch_errors("reset_peak_memory_stats", [&] { gvm_.reset_peak_stats(d); });
  const DeviceStats g =
      torch_errors("reset_peak_memory_stats", [&] { return gvm_.device_stats(d); });
  ds.segment_peak.store(as_i64(g.chunks_mapped) - as_i64(g.chunks_unmapped),
                        std::memory_order_relaxed);
}

// ---- private pools: CUDA graphs, MemPool ---------------------------------

void Backend::createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                 std::shared_ptr<cca::CUDAAllocator> allocator) {
  const int d = checked_device(device);
  // MemPool(allocator=<this backend>) is an ordinary pool of ours.
  if (allocator.get() == this) allocator.reset();
  torch_errors("creating a memory pool", [&] {
    device_state(d).pools.create_or_incref(key_of(mempool_id), std::shared_ptr<void>(allocator),
                                           pool_maker(d));
  });
}

void Backend::beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                  std::function<bool(cudaStream_t)> filter) {
  const int d = checked_device(device);
  Device& ds = device_state(d);
  // A filter that already accepts the current stream routes a thread or a
  // stream (use_mem_pool, the warm-up runs of torch.compile's CUDA graph
  // trees). One that does not is a CUDA graph capture about to begin on it:
  // CUDAGraph::capture_begin opens the route just before cudaStreamBeginCapture.
  const bool capture = !filter(c10::cuda::getCurrentCUDAStream(device).stream());
  auto route = [f = std::move(filter)](void* stream) {
    return f(static_cast<cudaStream_t>(stream));
  };
  const MempoolKey key = key_of(mempool_id);
  const Target t = torch_errors("allocating to a private pool",
                                [&] { return ds.pools.begin(key, route, capture, pool_maker(d)); });
  if (capture && !t.custom) {
    try {
      gvm_.begin_capture(t.pool);
    } catch (...) {
      ds.pools.end(key);
      if (auto p = ds.pools.release(key)) {
        try {
          gvm_.release_pool(*p);
        } catch (...) {
        }
      }
      torch_errors("beginning a CUDA graph capture", [] { throw; });
    }
  }
}

void Backend::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  const int d = checked_device(device);
  const std::optional<Target> t = device_state(d).pools.end(key_of(mempool_id));
  TORCH_CHECK(t.has_value(), "gvmalloc: endAllocateToPool for pool (", mempool_id.first, ", ",
              mempool_id.second, "), which has no allocation under way on device ", d);
  if (t->capture && !t->custom && t->pool != 0) {
    torch_errors("ending a CUDA graph capture", [&] { gvm_.end_capture(t->pool); });
  }
}

void Backend::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  const int d = checked_device(device);
  const std::optional<PoolId> pool = torch_errors(
      "releasing a memory pool", [&] { return device_state(d).pools.release(key_of(mempool_id)); });
  if (pool) torch_errors("releasing a memory pool", [&] { gvm_.release_pool(*pool); });
}

int Backend::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  return device_state(checked_device(device)).pools.use_count(key_of(mempool_id));
}

void Backend::setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) {
  const int d = checked_device(device);
  torch_errors("use_on_oom",
               [&] { device_state(d).pools.set_use_on_oom(key_of(mempool_id), use_on_oom); });
}

void Backend::setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  // Recorded (PoolTable::no_split) for when gvmalloc's pools take the hint;
  // today a gvmalloc pool places blocks as its heap does (docs/pytorch.md).
  const int d = checked_device(device);
  torch_errors("no_split", [&] { device_state(d).pools.set_no_split(key_of(mempool_id)); });
}

// ---- memory layout (memory_map) ---------------------------------------------

std::vector<SegmentView> Backend::memory_map(int device) const {
  return torch_errors("reading gvmalloc's memory map", [&] { return gvm_.memory_map(device); });
}

int Backend::device_count() const {
  int n = device_count_.load(std::memory_order_relaxed);
  if (n == 0 && cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  return n;
}

cca::SnapshotInfo Backend::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  const int n = device_count();
  cca::SnapshotInfo info;
  for (int d = 0; d < n; ++d) {
    if (history_.recording()) history_.on_snapshot(d);
    auto segments =
        snapshot_segments(memory_map(d), d, device_state(d).pools, history_, key_of(mempool_id));
    std::move(segments.begin(), segments.end(), std::back_inserter(info.segments));
  }
  if (include_traces) {
    info.device_traces = history_.traces(n);
    info.external_annotations = history_.annotations();
  }
  info.config_metadata = snapshot_settings(gvm_.config_text());
  return info;
}

void* Backend::getBaseAllocation(void* ptr, size_t* size) {
  if (any_custom_.load(std::memory_order_relaxed)) {
    if (auto r = custom_blocks_.find(ptr)) {
      if (size != nullptr) *size = r->requested;
      return ptr;
    }
  }
  const int n = device_count();
  for (int d = 0; d < n; ++d) {
    if (auto seg = containing_segment(memory_map(d), ptr)) {
      if (size != nullptr) *size = seg->second;
      return seg->first;
    }
  }
  fail("gvmalloc: getBaseAllocation: " + std::to_string(address(ptr)) +
       " is not in memory gvmalloc holds");
}

std::vector<cca::StreamSegmentSize> Backend::getExpandableSegmentSizes(c10::DeviceIndex device) {
  return segment_sizes(memory_map(checked_device(device)));
}

bool Backend::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                       const std::unordered_set<void*>& expected_live_allocations) {
  const int d = checked_device(device);
  const auto t = device_state(d).pools.find(key_of(mempool_id));
  TORCH_CHECK(t.has_value() && !t->custom, "gvmalloc: checkPoolLiveAllocations: no gvmalloc pool (",
              mempool_id.first, ", ", mempool_id.second, ") on device ", d);
  const std::vector<BlockView> live = live_blocks(memory_map(d), t->pool);
  if (live.size() != expected_live_allocations.size()) return false;
  return std::all_of(live.begin(), live.end(), [&](const BlockView& b) {
    return expected_live_allocations.contains(reinterpret_cast<void*>(b.addr));
  });
}

// ---- pool checkpoints (torch.compile's CUDA graph trees) -------------------

std::shared_ptr<cca::AllocatorState> Backend::getCheckpointState(c10::DeviceIndex device,
                                                                 c10::MempoolId_t id) {
  const int d = checked_device(device);
  const MempoolKey key = key_of(id);
  const auto t = device_state(d).pools.find(key);
  TORCH_CHECK(t.has_value() && !t->custom, "gvmalloc: getCheckpointState: no gvmalloc pool (",
              id.first, ", ", id.second, ") on device ", d);
  auto state = std::make_shared<PoolCheckpoint>();
  state->device = d;
  state->key = key;
  state->pool = t->pool;
  state->live = live_blocks(memory_map(d), t->pool);
  return state;
}

cca::CheckpointDelta Backend::setCheckpointPoolState(c10::DeviceIndex device,
                                                     std::shared_ptr<cca::AllocatorState> pps) {
  const auto* state = dynamic_cast<const PoolCheckpoint*>(pps.get());
  TORCH_CHECK(state != nullptr,
              "gvmalloc: setCheckpointPoolState: not a checkpoint of gvmalloc's backend");
  TORCH_CHECK(state->device == device, "gvmalloc: setCheckpointPoolState: a checkpoint of device ",
              state->device, " restored on device ", static_cast<int>(device));
  const auto t = device_state(state->device).pools.find(state->key);
  TORCH_CHECK(t.has_value() && t->pool == state->pool, "gvmalloc: setCheckpointPoolState: pool (",
              state->key.first, ", ", state->key.second, ") is gone");
  const CheckpointPlan plan =
      plan_restore(*state, live_blocks(memory_map(state->device), state->pool));
  cca::CheckpointDelta delta;
  for (void* p : plan.to_free) {
    free_block(p);
    delta.ptrs_freed.push_back(p);
  }
  for (const BlockView& b : plan.to_restore) {
    void* p = torch_errors("restoring a pool checkpoint", [&] {
      return gvm_.allocate_at(reinterpret_cast<void*>(b.addr), b.requested, b.stream, state->pool);
    });
    device_state(state->device).counters.on_alloc(b.requested);
    delta.dataptrs_allocd.emplace_back(
        p, p, &Backend::delete_block,
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(state->device)));
  }
  return delta;
}

// ---- IPC, peers ------------------------------------------------------------

cca::ShareableHandle Backend::shareIpcHandle(void* /*ptr*/) {
  fail(
      "gvmalloc: this CUDA tensor cannot be shared with another process (CUDA IPC, as "
      "torch.multiprocessing does): gvmalloc's blocks live in a virtual-memory arena "
      "(cuMemCreate + cuMemMap), which cudaIpcGetMemHandle cannot export, and gvmalloc does not "
      "export its chunks as shareable handles. Send the tensor as a CPU tensor "
      "(tensor.cpu(); DataLoader workers return CPU tensors by default), or run the process "
      "that shares CUDA tensors without gvmalloc.torch.enable()");
}

std::shared_ptr<void> Backend::getIpcDevPtr(std::string /*handle*/) {
  fail(
      "gvmalloc: opening a CUDA tensor shared by another process (CUDA IPC) is not supported by "
      "gvmalloc's PyTorch backend; have the other process send a CPU tensor, or run this one "
      "without gvmalloc.torch.enable()");
}

void Backend::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  // Context peer access, which PyTorch turns on before a copy between
  // devices. It concerns cudaMalloc memory only: gvmalloc's blocks are
  // reached by peers as its peer policy says (docs/peer-access.md).
  c10::cuda::CUDAGuard guard(dev);
  const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else {
    C10_CUDA_CHECK(err);
  }
}

cudaError_t Backend::memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                                 size_t count, cudaStream_t stream, bool /*p2p_enabled*/) {
  // Every gvmalloc block is cuMemMap'ed memory, which a plain cudaMemcpyAsync
  // between devices cannot copy without access granted: the peer copy can.
  if (dstDevice == srcDevice)
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
}

// ---- history ---------------------------------------------------------------

bool Backend::isHistoryEnabled() {
  return history_.enabled();
}

void Backend::recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                            size_t alloc_trace_max_entries, cca::RecordContext when,
                            bool clearHistory, const std::vector<std::string>& skip_actions) {
  torch_errors("_record_memory_history", [&] {
    history_.configure(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory,
                       skip_actions);
  });
}

void Backend::recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) {
  history_.annotate(md);
}

void Backend::pushCompileContext(std::string& md) {
  History::push_compile_context(md);
}
void Backend::popCompileContext() {
  History::pop_compile_context();
}
void Backend::setUserMetadata(const std::string& metadata) {
  History::set_user_metadata(metadata);
}
std::string Backend::getUserMetadata() {
  return History::user_metadata();
}

void Backend::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard lock(observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

void Backend::attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) {
  history_.attach_tracker(std::move(tracker));
}

std::string Backend::name() {
  return "gvmalloc";
}

}  // namespace gvm::torch_backend
