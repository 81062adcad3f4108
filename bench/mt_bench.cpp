// gvm-bench-mt: allocation throughput with 1-16 threads, each on its own
// stream, against one allocator shared by all of them (docs/benchmarks.md).
//
//   BM_threads/<impl>/threads:<n>  every thread keeps kLive blocks of
//       256 B-4 MiB (log-uniform) live and per iteration frees a random one
//       and allocates a random size in its place, on its own stream (a fixed
//       sequence per thread index, the same for every impl). items_per_second
//       is the aggregate rate of operations (alloc or free) of all threads,
//       over wall time (UseRealTime).
//
//   gvm_cuda          one gvm::Allocator on the CUDA driver; per-thread streams
//                     from TestDriver::stream_create
//   cudaMallocAsync   the device's default pool (release threshold UINT64_MAX),
//                     per-thread cudaStreamNonBlocking streams
//   torch             PyTorch's CUDACachingAllocator (torch_expandable when
//                     PYTORCH_CUDA_ALLOC_CONF says expandable_segments:True)
//   gvm_sim_h200      gvm::Allocator on a simulated H200: runs without a GPU
//
// Without a GPU (or torch) those variants stop with SkipWithError and why.
#include <benchmark/benchmark.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "torch_baseline.hpp"

#if GVM_BENCH_HAVE_CUDART
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr int kDevice = 0;
// 100 live blocks per thread averaging ~0.43 MiB: 16 threads hold ~0.7 GiB,
// which fits any GPU, while each thread's set still spans every size class.
constexpr std::size_t kLive = 100;
constexpr double kMinBytes = 256;
constexpr double kMaxBytes = 4.0 * 1024 * 1024;
constexpr std::size_t kSteps = std::size_t{1} << 14;
constexpr int kMaxThreads = 16;

// --- the workload ---------------------------------------------------------------

struct Plan {
  std::vector<std::size_t> initial;  // kLive sizes
  std::vector<std::uint32_t> slot;   // which live block each step replaces
  std::vector<std::size_t> bytes;    // its new size
};

// mt19937_64's output is fixed by the standard; the sizes are derived here
// (std:: distributions differ between standard libraries).
std::size_t log_uniform(std::mt19937_64& rng) {
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<std::size_t>(
      std::exp(std::log(kMinBytes) + u * (std::log(kMaxBytes) - std::log(kMinBytes))));
}

const Plan& plan_for(int thread) {
  static const std::vector<Plan> plans = [] {
    std::vector<Plan> v(kMaxThreads);
    for (int t = 0; t < kMaxThreads; ++t) {
      std::mt19937_64 rng(20261201 + static_cast<std::uint64_t>(t));
      for (std::size_t i = 0; i < kLive; ++i) v[t].initial.push_back(log_uniform(rng));
      for (std::size_t i = 0; i < kSteps; ++i) {
        v[t].slot.push_back(static_cast<std::uint32_t>(rng() % kLive));
        v[t].bytes.push_back(log_uniform(rng));
      }
    }
    return v;
  }();
  return plans[static_cast<std::size_t>(thread % kMaxThreads)];
}

// --- allocators under test ----------------------------------------------------------

// One thread's view: its own stream on device 0. Errors throw.
class ThreadCtx {
 public:
  virtual ~ThreadCtx() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) = 0;
  virtual void synchronize() = 0;
};

// The allocator every thread of one benchmark run shares.
class Shared {
 public:
  virtual ~Shared() = default;
  virtual std::unique_ptr<ThreadCtx> make_thread() = 0;
};

// gvmalloc: a driver per process, a fresh Allocator per benchmark run.
struct DriverEnv {
  std::unique_ptr<gvm::vmm::TestDriver> driver;
  std::string why_not;
};

DriverEnv& cuda_env() {
  static DriverEnv env = [] {
    DriverEnv e;
    std::string why;
    e.driver = gvm::vmm::try_load_cuda_test_driver(&why);
    if (!e.driver) e.why_not = why.rfind("no CUDA driver", 0) == 0 ? why : "no CUDA driver: " + why;
    return e;
  }();
  return env;
}

DriverEnv& sim_env() {
  static DriverEnv env{gvm::vmm::SimDriver::uniform(gvm::vmm::Profile::h200, 1), ""};
  return env;
}

class GvmThread final : public ThreadCtx {
 public:
  GvmThread(gvm::vmm::TestDriver& driver, gvm::Allocator& allocator)
      : driver_(driver), allocator_(allocator) {
    gvm::vmm::check(driver_.stream_create(kDevice, &stream_), "cuStreamCreate");
  }
  ~GvmThread() override {
    (void)driver_.stream_synchronize(kDevice, stream_);
    (void)driver_.stream_destroy(kDevice, stream_);
  }
  void* allocate(std::size_t bytes) override {
    return allocator_.allocate(bytes, kDevice, stream_);
  }
  void deallocate(void* p, std::size_t bytes) override {
    allocator_.deallocate(p, bytes, kDevice, stream_);
  }
  void synchronize() override {
    gvm::vmm::check(driver_.stream_synchronize(kDevice, stream_), "cuStreamSynchronize");
  }

 private:
  gvm::vmm::TestDriver& driver_;
  gvm::Allocator& allocator_;
  gvm::vmm::StreamHandle stream_ = nullptr;
};

class GvmShared final : public Shared {
 public:
  explicit GvmShared(gvm::vmm::TestDriver& driver)
      : driver_(driver), allocator_(driver, gvm::config_from_env()) {}
  std::unique_ptr<ThreadCtx> make_thread() override {
    return std::make_unique<GvmThread>(driver_, allocator_);
  }

 private:
  gvm::vmm::TestDriver& driver_;
  gvm::Allocator allocator_;
};

#if GVM_BENCH_HAVE_CUDART
void cuda_check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                             ")");
  }
}

// Device 0 present, its default pool kept warm; once per process.
const std::string& runtime_why_not() {
  static const std::string why = []() -> std::string {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) return std::string("no CUDA device (") + cudaGetErrorString(err) + ")";
    if (count == 0) return "no CUDA device";
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

class RuntimeThread final : public ThreadCtx {
 public:
  explicit RuntimeThread(bool torch) : torch_(torch) {
    cuda_check(cudaSetDevice(kDevice), "cudaSetDevice");  // per host thread
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~RuntimeThread() override {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  void* allocate(std::size_t bytes) override {
    if (torch_) return gvm::bench::torch_alloc(bytes, stream_);
    void* p = nullptr;
    cuda_check(cudaMallocAsync(&p, bytes, stream_),
               "cudaMallocAsync(" + std::to_string(bytes) + ")");
    return p;
  }
  void deallocate(void* p, std::size_t) override {
    if (torch_) {
      gvm::bench::torch_free(p);
    } else {
      cuda_check(cudaFreeAsync(p, stream_), "cudaFreeAsync");
    }
  }
  void synchronize() override {
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  bool torch_;
  cudaStream_t stream_ = nullptr;
};

class RuntimeShared final : public Shared {
 public:
  explicit RuntimeShared(bool torch) : torch_(torch) {}
  std::unique_ptr<ThreadCtx> make_thread() override {
    return std::make_unique<RuntimeThread>(torch_);
  }

 private:
  bool torch_;
};
#endif  // GVM_BENCH_HAVE_CUDART

enum class Kind { gvm_cuda, cuda_malloc_async, torch, gvm_sim_h200, count };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::gvm_cuda: return "gvm_cuda";
    case Kind::cuda_malloc_async: return "cudaMallocAsync";
    case Kind::torch: return gvm::bench::torch_impl_name();
    case Kind::gvm_sim_h200: return "gvm_sim_h200";
    case Kind::count: break;
  }
  return "?";
}

std::shared_ptr<Shared> make_shared_impl(Kind kind, std::string* why) {
  switch (kind) {
    case Kind::gvm_cuda:
    case Kind::gvm_sim_h200: {
      DriverEnv& env = kind == Kind::gvm_cuda ? cuda_env() : sim_env();
      if (!env.driver) {
        *why = env.why_not;
        return nullptr;
      }
      return std::make_shared<GvmShared>(*env.driver);
    }
    case Kind::cuda_malloc_async:
    case Kind::torch:
#if GVM_BENCH_HAVE_CUDART
      if (kind == Kind::torch && !gvm::bench::torch_baseline_available(why)) return nullptr;
      if (!runtime_why_not().empty()) {
        *why = runtime_why_not();
        return nullptr;
      }
      return std::make_shared<RuntimeShared>(kind == Kind::torch);
#else
      *why = "built without the CUDA runtime (CUDA::cudart not found)";
      return nullptr;
#endif
    case Kind::count: break;
  }
  *why = "unknown implementation";
  return nullptr;
}

// The threads of one run share one allocator: the first to arrive makes it,
// the last to let go destroys it (every thread takes its copy before the
// timing loop, whose start is a barrier, so no thread can drop the last copy
// while another has yet to take one).
std::shared_ptr<Shared> acquire(Kind kind, std::string* why) {
  static std::mutex mutex;
  static std::array<std::weak_ptr<Shared>, static_cast<std::size_t>(Kind::count)> current;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = current[static_cast<std::size_t>(kind)];
  if (auto s = slot.lock()) return s;
  std::shared_ptr<Shared> s;
  try {
    s = make_shared_impl(kind, why);
  } catch (const std::exception& e) {
    *why = e.what();
  }
  slot = s;
  return s;
}

void release_all(ThreadCtx& ctx, std::vector<void*>& ptrs, const std::vector<std::size_t>& sizes) {
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    if (ptrs[i] == nullptr) continue;
    try {
      ctx.deallocate(ptrs[i], sizes[i]);
    } catch (...) {
    }
    ptrs[i] = nullptr;
  }
  try {
    ctx.synchronize();
  } catch (...) {
  }
}

void bm_threads(benchmark::State& state, Kind kind) {
  std::string why;
  std::shared_ptr<Shared> shared = acquire(kind, &why);
  std::unique_ptr<ThreadCtx> ctx;
  if (shared) {
    try {
      ctx = shared->make_thread();
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  const Plan& plan = plan_for(state.thread_index());
  std::vector<void*> ptrs(kLive, nullptr);
  std::vector<std::size_t> sizes = plan.initial;
  if (ctx) {
    try {
      for (std::size_t i = 0; i < kLive; ++i) ptrs[i] = ctx->allocate(sizes[i]);
      ctx->synchronize();
    } catch (const std::exception& e) {
      why = e.what();
      release_all(*ctx, ptrs, sizes);
      ctx.reset();
    }
  }
  if (!ctx) {
    state.SkipWithError(why.c_str());
    // The loop still has to be entered: its start is a barrier the other
    // threads wait at. A skipped state runs no iteration.
    for (auto _ : state) {
    }
    return;
  }
  std::size_t step = 0;
  for (auto _ : state) {
    const std::uint32_t s = plan.slot[step];
    try {
      ctx->deallocate(ptrs[s], sizes[s]);
      ptrs[s] = nullptr;
      sizes[s] = plan.bytes[step];
      ptrs[s] = ctx->allocate(sizes[s]);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
    if (++step == kSteps) step = 0;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(2 * state.iterations()));  // operations
  release_all(*ctx, ptrs, sizes);
}

void register_benchmarks() {
  for (Kind kind : {Kind::gvm_cuda, Kind::cuda_malloc_async, Kind::torch, Kind::gvm_sim_h200}) {
    benchmark::RegisterBenchmark((std::string("BM_threads/") + kind_name(kind)).c_str(),
                                 [kind](benchmark::State& st) { bm_threads(st, kind); })
        ->ThreadRange(1, kMaxThreads)  // 1, 2, 4, 8, 16
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  try {
    benchmark::AddCustomContext("gvm_conf", gvm::to_string(gvm::config_from_env()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gvm-bench-mt: GVM_CONF: %s\n", e.what());
    return 1;
  }
  const char* torch_conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  benchmark::AddCustomContext("pytorch_cuda_alloc_conf", torch_conf ? torch_conf : "");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
