// gvm-bench-alloc: gvmalloc and the CUDA runtime's allocators side by side, in
// one binary, so every comparison is measured in one run (STYLE.md item 12).
//
//   gvm_cuda         gvm::Allocator on the real driver (CudaDriver)
//   cudaMalloc       cudaMalloc / cudaFree
//   cudaMallocAsync  cudaMallocAsync / cudaFreeAsync on the device's default
//                    pool, release threshold UINT64_MAX so the pool stays warm
//   gvm_sim_h200     gvm::Allocator on a simulated H200 (SimDriver): the front
//                    end and the simulator, no GPU. Runs anywhere, e.g. on CI.
//   torch            PyTorch's CUDACachingAllocator (raw_alloc_with_stream /
//                    raw_delete, bench/torch_baseline.hpp) where CMake found
//                    torch; named torch_expandable when PYTORCH_CUDA_ALLOC_CONF
//                    says expandable_segments:True (tools/bench-all.sh runs
//                    the binary once per mode)
//
// Every implementation allocates on device 0 on one non-default stream made
// once (cudaStreamNonBlocking for the runtime, TestDriver::stream_create for
// gvmalloc), so stream-ordered semantics match. Without a GPU the GPU variants
// are skipped with the reason; the simulated one runs.
//
//   BM_pair/<impl>/<bytes>  one alloc + free pair per iteration, warm (one
//                           pair before the timing). Time = ns per pair.
//   BM_mixed/<impl>         1000 live blocks, sizes log-uniform 256 B-64 MiB;
//                           an iteration frees a random live block and
//                           allocates a random size in its place (one fixed
//                           sequence for every impl). Time = ns per 2 ops;
//                           counter time_per_op = seconds per operation.
//
// Medians: --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
// (docs/replay.md, "gvm-bench-alloc"). gvmalloc reads GVM_CONF.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
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

// One allocator under test, on device 0 and the benchmark stream. Failures
// throw std::runtime_error (or the allocator's own error).
class Impl {
 public:
  virtual ~Impl() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) = 0;
  // Waits for the stream; called outside the timing only.
  virtual void synchronize() = 0;
};

// --- gvmalloc ----------------------------------------------------------------

// A driver and the stream the benchmarks use on it, made once per process.
class GvmEnv {
 public:
  // `driver` null: unavailable, for the reason `why_not`.
  GvmEnv(std::unique_ptr<gvm::vmm::TestDriver> driver, std::string why_not)
      : driver_(std::move(driver)), why_not_(std::move(why_not)) {
    if (!driver_) return;
    const gvm::vmm::Result r = driver_->stream_create(kDevice, &stream_);
    if (r != gvm::vmm::Result::success) {
      why_not_ = "cuStreamCreate failed: " + gvm::vmm::result_name(r);
      stream_ = nullptr;
      driver_.reset();
    }
  }
  GvmEnv(const GvmEnv&) = delete;
  GvmEnv& operator=(const GvmEnv&) = delete;
  ~GvmEnv() {
    if (driver_ && stream_) {
      (void)driver_->stream_synchronize(kDevice, stream_);
      (void)driver_->stream_destroy(kDevice, stream_);
    }
  }

  gvm::vmm::TestDriver* driver() const noexcept { return driver_.get(); }
  gvm::vmm::StreamHandle stream() const noexcept { return stream_; }
  const std::string& why_not() const noexcept { return why_not_; }

 private:
  std::unique_ptr<gvm::vmm::TestDriver> driver_;
  gvm::vmm::StreamHandle stream_ = nullptr;
  std::string why_not_;
};

GvmEnv& cuda_env() {
  static GvmEnv env = [] {
    std::string why;
    auto driver = gvm::vmm::try_load_cuda_test_driver(&why);
    std::string why_not;
    if (!driver) why_not = why.rfind("no CUDA driver", 0) == 0 ? why : "no CUDA driver: " + why;
    return GvmEnv(std::move(driver), std::move(why_not));
  }();
  return env;
}

GvmEnv& sim_env() {
  static GvmEnv env(gvm::vmm::SimDriver::uniform(gvm::vmm::Profile::h200, 1), "");
  return env;
}

class GvmImpl final : public Impl {
 public:
  explicit GvmImpl(GvmEnv& env) : env_(env), allocator_(*env.driver(), gvm::config_from_env()) {}
  void* allocate(std::size_t bytes) override {
    return allocator_.allocate(bytes, kDevice, env_.stream());
  }
  void deallocate(void* p, std::size_t bytes) override {
    allocator_.deallocate(p, bytes, kDevice, env_.stream());
  }
  void synchronize() override {
    gvm::vmm::check(env_.driver()->stream_synchronize(kDevice, env_.stream()),
                    "cuStreamSynchronize");
  }

 private:
  GvmEnv& env_;
  gvm::Allocator allocator_;
};

// --- CUDA runtime baselines --------------------------------------------------

#if GVM_BENCH_HAVE_CUDART
void cuda_check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                             ")");
  }
}

struct RuntimeEnv {
  cudaStream_t stream = nullptr;
  std::string why_not;
  RuntimeEnv() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      why_not = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(err) + ")";
      return;
    }
    if (count == 0) {
      why_not = "no CUDA device";
      return;
    }
    try {
      cuda_check(cudaSetDevice(kDevice), "cudaSetDevice");
      cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      // Keep freed memory in the pool: the warm case, as a framework runs it.
      cudaMemPool_t pool = nullptr;
      cuda_check(cudaDeviceGetDefaultMemPool(&pool, kDevice), "cudaDeviceGetDefaultMemPool");
      std::uint64_t threshold = UINT64_MAX;
      cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                 "cudaMemPoolSetAttribute(ReleaseThreshold)");
    } catch (const std::exception& e) {
      why_not = e.what();
    }
  }
  RuntimeEnv(const RuntimeEnv&) = delete;
  RuntimeEnv& operator=(const RuntimeEnv&) = delete;
  ~RuntimeEnv() {
    if (stream) (void)cudaStreamDestroy(stream);
  }
};

RuntimeEnv& runtime_env() {
  static RuntimeEnv env;
  return env;
}

class CudaMallocImpl final : public Impl {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + ")");
    return p;
  }
  void deallocate(void* p, std::size_t) override { cuda_check(cudaFree(p), "cudaFree"); }
  void synchronize() override {
    cuda_check(cudaStreamSynchronize(runtime_env().stream), "cudaStreamSynchronize");
  }
};

class CudaMallocAsyncImpl final : public Impl {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMallocAsync(&p, bytes, runtime_env().stream),
               "cudaMallocAsync(" + std::to_string(bytes) + ")");
    return p;
  }
  void deallocate(void* p, std::size_t) override {
    cuda_check(cudaFreeAsync(p, runtime_env().stream), "cudaFreeAsync");
  }
  void synchronize() override {
    cuda_check(cudaStreamSynchronize(runtime_env().stream), "cudaStreamSynchronize");
  }
};
// PyTorch's caching allocator on the runtime's benchmark stream.
class TorchImpl final : public Impl {
 public:
  void* allocate(std::size_t bytes) override {
    return gvm::bench::torch_alloc(bytes, runtime_env().stream);
  }
  void deallocate(void* p, std::size_t) override { gvm::bench::torch_free(p); }
  void synchronize() override {
    cuda_check(cudaStreamSynchronize(runtime_env().stream), "cudaStreamSynchronize");
  }
};
#endif  // GVM_BENCH_HAVE_CUDART

// --- which implementation ------------------------------------------------------

enum class Kind { gvm_cuda, cuda_malloc, cuda_malloc_async, gvm_sim_h200, torch };

struct KindInfo {
  Kind kind;
  const char* name;
  const char* label;
};

constexpr KindInfo kKinds[] = {
    {Kind::gvm_cuda, "gvm_cuda", ""},
    {Kind::cuda_malloc, "cudaMalloc", ""},
    {Kind::cuda_malloc_async, "cudaMallocAsync", ""},
    {Kind::gvm_sim_h200, "gvm_sim_h200", "simulated H200: front end only, no GPU"},
    {Kind::torch, "torch", ""},  // named by torch_impl_name() when registered
};

const char* impl_name(const KindInfo& info) {
  return info.kind == Kind::torch ? gvm::bench::torch_impl_name() : info.name;
}

// The implementation, or nullptr and *why_not.
std::unique_ptr<Impl> make_impl(Kind kind, std::string* why_not) {
  switch (kind) {
    case Kind::gvm_cuda: {
      GvmEnv& env = cuda_env();
      if (!env.driver()) {
        *why_not = env.why_not();
        return nullptr;
      }
      return std::make_unique<GvmImpl>(env);
    }
    case Kind::gvm_sim_h200: {
      GvmEnv& env = sim_env();
      if (!env.driver()) {
        *why_not = env.why_not();
        return nullptr;
      }
      return std::make_unique<GvmImpl>(env);
    }
    case Kind::cuda_malloc:
    case Kind::cuda_malloc_async:
#if GVM_BENCH_HAVE_CUDART
      if (!runtime_env().why_not.empty()) {
        *why_not = runtime_env().why_not;
        return nullptr;
      }
      if (kind == Kind::cuda_malloc) return std::make_unique<CudaMallocImpl>();
      return std::make_unique<CudaMallocAsyncImpl>();
#else
      *why_not = "built without the CUDA runtime (CUDA::cudart not found)";
      return nullptr;
#endif
    case Kind::torch:
#if GVM_BENCH_HAVE_CUDART
      if (!gvm::bench::torch_baseline_available(why_not)) return nullptr;
      if (!runtime_env().why_not.empty()) {
        *why_not = runtime_env().why_not;
        return nullptr;
      }
      return std::make_unique<TorchImpl>();
#else
      *why_not = "built without the CUDA runtime (CUDA::cudart not found)";
      return nullptr;
#endif
  }
  *why_not = "unknown implementation";
  return nullptr;
}

// Frees what a benchmark still holds; never throws (used after an error too).
void release_all(Impl& impl, std::vector<void*>& ptrs, const std::vector<std::size_t>& sizes) {
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    if (ptrs[i] == nullptr) continue;
    try {
      impl.deallocate(ptrs[i], sizes[i]);
    } catch (...) {
    }
    ptrs[i] = nullptr;
  }
  try {
    impl.synchronize();
  } catch (...) {
  }
}

// --- BM_pair -------------------------------------------------------------------

void bm_pair(benchmark::State& state, const KindInfo& info) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::string why;
  std::unique_ptr<Impl> impl;
  try {
    impl = make_impl(info.kind, &why);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!impl) {
    state.SkipWithError(why.c_str());
    return;
  }
  if (*info.label) state.SetLabel(info.label);
  try {
    // Warm: the first pair may map memory; it is not what this measures.
    impl->deallocate(impl->allocate(bytes), bytes);
    impl->synchronize();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    try {
      // No benchmark::DoNotOptimize(p): both calls are opaque (virtual, in
      // another library), and with g++ -O2 and Google Benchmark 1.7.1 its
      // "+r,m" asm operand handed deallocate a garbage pointer.
      void* p = impl->allocate(bytes);
      impl->deallocate(p, bytes);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());  // items = pairs
  try {
    impl->synchronize();
  } catch (...) {
  }
}

// --- BM_mixed ------------------------------------------------------------------

constexpr std::size_t kMixedLive = 1000;
constexpr double kMixedMinBytes = 256;
constexpr double kMixedMaxBytes = 64.0 * 1024 * 1024;
// Steps before the sequence repeats; long enough that the live set keeps
// changing over a typical run.
constexpr std::size_t kMixedSteps = std::size_t{1} << 16;

// The same for every implementation: mt19937_64's output is fixed by the
// standard, and the sizes are derived from it here (std:: distributions are
// not portable across standard libraries).
struct MixedPlan {
  std::vector<std::size_t> initial;  // kMixedLive sizes
  std::vector<std::uint32_t> slot;   // which live block each step replaces
  std::vector<std::size_t> bytes;    // its new size
};

std::size_t log_uniform(std::mt19937_64& rng) {
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
  const double lo = std::log(kMixedMinBytes);
  const double hi = std::log(kMixedMaxBytes);
  return static_cast<std::size_t>(std::exp(lo + u * (hi - lo)));
}

const MixedPlan& mixed_plan() {
  static const MixedPlan plan = [] {
    MixedPlan p;
    std::mt19937_64 rng(20261129);
    for (std::size_t i = 0; i < kMixedLive; ++i) p.initial.push_back(log_uniform(rng));
    for (std::size_t i = 0; i < kMixedSteps; ++i) {
      p.slot.push_back(static_cast<std::uint32_t>(rng() % kMixedLive));
      p.bytes.push_back(log_uniform(rng));
    }
    return p;
  }();
  return plan;
}

void bm_mixed(benchmark::State& state, const KindInfo& info) {
  const MixedPlan& plan = mixed_plan();
  std::string why;
  std::unique_ptr<Impl> impl;
  try {
    impl = make_impl(info.kind, &why);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!impl) {
    state.SkipWithError(why.c_str());
    return;
  }
  if (*info.label) state.SetLabel(info.label);
  std::vector<void*> ptrs(kMixedLive, nullptr);
  std::vector<std::size_t> sizes = plan.initial;
  try {
    for (std::size_t i = 0; i < kMixedLive; ++i) ptrs[i] = impl->allocate(sizes[i]);
    impl->synchronize();
  } catch (const std::exception& e) {
    release_all(*impl, ptrs, sizes);
    state.SkipWithError(e.what());
    return;
  }
  std::size_t step = 0;
  for (auto _ : state) {
    const std::uint32_t s = plan.slot[step];
    try {
      impl->deallocate(ptrs[s], sizes[s]);
      ptrs[s] = nullptr;
      sizes[s] = plan.bytes[step];
      ptrs[s] = impl->allocate(sizes[s]);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
    if (++step == kMixedSteps) step = 0;
  }
  const auto ops = static_cast<double>(2 * state.iterations());
  state.SetItemsProcessed(static_cast<std::int64_t>(ops));  // items = operations
  // Seconds per operation (one alloc or one free).
  state.counters["time_per_op"] = benchmark::Counter(
      2, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  release_all(*impl, ptrs, sizes);
}

void register_benchmarks() {
  static const std::int64_t kPairSizes[] = {256, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
  for (const KindInfo& info : kKinds) {
    auto* b = benchmark::RegisterBenchmark((std::string("BM_pair/") + impl_name(info)).c_str(),
                                           [&info](benchmark::State& st) { bm_pair(st, info); });
    for (std::int64_t size : kPairSizes) b->Arg(size);
    b->UseRealTime();
  }
  for (const KindInfo& info : kKinds) {
    benchmark::RegisterBenchmark((std::string("BM_mixed/") + impl_name(info)).c_str(),
                                 [&info](benchmark::State& st) { bm_mixed(st, info); })
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
    const char* torch_conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
    benchmark::AddCustomContext("pytorch_cuda_alloc_conf", torch_conf ? torch_conf : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gvm-bench-alloc: GVM_CONF: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
