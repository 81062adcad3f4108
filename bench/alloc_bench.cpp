// gvm-bench-alloc: gvmalloc and the CUDA runtime's allocators side by side, in
// one binary, so every comparison is measured in one run (docs/benchmarks.md).
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
// The allocators come from the backend layer (bench/backend.hpp). Every one
// allocates on device 0 on one non-default stream made once
// (cudaStreamNonBlocking for the runtime, TestDriver::stream_create for gvmalloc),
// so stream-ordered semantics match. One that cannot run here (no GPU, no
// torch) is not registered; one line per reason on stderr says which and why.
//
//   BM_pair/<impl>/<bytes>  one alloc + free pair per iteration, warm (one
//                           pair before the timing). Time = ns per pair.
//   BM_mixed/<impl>         1000 live blocks, sizes log-uniform 256 B-64 MiB;
//                           an iteration frees a random live block and
//                           allocates a random size in its place (one fixed
//                           plan of 65,536 steps, repeated, for every impl).
//                           Warm: one pass of the plan runs before the timing
//                           (as the pair's first pair does), so the time does
//                           not depend on how long the run is. Time = ns per
//                           2 ops; counter time_per_op = seconds per operation.
//   BM_mixed_first_pass/<impl>  that first pass alone, from a fresh allocator
//                           with the 1000 blocks allocated: the growth to the
//                           workload's working set (every allocator's
//                           cudaMalloc or cuMemCreate calls are here). Exactly
//                           65,536 iterations, 3 repetitions.
//
// Medians: --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
// (docs/replay.md, "gvm-bench-alloc"). gvmalloc reads GVM_CONF.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.hpp"
#include "gvm/config.hpp"

namespace {

using gvm::bench::Backend;
using gvm::bench::BackendHost;
using gvm::bench::BackendKind;
using gvm::bench::StreamHandle;

// In the order the results are printed.
const std::vector<BackendKind> kKinds = {BackendKind::gvm_cuda, BackendKind::cuda_malloc,
                                         BackendKind::cuda_malloc_async, BackendKind::gvm_sim_h200,
                                         BackendKind::torch};

const char* label_of(BackendKind kind) {
  return kind == BackendKind::gvm_sim_h200 ? "simulated H200: front end only, no GPU" : "";
}

// One benchmark's allocator: a fresh backend on the host's first stream.
struct Subject {
  BackendHost* host;
  std::unique_ptr<Backend> backend;
  StreamHandle stream;

  void* allocate(std::size_t bytes) { return backend->allocate(bytes, stream); }
  void deallocate(void* p, std::size_t bytes) { backend->deallocate(p, bytes, stream); }
  void synchronize() { host->synchronize(stream); }
};

// The subject, or nullptr with the reason in *why.
std::unique_ptr<Subject> make_subject(BackendKind kind, std::string* why) {
  try {
    BackendHost* host = gvm::bench::backend_host(kind, why);
    if (host == nullptr) return nullptr;
    host->bind_thread();
    auto s = std::make_unique<Subject>();
    s->host = host;
    s->stream = host->stream(0);
    s->backend = host->make_backend();
    return s;
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
}

// Frees what a benchmark still holds; never throws (used after an error too).
void release_all(Subject& impl, std::vector<void*>& ptrs, const std::vector<std::size_t>& sizes) {
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

void bm_pair(benchmark::State& state, BackendKind kind) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::string why;
  std::unique_ptr<Subject> impl = make_subject(kind, &why);
  if (!impl) {
    state.SkipWithError(why.c_str());
    return;
  }
  if (*label_of(kind)) state.SetLabel(label_of(kind));
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

// One step of the plan: the block in slot plan.slot[step] freed, a block of
// plan.bytes[step] allocated in its place. Throws what the allocator throws.
void mixed_step(Subject& impl, const MixedPlan& plan, std::size_t step, std::vector<void*>& ptrs,
                std::vector<std::size_t>& sizes) {
  const std::uint32_t s = plan.slot[step];
  impl.deallocate(ptrs[s], sizes[s]);
  ptrs[s] = nullptr;
  sizes[s] = plan.bytes[step];
  ptrs[s] = impl.allocate(sizes[s]);
}

// One allocator running the plan: its live blocks and where in the plan it is.
struct MixedRun {
  std::unique_ptr<Subject> impl;
  std::vector<void*> ptrs;
  std::vector<std::size_t> sizes;
  std::size_t step = 0;
};

// A fresh allocator with the plan's 1000 blocks allocated (and, if warm, one
// pass of the plan run); nullptr with the reason in *why.
std::unique_ptr<MixedRun> start_mixed(BackendKind kind, bool warm, std::string* why) {
  const MixedPlan& plan = mixed_plan();
  auto run = std::make_unique<MixedRun>();
  run->impl = make_subject(kind, why);
  if (!run->impl) return nullptr;
  run->ptrs.assign(kMixedLive, nullptr);
  run->sizes = plan.initial;
  try {
    for (std::size_t i = 0; i < kMixedLive; ++i) run->ptrs[i] = run->impl->allocate(run->sizes[i]);
    if (warm)
      for (std::size_t step = 0; step < kMixedSteps; ++step)
        mixed_step(*run->impl, plan, step, run->ptrs, run->sizes);
    run->impl->synchronize();
  } catch (const std::exception& e) {
    release_all(*run->impl, run->ptrs, run->sizes);
    *why = e.what();
    return nullptr;
  }
  return run;
}

// The warm runs, one per kind, kept from one invocation of BM_mixed to the
// next (Google Benchmark calls it several times to size the run, and once
// per repetition): warming again each time would cost cudaMalloc's row about
// 3 s a call. Released by release_warm_mixed() before the process ends.
std::map<BackendKind, std::unique_ptr<MixedRun>>& warm_mixed() {
  static std::map<BackendKind, std::unique_ptr<MixedRun>> runs;
  return runs;
}

void release_warm_mixed() {
  for (auto& [kind, run] : warm_mixed())
    if (run) release_all(*run->impl, run->ptrs, run->sizes);
  warm_mixed().clear();
}

// BM_mixed (warm, the run kept between invocations) and BM_mixed_first_pass
// (the first pass timed, from a fresh allocator each time).
void bm_mixed(benchmark::State& state, BackendKind kind, bool warm) {
  const MixedPlan& plan = mixed_plan();
  std::string why;
  std::unique_ptr<MixedRun> fresh;
  MixedRun* run = nullptr;
  if (warm) {
    std::unique_ptr<MixedRun>& kept = warm_mixed()[kind];
    if (!kept) kept = start_mixed(kind, true, &why);
    run = kept.get();
  } else {
    fresh = start_mixed(kind, false, &why);
    run = fresh.get();
  }
  if (run == nullptr) {
    if (warm) warm_mixed().erase(kind);
    state.SkipWithError(why.c_str());
    return;
  }
  if (*label_of(kind)) state.SetLabel(label_of(kind));
  const std::optional<std::uint64_t> calls_before = run->impl->backend->driver_calls();
  bool failed = false;
  for (auto _ : state) {
    try {
      mixed_step(*run->impl, plan, run->step, run->ptrs, run->sizes);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      failed = true;
      break;
    }
    if (++run->step == kMixedSteps) run->step = 0;
  }
  const auto ops = static_cast<double>(2 * state.iterations());
  state.SetItemsProcessed(static_cast<std::int64_t>(ops));  // items = operations
  // Seconds per operation (one alloc or one free).
  state.counters["time_per_op"] = benchmark::Counter(
      2, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  // Driver calls the timed loop made, per operation (gvmalloc counts its own):
  // where the real driver's time per op exceeds the simulated one, these are
  // why.
  if (calls_before) {
    const std::optional<std::uint64_t> calls_after = run->impl->backend->driver_calls();
    state.counters["driver_calls_per_op"] =
        static_cast<double>(*calls_after - *calls_before) / ops;
  }
  // A failed step leaves a slot without its block: that run is not reused.
  if (!warm || failed) {
    release_all(*run->impl, run->ptrs, run->sizes);
    if (warm) warm_mixed().erase(kind);
  }
}

// Registers the kinds that can run here; says once per reason which cannot.
void register_benchmarks() {
  static const std::int64_t kPairSizes[] = {256, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
  for (const std::string& line : gvm::bench::left_out_lines(kKinds)) {
    std::fprintf(stderr, "gvm-bench-alloc: %s\n", line.c_str());
  }
  std::vector<BackendKind> here;
  for (BackendKind kind : kKinds) {
    if (gvm::bench::backend_host(kind, nullptr) != nullptr) here.push_back(kind);
  }
  for (BackendKind kind : here) {
    auto* b = benchmark::RegisterBenchmark(
        (std::string("BM_pair/") + gvm::bench::backend_name(kind)).c_str(),
        [kind](benchmark::State& st) { bm_pair(st, kind); });
    for (std::int64_t size : kPairSizes) b->Arg(size);
    b->UseRealTime();
  }
  for (BackendKind kind : here) {
    benchmark::RegisterBenchmark(
        (std::string("BM_mixed/") + gvm::bench::backend_name(kind)).c_str(),
        [kind](benchmark::State& st) { bm_mixed(st, kind, true); })
        ->UseRealTime();
  }
  for (BackendKind kind : here) {
    benchmark::RegisterBenchmark(
        (std::string("BM_mixed_first_pass/") + gvm::bench::backend_name(kind)).c_str(),
        [kind](benchmark::State& st) { bm_mixed(st, kind, false); })
        ->UseRealTime()
        ->Iterations(static_cast<benchmark::IterationCount>(kMixedSteps))
        ->Repetitions(3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    benchmark::AddCustomContext("gvm_conf", gvm::to_string(gvm::config_from_env()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gvm-bench-alloc: %s\n", e.what());  // "GVM_CONF: ..."
    return 1;
  }
  const char* torch_conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  benchmark::AddCustomContext("pytorch_cuda_alloc_conf", torch_conf ? torch_conf : "");
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  release_warm_mixed();  // before the backends' hosts go with the statics
  benchmark::Shutdown();
  return 0;
}
