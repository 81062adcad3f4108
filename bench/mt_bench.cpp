// gvm-bench-mt: allocation throughput with 1-16 threads, each on its own
// stream, against one allocator shared by all of them (docs/benchmarks.md).
//
//   BM_threads/<impl>/threads:<n>  every thread keeps kLive blocks of
//       256 B-4 MiB (log-uniform) live and per iteration frees a random one
//       and allocates a random size in its place, on its own stream (a fixed
//       sequence per thread index, the same for every impl), after one
//       untimed pass over that sequence (the steady state of a warm cache).
//       items_per_second is the aggregate rate of operations (alloc or free)
//       of all threads, over wall time (UseRealTime).
//
//   gvm_cuda          one gvm::Allocator on the CUDA driver; per-thread streams
//                     from TestDriver::stream_create
//   cudaMallocAsync   the device's default pool (release threshold UINT64_MAX),
//                     per-thread cudaStreamNonBlocking streams
//   torch             PyTorch's CUDACachingAllocator (torch_expandable when
//                     PYTORCH_CUDA_ALLOC_CONF says expandable_segments:True)
//   gvm_sim_h200      gvm::Allocator on a simulated H200: runs without a GPU
//
// The allocators come from the backend layer (bench/backend.hpp); one that
// cannot run here (no GPU, no torch) is not registered, and one line per
// reason on stderr says which and why.
#include <benchmark/benchmark.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "gvm/config.hpp"

namespace {

using gvm::bench::Backend;
using gvm::bench::BackendHost;
using gvm::bench::BackendKind;
using gvm::bench::StreamHandle;

// In the order the results are printed.
constexpr std::array<BackendKind, 4> kKinds = {BackendKind::gvm_cuda,
                                               BackendKind::cuda_malloc_async, BackendKind::torch,
                                               BackendKind::gvm_sim_h200};
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

// --- allocators under test (bench/backend.hpp) ------------------------------------

// Every thread of one benchmark run shares one backend: the first to arrive
// makes it, the last to let go destroys it (every thread takes its copy before
// the timing loop, whose start is a barrier, so no thread can drop the last
// copy while another has yet to take one).
std::shared_ptr<Backend> acquire(BackendHost& host, std::string* why) {
  static std::mutex mutex;
  static std::array<std::weak_ptr<Backend>, kKinds.size()> current;
  std::lock_guard<std::mutex> lock(mutex);
  std::size_t slot = 0;
  while (kKinds[slot] != host.kind()) ++slot;
  if (auto s = current[slot].lock()) return s;
  std::shared_ptr<Backend> s;
  try {
    s = host.make_backend();
  } catch (const std::exception& e) {
    *why = e.what();
  }
  current[slot] = s;
  return s;
}

// One thread's view: the shared backend on the thread's own stream.
struct ThreadCtx {
  BackendHost& host;
  std::shared_ptr<Backend> backend;
  StreamHandle stream;

  void* allocate(std::size_t bytes) { return backend->allocate(bytes, stream); }
  void deallocate(void* p, std::size_t bytes) { backend->deallocate(p, bytes, stream); }
  void synchronize() { host.synchronize(stream); }
};

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

void bm_threads(benchmark::State& state, BackendKind kind) {
  std::string why;
  std::unique_ptr<ThreadCtx> ctx;
  if (BackendHost* host = gvm::bench::backend_host(kind, &why)) {
    try {
      host->bind_thread();
      // Stream i belongs to thread i in every run; the host keeps it alive,
      // so it outlives the allocators made over it.
      const StreamHandle stream = host->stream(static_cast<std::size_t>(state.thread_index()));
      if (std::shared_ptr<Backend> backend = acquire(*host, &why)) {
        ctx = std::make_unique<ThreadCtx>(ThreadCtx{*host, std::move(backend), stream});
      }
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
  // One untimed pass over the plan first, for every impl alike: the timed
  // loop measures the steady state of a warm cache (each run of the
  // benchmark makes its allocator anew, and a cold one's growth - driver
  // calls of tens of microseconds to milliseconds - would otherwise fill a
  // short run; docs/benchmarks.md).
  std::size_t step = 0;
  try {
    for (; step < kSteps; ++step) {
      const std::uint32_t s = plan.slot[step];
      ctx->deallocate(ptrs[s], sizes[s]);
      ptrs[s] = nullptr;
      sizes[s] = plan.bytes[step];
      ptrs[s] = ctx->allocate(sizes[s]);
    }
    ctx->synchronize();
  } catch (const std::exception& e) {
    why = e.what();
    release_all(*ctx, ptrs, sizes);
    ctx.reset();
  }
  step = 0;
  if (!ctx) {
    state.SkipWithError(why.c_str());
    for (auto _ : state) {
    }
    return;
  }
  // Driver calls in the timed loop (gvmalloc: stream waits and event records
  // when heaps hand memory to each other), per million operations: read by
  // thread 0 at its first iteration, when every thread is past its warm-up
  // (the loop's start is a barrier), and after its last.
  std::optional<std::uint64_t> calls_before;
  for (auto _ : state) {
    if (state.thread_index() == 0 && step == 0 && !calls_before) calls_before = ctx->backend->driver_calls();
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
  if (calls_before && state.iterations() > 0) {
    if (const auto after = ctx->backend->driver_calls()) {
      const double ops = 2.0 * static_cast<double>(state.iterations()) * state.threads();
      state.counters["driver_calls_per_Mop"] =
          static_cast<double>(*after - *calls_before) * 1e6 / ops;
    }
  }
  release_all(*ctx, ptrs, sizes);
}

// Registers the kinds that can run here; says once per reason which cannot.
void register_benchmarks() {
  for (const std::string& line : gvm::bench::left_out_lines({kKinds.begin(), kKinds.end()})) {
    std::fprintf(stderr, "gvm-bench-mt: %s\n", line.c_str());
  }
  for (BackendKind kind : kKinds) {
    if (gvm::bench::backend_host(kind, nullptr) == nullptr) continue;
    benchmark::RegisterBenchmark(
        (std::string("BM_threads/") + gvm::bench::backend_name(kind)).c_str(),
        [kind](benchmark::State& st) { bm_threads(st, kind); })
        ->ThreadRange(1, kMaxThreads)  // 1, 2, 4, 8, 16
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    benchmark::AddCustomContext("gvm_conf", gvm::to_string(gvm::config_from_env()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gvm-bench-mt: %s\n", e.what());  // "GVM_CONF: ..."
    return 1;
  }
  const char* torch_conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  benchmark::AddCustomContext("pytorch_cuda_alloc_conf", torch_conf ? torch_conf : "");
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
