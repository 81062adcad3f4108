// gvm-bench-growth: how long gvmalloc takes to grow from empty to 1, 8 and
// 64 GiB and to trim back, by chunk size, next to the time the driver calls
// it made took alone (docs/benchmarks.md).
//
//   BM_growth/<impl>/<max_chunk MiB>/<target GiB>
//       On a fresh Allocator (config from GVM_CONF, max_chunk_size from the
//       argument), allocate blocks of 256 MiB on the legacy default stream
//       until <target> GiB are live (timed: the reported time), free them
//       all (untimed), then trim(0) (timed separately, the counter trim_ms).
//       One iteration per run; --benchmark_repetitions gives fresh runs.
//   counters
//       grow_ms, grow_driver_ms  wall time of the growth loop, and the time
//                                inside the driver calls it made
//                                (Allocator::stats().driver)
//       grow_over_driver         their ratio (target <= 2: the allocator's
//                                own work costs no more than the driver's)
//       trim_ms, trim_driver_ms, trim_over_driver   the same for trim(0)
//       grow_driver_calls, chunks_mapped             what growth made
//
//   gvm_cuda      the CUDA driver; needs 64 GiB free on device 0
//   gvm_sim_h200  a simulated H200: the allocator's own work plus the
//                 simulator's bookkeeping, no GPU (the ratio is not a GPU
//                 figure there; it runs so the benchmark is exercised anywhere)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/errors.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace {

constexpr int kDevice = 0;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
// Blocks of 256 MiB: large enough that growth, not the front end, is what is
// timed, and a whole number of blocks reaches every target.
constexpr std::size_t kBlockBytes = 256 * kMiB;

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

struct DriverTotals {
  std::uint64_t calls = 0;
  std::uint64_t ns = 0;
};

DriverTotals driver_totals(const gvm::Allocator& a) {
  const gvm::Stats s = a.stats();
  return {s.driver.total_calls(), s.driver.total_nanoseconds()};
}

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void bm_growth(benchmark::State& state, bool real_driver) {
  DriverEnv& env = real_driver ? cuda_env() : sim_env();
  if (!env.driver) {
    state.SkipWithError(env.why_not.c_str());
    return;
  }
  const auto chunk = static_cast<std::size_t>(state.range(0)) * kMiB;
  const auto target = static_cast<std::size_t>(state.range(1)) * kGiB;
  gvm::Config config;
  try {
    config = gvm::config_from_env();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());  // "GVM_CONF: ..." (config_from_env says where)
    return;
  }
  config.max_chunk_bytes = chunk;

  double grow_ms = 0, grow_driver_ms = 0, trim_ms = 0, trim_driver_ms = 0;
  double grow_calls = 0, chunks = 0;
  for (auto _ : state) {
    std::vector<void*> blocks;
    try {
      gvm::Allocator allocator(*env.driver, config);  // fresh: nothing mapped
      const DriverTotals d0 = driver_totals(allocator);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        for (std::size_t live = 0; live < target; live += kBlockBytes) {
          blocks.push_back(allocator.allocate(kBlockBytes, kDevice, nullptr));
        }
      } catch (...) {
        for (void* p : blocks) allocator.deallocate(p, kBlockBytes, kDevice, nullptr);
        throw;
      }
      const auto t1 = std::chrono::steady_clock::now();
      const DriverTotals d1 = driver_totals(allocator);
      const std::uint64_t mapped = allocator.device_stats(kDevice).chunks_mapped;
      for (void* p : blocks) allocator.deallocate(p, kBlockBytes, kDevice, nullptr);
      blocks.clear();
      const DriverTotals d2 = driver_totals(allocator);
      const auto t2 = std::chrono::steady_clock::now();
      allocator.trim(kDevice);
      const auto t3 = std::chrono::steady_clock::now();
      const DriverTotals d3 = driver_totals(allocator);
      const gvm::DeviceStats after = allocator.device_stats(kDevice);
      if (after.reserved_bytes != 0) {
        state.SkipWithError(
            ("trim left " + std::to_string(after.reserved_bytes) + " bytes reserved; expected none")
                .c_str());
        break;
      }
      state.SetIterationTime(ms_between(t0, t1) / 1e3);
      grow_ms += ms_between(t0, t1);
      grow_driver_ms += static_cast<double>(d1.ns - d0.ns) / 1e6;
      trim_ms += ms_between(t2, t3);
      trim_driver_ms += static_cast<double>(d3.ns - d2.ns) / 1e6;
      grow_calls += static_cast<double>(d1.calls - d0.calls);
      chunks += static_cast<double>(mapped);
    } catch (const gvm::out_of_memory& e) {
      state.SkipWithError((std::string("out of memory (this benchmark needs ") +
                           std::to_string(target / kGiB) + " GiB free): " + e.what())
                              .c_str());
      break;
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
  }
  if (state.iterations() == 0) return;
  const auto n = static_cast<double>(state.iterations());
  state.counters["grow_ms"] = grow_ms / n;
  state.counters["grow_driver_ms"] = grow_driver_ms / n;
  state.counters["grow_over_driver"] = grow_driver_ms > 0 ? grow_ms / grow_driver_ms : 0;
  state.counters["trim_ms"] = trim_ms / n;
  state.counters["trim_driver_ms"] = trim_driver_ms / n;
  state.counters["trim_over_driver"] = trim_driver_ms > 0 ? trim_ms / trim_driver_ms : 0;
  state.counters["grow_driver_calls"] = grow_calls / n;
  state.counters["chunks_mapped"] = chunks / n;
  state.SetBytesProcessed(static_cast<std::int64_t>(target) * state.iterations());
}

void register_benchmarks() {
  for (bool real : {true, false}) {
    auto* b = benchmark::RegisterBenchmark(real ? "BM_growth/gvm_cuda" : "BM_growth/gvm_sim_h200",
                                           [real](benchmark::State& st) { bm_growth(st, real); });
    b->ArgNames({"chunk_mib", "gib"});
    for (std::int64_t chunk_mib : {2, 64, 128, 1024}) {
      for (std::int64_t gib : {1, 8, 64}) b->Args({chunk_mib, gib});
    }
    b->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
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
    std::fprintf(stderr, "gvm-bench-growth: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
