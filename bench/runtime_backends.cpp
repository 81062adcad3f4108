// The baselines over the CUDA runtime: cudaMalloc / cudaFree, cudaMallocAsync /
// cudaFreeAsync, and PyTorch's CUDACachingAllocator (bench/torch_baseline.hpp).
// They share one host: the runtime on device 0 and its non-blocking streams.
#include <cstdint>
#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.hpp"
#include "torch_baseline.hpp"

#if GVM_BENCH_HAVE_CUDART
#include <cuda_runtime_api.h>
#endif

namespace gvm::bench {

#if GVM_BENCH_HAVE_CUDART

namespace {

constexpr int kDevice = 0;

void cuda_check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                             ")");
  }
}

cudaStream_t as_cuda(StreamHandle s) {
  return static_cast<cudaStream_t>(s);
}

class CudaMallocBackend final : public Backend {
 public:
  void* allocate(std::size_t bytes, StreamHandle) override {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + ")");
    return p;
  }
  void deallocate(void* p, std::size_t, StreamHandle) override {
    cuda_check(cudaFree(p), "cudaFree");
  }
  std::optional<std::size_t> reserved_bytes() override { return std::nullopt; }
  std::optional<std::size_t> peak_reserved_bytes() override { return std::nullopt; }
};

// cudaMallocAsync on the device's default pool (kept warm by the host), or
// cudaMallocFromPoolAsync on a pool of its own (BackendOptions::fresh).
class AsyncBackend final : public Backend {
 public:
  explicit AsyncBackend(bool own_pool) {
    if (own_pool) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = kDevice;
      cuda_check(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
      own_ = true;
      std::uint64_t threshold = UINT64_MAX;  // nothing given back during a pass
      cuda_check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
                 "cudaMemPoolSetAttribute(ReleaseThreshold)");
    } else {
      cuda_check(cudaDeviceGetDefaultMemPool(&pool_, kDevice), "cudaDeviceGetDefaultMemPool");
    }
  }
  AsyncBackend(const AsyncBackend&) = delete;
  AsyncBackend& operator=(const AsyncBackend&) = delete;
  ~AsyncBackend() override {
    if (own_) {
      (void)cudaDeviceSynchronize();
      (void)cudaMemPoolDestroy(pool_);
    }
  }
  void* allocate(std::size_t bytes, StreamHandle stream) override {
    void* p = nullptr;
    if (own_) {
      cuda_check(cudaMallocFromPoolAsync(&p, bytes, pool_, as_cuda(stream)),
                 "cudaMallocFromPoolAsync(" + std::to_string(bytes) + ")");
    } else {
      cuda_check(cudaMallocAsync(&p, bytes, as_cuda(stream)),
                 "cudaMallocAsync(" + std::to_string(bytes) + ")");
    }
    return p;
  }
  void deallocate(void* p, std::size_t, StreamHandle stream) override {
    cuda_check(cudaFreeAsync(p, as_cuda(stream)), "cudaFreeAsync");
  }
  std::optional<std::size_t> reserved_bytes() override {
    return attr(cudaMemPoolAttrReservedMemCurrent);
  }
  std::optional<std::size_t> peak_reserved_bytes() override {
    return attr(cudaMemPoolAttrReservedMemHigh);
  }

 private:
  std::size_t attr(cudaMemPoolAttr a) {
    std::uint64_t v = 0;
    cuda_check(cudaMemPoolGetAttribute(pool_, a, &v), "cudaMemPoolGetAttribute");
    return static_cast<std::size_t>(v);
  }
  cudaMemPool_t pool_ = nullptr;
  bool own_ = false;
};

// PyTorch's allocator lives once per process; `fresh` empties it around the
// backend's life.
class TorchBackend final : public Backend {
 public:
  explicit TorchBackend(bool fresh) : fresh_(fresh) {
    if (!fresh_) return;
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    torch_empty_cache();
    torch_reset_peak();
    if (const std::size_t r = torch_reserved_bytes(); r != 0) {
      std::cerr << "note: PyTorch's allocator still reserves " << r << " bytes after emptyCache\n";
    }
  }
  ~TorchBackend() override {
    if (!fresh_) return;
    (void)cudaDeviceSynchronize();
    torch_empty_cache();
  }
  void* allocate(std::size_t bytes, StreamHandle stream) override {
    return torch_alloc(bytes, stream);
  }
  // raw_delete: the block goes back to the pool of the stream it came from.
  void deallocate(void* p, std::size_t, StreamHandle) override { torch_free(p); }
  std::optional<std::size_t> reserved_bytes() override { return torch_reserved_bytes(); }
  std::optional<std::size_t> peak_reserved_bytes() override { return torch_peak_reserved(); }

 private:
  bool fresh_;
};

class RuntimeHost final : public BackendHost {
 public:
  explicit RuntimeHost(BackendKind kind) : kind_(kind) {}
  RuntimeHost(const RuntimeHost&) = delete;
  RuntimeHost& operator=(const RuntimeHost&) = delete;
  ~RuntimeHost() override {
    for (cudaStream_t s : streams_) (void)cudaStreamDestroy(s);
  }

  BackendKind kind() const override { return kind_; }
  void bind_thread() override { cuda_check(cudaSetDevice(kDevice), "cudaSetDevice"); }
  StreamHandle stream(std::size_t index) override {
    std::lock_guard<std::mutex> lock(mutex_);
    while (streams_.size() <= index) {
      cuda_check(cudaSetDevice(kDevice), "cudaSetDevice");
      cudaStream_t s = nullptr;
      cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      streams_.push_back(s);
    }
    return streams_[index];
  }
  void synchronize(StreamHandle stream) override {
    cuda_check(cudaStreamSynchronize(as_cuda(stream)), "cudaStreamSynchronize");
  }
  std::unique_ptr<Backend> make_backend(const BackendOptions& options) override {
    switch (kind_) {
      case BackendKind::cuda_malloc: return std::make_unique<CudaMallocBackend>();
      case BackendKind::cuda_malloc_async: return std::make_unique<AsyncBackend>(options.fresh);
      case BackendKind::torch: return std::make_unique<TorchBackend>(options.fresh);
      default: break;
    }
    throw std::logic_error("RuntimeHost: not a CUDA runtime backend");
  }

 private:
  BackendKind kind_;
  std::mutex mutex_;
  std::vector<cudaStream_t> streams_;
};

// Device 0 through the runtime, its default pool kept warm (freed memory stays
// in the pool, as a framework runs it); "" when that worked.
const std::string& runtime_problem() {
  static const std::string why = []() -> std::string {
    if (!detail::cuda_driver_problem().empty()) return detail::cuda_driver_problem();
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      return std::string("the CUDA runtime sees no device (cudaGetDeviceCount: ") +
             cudaGetErrorName(err) + ": " + cudaGetErrorString(err) + ")";
    }
    if (count == 0) return "the CUDA runtime sees no device";
    try {
      cuda_check(cudaSetDevice(kDevice), "cudaSetDevice");
      cudaMemPool_t pool = nullptr;
      cuda_check(cudaDeviceGetDefaultMemPool(&pool, kDevice), "cudaDeviceGetDefaultMemPool");
      std::uint64_t threshold = UINT64_MAX;
      cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                 "cudaMemPoolSetAttribute(ReleaseThreshold)");
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }();
  return why;
}

}  // namespace

namespace detail {

BackendHost* runtime_host(BackendKind kind, std::string* why_not) {
  auto fail = [why_not](const std::string& why) -> BackendHost* {
    if (why_not) *why_not = why;
    return nullptr;
  };
  // A build-time reason first: it holds on every machine.
  if (kind == BackendKind::torch && !torch_baseline_built()) {
    std::string why;
    (void)torch_baseline_available(&why);
    return fail(why);
  }
  if (!runtime_problem().empty()) return fail(runtime_problem());
  static RuntimeHost cuda_malloc(BackendKind::cuda_malloc);
  static RuntimeHost cuda_malloc_async(BackendKind::cuda_malloc_async);
  static RuntimeHost torch(BackendKind::torch);
  switch (kind) {
    case BackendKind::cuda_malloc: return &cuda_malloc;
    case BackendKind::cuda_malloc_async: return &cuda_malloc_async;
    case BackendKind::torch: {
      std::string why;
      if (!torch_baseline_available(&why)) return fail(why);
      return &torch;
    }
    default: break;
  }
  return fail("not a CUDA runtime backend");
}

}  // namespace detail

#else  // !GVM_BENCH_HAVE_CUDART

namespace detail {

BackendHost* runtime_host(BackendKind kind, std::string* why_not) {
  if (why_not) {
    *why_not = kind == BackendKind::torch && !torch_baseline_built()
                   ? "built without PyTorch and without the CUDA runtime (CUDA::cudart not found)"
                   : "built without the CUDA runtime (CUDA::cudart not found)";
  }
  return nullptr;
}

}  // namespace detail

#endif  // GVM_BENCH_HAVE_CUDART

}  // namespace gvm::bench
