// gvm-bench-peer: peer access through gvmalloc against the global toggle, on
// devices 0 and 1, side by side in one binary, so every comparison is one run (docs/benchmarks.md).
//
//   BM_peer_copy_scratch/<bytes>  (a) device 1 pulls from device 0's scratch
//                                 (Allocator::peer_copy, direct, per-allocation
//                                 grant, context peer access never enabled)
//   BM_peer_copy_staged/<bytes>   (c) cuMemcpyPeerAsync between cuMemAlloc
//                                 buffers, no peer access: the driver stages
//   BM_grant_chunk/<MiB>          scratch_allocate of one fresh chunk of
//                                 scratch_chunk_size (create + map + grant to
//                                 1 peer); trimmed between iterations
//   BM_fence/<tracked>/<busy>     trim(0) of a freed scratch chunk a peer copy
//                                 used, with <busy> unrelated streams running a
//                                 spin kernel: scratch_fence tracked (1) waits
//                                 for the named streams only, devices (0)
//                                 synchronises both devices
//   BM_policy_switch/<MiB>        set_peer_policy(none) (fence + revoke) and
//                                 back (fence + grant), <MiB> of scratch live
//                                 on each device
//   BM_global_toggle/<MiB>        the baseline: both devices synchronised, then
//                                 cuCtxEnablePeerAccess both ways; again, then
//                                 cuCtxDisablePeerAccess; <MiB> of cuMemAlloc
//                                 memory live on each device
//   BM_peer_copy_global/<bytes>   (b) cuMemcpyAsync on device 1 between
//                                 cuMemAlloc buffers with context peer access
//                                 enabled both ways
//
// Order matters: enabling context peer access changes the machine's state,
// so the benchmarks that enable it (global_toggle, then peer_copy_global) are
// registered last and turn it off again; every other one checks that it is
// off (and turns it off, saying so in its label, if something left it on).
// Google Benchmark runs them in this order, repetitions of one before the
// next. For a clean process per mode, use filters (docs/peer-access.md).
//
// Times are host wall clock around the work and a synchronisation of the
// stream that ran it (UseManualTime); the counters say GB/s and ms. Medians:
// --benchmark_repetitions=5 --benchmark_report_aggregates_only=true.
// Without a CUDA driver, two devices with P2P and VMM, each benchmark stops
// with SkipWithError saying why. Each checks what it measured (the copied
// bytes, the chunk count, the access rights) and reports an error if wrong.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "gvm/vmm/owners.hpp"

#if GVM_BENCH_HAVE_TEST_KERNELS
#include "test_kernels.hpp"
#endif

namespace {

using gvm::Allocator;
using gvm::Config;
using gvm::PeerPolicy;
using gvm::vmm::Access;
using gvm::vmm::Call;
using gvm::vmm::DevicePtr;
using gvm::vmm::TestDriver;
using gvm::vmm::Result;
using gvm::vmm::StreamHandle;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

void must(Result r, const std::string& what) {
  if (r != Result::success) throw std::runtime_error(what + ": " + gvm::vmm::result_name(r));
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

DevicePtr dp(const void* p) {
  return reinterpret_cast<DevicePtr>(p);
}

// The driver, a stream on each of devices 0 and 1 and (where built) the test
// kernels, made once per process; or why not.
struct Env {
  std::unique_ptr<TestDriver> driver;
  std::string why_not;
  std::string kernels_why_not;  // why BM_fence cannot run, if it cannot
  StreamHandle s[2] = {nullptr, nullptr};
#if GVM_BENCH_HAVE_TEST_KERNELS
  std::unique_ptr<gvm::test::TestKernels> kernels[2];
#endif

  Env() {
    std::string why;
    driver = gvm::vmm::try_load_cuda_test_driver(&why);
    if (!driver) {
      why_not = why;
      return;
    }
    try {
      int count = 0;
      must(driver->device_count(&count), "cuDeviceGetCount");
      if (count < 2)
        throw std::runtime_error("needs 2 GPUs, the driver shows " + std::to_string(count));
      bool a = false, b = false;
      must(driver->can_access_peer(0, 1, &a), "cuDeviceCanAccessPeer(0, 1)");
      must(driver->can_access_peer(1, 0, &b), "cuDeviceCanAccessPeer(1, 0)");
      if (!a || !b)
        throw std::runtime_error("GPUs 0 and 1 have no P2P path (cuDeviceCanAccessPeer)");
      for (int d = 0; d < 2; ++d) {
        int vmm = 0;
        must(driver->device_attribute(d, gvm::vmm::DeviceAttribute::vmm_supported, &vmm),
             "cuDeviceGetAttribute(VMM)");
        if (vmm == 0) throw std::runtime_error("GPU " + std::to_string(d) + " has no VMM");
        must(driver->stream_create(d, &s[d]), "cuStreamCreate(device " + std::to_string(d) + ")");
      }
#if GVM_BENCH_HAVE_TEST_KERNELS
      // Only BM_fence needs them: a failure here stops that one alone.
      for (int d = 0; d < 2 && kernels_why_not.empty(); ++d) {
        kernels[d] = std::make_unique<gvm::test::TestKernels>();
        const Result r = kernels[d]->load(*driver, d);
        if (r != Result::success)
          kernels_why_not = "loading the test kernels on device " + std::to_string(d) + ": " +
                            gvm::vmm::result_name(r);
      }
#else
      kernels_why_not = "built without the test kernels of tests/gpu (GVM_BUILD_TESTS=OFF)";
#endif
    } catch (const std::exception& e) {
      why_not = e.what();
    }
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  ~Env() {
    if (!driver) return;
#if GVM_BENCH_HAVE_TEST_KERNELS
    for (auto& k : kernels) k.reset();
#endif
    for (int d = 0; d < 2; ++d) {
      if (s[d] == nullptr) continue;
      (void)driver->stream_synchronize(d, s[d]);
      (void)driver->stream_destroy(d, s[d]);
    }
  }
};

Env& env() {
  static Env e;
  return e;
}

bool ready(benchmark::State& state) {
  if (!env().why_not.empty()) {
    state.SkipWithError(env().why_not.c_str());
    return false;
  }
  return true;
}

// Runs `body`; any exception becomes the benchmark's error.
template <class F>
void guarded(benchmark::State& state, F&& body) {
  if (!ready(state)) return;
  try {
    body();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// cuMemAlloc memory, freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(TestDriver& d, int device, std::size_t bytes) : d_(d), device_(device) {
    must(d_.mem_alloc(device, bytes, &p_), "cuMemAlloc(" + std::to_string(bytes) +
                                               " bytes on device " + std::to_string(device) + ")");
  }
  ~DeviceBuffer() { (void)d_.mem_free(device_, p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DevicePtr get() const { return p_; }

 private:
  TestDriver& d_;
  int device_;
  DevicePtr p_ = 0;
};

// --- context peer access -----------------------------------------------------

// Turns context peer access off both ways (after draining both devices).
// Returns true if it had been on, so the label can say so.
bool global_off(TestDriver& d) {
  must(d.ctx_synchronize(0), "cuCtxSynchronize(0)");
  must(d.ctx_synchronize(1), "cuCtxSynchronize(1)");
  bool was_on = false;
  for (auto [dev, peer] : {std::pair{1, 0}, std::pair{0, 1}}) {
    const Result r = d.disable_peer_access(dev, peer);
    if (r == Result::success)
      was_on = true;
    else if (r != Result::peer_access_not_enabled)
      must(r,
           "cuCtxDisablePeerAccess(" + std::to_string(dev) + " -> " + std::to_string(peer) + ")");
  }
  return was_on;
}

void global_on(TestDriver& d) {
  must(d.ctx_synchronize(0), "cuCtxSynchronize(0)");
  must(d.ctx_synchronize(1), "cuCtxSynchronize(1)");
  for (auto [dev, peer] : {std::pair{1, 0}, std::pair{0, 1}}) {
    const Result r = d.enable_peer_access(dev, peer);
    if (r != Result::peer_access_already_enabled)
      must(r, "cuCtxEnablePeerAccess(" + std::to_string(dev) + " -> " + std::to_string(peer) + ")");
  }
}

// Fails unless context peer access 1 -> 0 is still off.
void expect_global_still_off(TestDriver& d) {
  const Result r = d.disable_peer_access(1, 0);
  if (r == Result::peer_access_not_enabled) return;
  throw std::runtime_error("context peer access 1 -> 0 was on after the run (" +
                           gvm::vmm::result_name(r) +
                           "): the measurement is not of the scratch path");
}

void require_per_allocation(const Allocator& a) {
  if (a.peer_policy(0, 1) != PeerPolicy::per_allocation ||
      a.peer_policy(1, 0) != PeerPolicy::per_allocation)
    throw std::runtime_error(std::string("the allocator chose ") +
                             gvm::to_string(a.peer_policy(0, 1)) +
                             " for this pair, not per_allocation (pre-Ampere or no VMM)");
}

std::uint64_t driver_ns(const Allocator& a, std::initializer_list<Call> calls) {
  const gvm::Stats s = a.stats();
  std::uint64_t ns = 0;
  for (Call c : calls) ns += s.driver.nanoseconds[static_cast<std::size_t>(c)];
  return ns;
}

// The copy landed: the first and last 4 KiB of dst on device `dev` are `byte`.
void check_copied(TestDriver& d, int dev, DevicePtr dst, std::size_t bytes, unsigned char byte) {
  std::vector<unsigned char> head(4096), tail(4096);
  must(d.memcpy_dtoh(dev, head.data(), dst, head.size()), "cuMemcpyDtoH");
  must(d.memcpy_dtoh(dev, tail.data(), dst + bytes - tail.size(), tail.size()), "cuMemcpyDtoH");
  for (std::size_t i = 0; i < head.size(); ++i)
    if (head[i] != byte || tail[i] != byte)
      throw std::runtime_error("the copied bytes are wrong: the copy did not happen as measured");
}

void set_copy_counters(benchmark::State& state, std::size_t bytes, double total_s) {
  const auto n = static_cast<double>(state.iterations());
  if (n == 0 || total_s <= 0) return;
  state.counters["GB/s"] = static_cast<double>(bytes) * n / total_s / 1e9;
  state.counters["ms"] = total_s / n * 1e3;
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

// One timed copy: `enqueue`, then wait for `stream` of `dev`.
template <class F>
double timed_copy(TestDriver& d, int dev, StreamHandle stream, F&& enqueue) {
  const auto t0 = Clock::now();
  enqueue();
  must(d.stream_synchronize(dev, stream), "cuStreamSynchronize");
  return seconds_since(t0);
}

// --- (a) through gvmalloc's scratch -----------------------------------------

void BM_peer_copy_scratch(benchmark::State& state) {
  guarded(state, [&] {
    Env& e = env();
    TestDriver& d = *e.driver;
    const auto bytes = static_cast<std::size_t>(state.range(0));
    if (global_off(d)) state.SetLabel("context peer access was on; turned off first");
    Allocator a(d);
    require_per_allocation(a);
    void* src = a.scratch_allocate(bytes, 0, e.s[0]);
    void* dst = a.allocate(bytes, 1, e.s[1]);
    must(d.memset_d8_async(0, dp(src), 0x5a, bytes, e.s[0]), "cuMemsetD8Async");
    must(d.stream_synchronize(0, e.s[0]), "cuStreamSynchronize");
    if (!a.is_peer_copy_direct(src, 0, 1))
      throw std::runtime_error("peer_copy out of the scratch would be staged");
    auto copy = [&] { a.peer_copy(dst, 1, src, 0, bytes, e.s[1]); };
    timed_copy(d, 1, e.s[1], copy);  // warm-up
    double total = 0;
    for (auto _ : state) {
      const double s = timed_copy(d, 1, e.s[1], copy);
      state.SetIterationTime(s);
      total += s;
    }
    check_copied(d, 1, dp(dst), bytes, 0x5a);
    if (a.stats().driver.calls[static_cast<std::size_t>(Call::enable_peer_access)] != 0)
      throw std::runtime_error("the allocator enabled context peer access");
    expect_global_still_off(d);
    set_copy_counters(state, bytes, total);
    a.deallocate(src, bytes, 0, e.s[0]);
    a.deallocate(dst, bytes, 1, e.s[1]);
  });
}

// --- (c) staged by the driver, no peer access ---------------------------------

void BM_peer_copy_staged(benchmark::State& state) {
  guarded(state, [&] {
    Env& e = env();
    TestDriver& d = *e.driver;
    const auto bytes = static_cast<std::size_t>(state.range(0));
    if (global_off(d)) state.SetLabel("context peer access was on; turned off first");
    DeviceBuffer src(d, 0, bytes), dst(d, 1, bytes);
    must(d.memset_d8_async(0, src.get(), 0x5a, bytes, e.s[0]), "cuMemsetD8Async");
    must(d.stream_synchronize(0, e.s[0]), "cuStreamSynchronize");
    // On device 1's stream, as Allocator::peer_copy's staged path runs it.
    auto copy = [&] {
      must(d.memcpy_peer_async(dst.get(), 1, src.get(), 0, bytes, e.s[1]), "cuMemcpyPeerAsync");
    };
    timed_copy(d, 1, e.s[1], copy);
    double total = 0;
    for (auto _ : state) {
      const double s = timed_copy(d, 1, e.s[1], copy);
      state.SetIterationTime(s);
      total += s;
    }
    check_copied(d, 1, dst.get(), bytes, 0x5a);
    expect_global_still_off(d);
    set_copy_counters(state, bytes, total);
  });
}

// --- grant cost per chunk size -------------------------------------------------

void BM_grant_chunk(benchmark::State& state) {
  guarded(state, [&] {
    Env& e = env();
    TestDriver& d = *e.driver;
    const std::size_t chunk = static_cast<std::size_t>(state.range(0)) * kMiB;
    Config c;
    c.scratch_chunk_bytes = chunk;
    Allocator a(d, c);
    require_per_allocation(a);
    // Warm-up: the scratch reservation, the first chunk's path through the driver.
    a.deallocate(a.scratch_allocate(chunk, 0, e.s[0]), chunk, 0, e.s[0]);
    a.trim(0);
    double total = 0;
    std::uint64_t grant_ns = 0, create_ns = 0, map_ns = 0;
    for (auto _ : state) {
      const std::uint64_t mapped = a.device_stats(0).chunks_mapped;
      const std::uint64_t g0 = driver_ns(a, {Call::mem_set_access});
      const std::uint64_t c0 = driver_ns(a, {Call::mem_create});
      const std::uint64_t m0 = driver_ns(a, {Call::mem_map});
      const auto t0 = Clock::now();
      void* p = a.scratch_allocate(chunk, 0, e.s[0]);
      const double s = seconds_since(t0);
      state.SetIterationTime(s);
      total += s;
      grant_ns += driver_ns(a, {Call::mem_set_access}) - g0;
      create_ns += driver_ns(a, {Call::mem_create}) - c0;
      map_ns += driver_ns(a, {Call::mem_map}) - m0;
      const std::uint64_t made = a.device_stats(0).chunks_mapped - mapped;
      Access acc = Access::none;
      must(d.mem_get_access(dp(p), 1, &acc), "cuMemGetAccess");
      a.deallocate(p, chunk, 0, e.s[0]);
      a.trim(0);  // the next iteration maps a fresh chunk
      if (made != 1 || acc != Access::read_write) {
        state.SkipWithError(("scratch_allocate mapped " + std::to_string(made) +
                             " chunks, peer access " + std::to_string(static_cast<int>(acc)) +
                             " (expected 1 chunk granted read_write)")
                                .c_str());
        return;
      }
    }
    const auto n = static_cast<double>(state.iterations());
    if (n == 0) return;
    const double per_chunk_ms = total / n * 1e3;
    state.counters["ms_per_chunk"] = per_chunk_ms;
    state.counters["ms_per_GiB"] =
        per_chunk_ms * static_cast<double>(kGiB) / static_cast<double>(chunk);
    state.counters["grant_ms"] = static_cast<double>(grant_ns) / n / 1e6;
    state.counters["create_ms"] = static_cast<double>(create_ns) / n / 1e6;
    state.counters["map_ms"] = static_cast<double>(map_ns) / n / 1e6;
  });
}

// --- fence cost: tracked vs whole devices ----------------------------------------

void BM_fence(benchmark::State& state) {
  guarded(state, [&] {
#if !GVM_BENCH_HAVE_TEST_KERNELS
    state.SkipWithError(env().kernels_why_not.c_str());
#else
    Env& e = env();
    if (!e.kernels_why_not.empty()) {
      state.SkipWithError(e.kernels_why_not.c_str());
      return;
    }
    TestDriver& d = *e.driver;
    const bool tracked = state.range(0) != 0;
    const int busy = static_cast<int>(state.range(1));
    // A spin kernel this long on each unrelated stream: the devices fence
    // waits for it, the tracked one should not.
    constexpr double kBusySeconds = 0.020;
    constexpr std::size_t kBytes = 64 * kMiB;
    Config c;
    c.scratch_fence_tracked = tracked;
    c.scratch_chunk_bytes = kBytes;
    Allocator a(d, c);
    require_per_allocation(a);
    void* dst = a.allocate(kBytes, 1, e.s[1]);

    // Unrelated work: streams alternating between the devices, each spinning
    // over its own private buffer.
    struct Busy {
      int device;
      StreamHandle stream = nullptr;
      DevicePtr buf = 0, sink = 0;
    };
    std::vector<Busy> others;
    auto cleanup = [&] {
      for (auto& b : others) {
        if (b.stream != nullptr) {
          (void)d.stream_synchronize(b.device, b.stream);
          (void)d.stream_destroy(b.device, b.stream);
        }
        if (b.buf != 0) (void)d.mem_free(b.device, b.buf);
        if (b.sink != 0) (void)d.mem_free(b.device, b.sink);
      }
    };
    std::uint64_t spin[2] = {0, 0};
    try {
      for (int i = 0; i < busy; ++i) {
        Busy b{i % 2};
        others.push_back(b);
        Busy& o = others.back();
        must(d.stream_create(o.device, &o.stream), "cuStreamCreate");
        must(d.mem_alloc(o.device, kBytes, &o.buf), "cuMemAlloc");
        must(d.mem_alloc(o.device, 4, &o.sink), "cuMemAlloc");
        if (spin[o.device] == 0)
          must(e.kernels[o.device]->calibrate_spin(o.stream, o.buf, kBytes / 4, kBusySeconds,
                                                   &spin[o.device]),
               "calibrate_spin");
      }
      gvm::vmm::Event done(d, 1);
      double total = 0;
      std::uint64_t wait_ns = 0;
      for (auto _ : state) {
        void* p = a.scratch_allocate(kBytes, 0, e.s[0]);  // fresh, granted chunk
        a.peer_copy(dst, 1, p, 0, kBytes, e.s[1]);       // direct: device 1's stream uses it
        a.record_stream(p, e.s[1], 1);
        must(done.record(e.s[1]), "cuEventRecord");
        must(d.stream_wait_event(0, e.s[0], done.get()), "cuStreamWaitEvent");
        a.deallocate(p, kBytes, 0, e.s[0]);
        for (auto& o : others)
          must(e.kernels[o.device]->spin_read(o.stream, o.buf, kBytes / 4, spin[o.device], o.sink),
               "spin_read");
        const std::uint64_t w0 =
            driver_ns(a, {Call::ctx_synchronize, Call::event_synchronize, Call::event_record});
        const auto t0 = Clock::now();
        a.trim(0);  // the fence, then unmap + release
        const double s = seconds_since(t0);
        wait_ns +=
            driver_ns(a, {Call::ctx_synchronize, Call::event_synchronize, Call::event_record}) - w0;
        state.SetIterationTime(s);
        total += s;
        for (auto& o : others) must(d.stream_synchronize(o.device, o.stream), "cuStreamSynchronize");
        if (a.device_stats(0).scratch_reserved_bytes != 0)
          throw std::runtime_error("trim(0) left the scratch chunk mapped");
      }
      const auto n = static_cast<double>(state.iterations());
      if (n > 0) {
        state.counters["trim_ms"] = total / n * 1e3;
        state.counters["fence_wait_ms"] = static_cast<double>(wait_ns) / n / 1e6;
        state.counters["busy_kernel_ms"] = busy > 0 ? kBusySeconds * 1e3 : 0.0;
      }
    } catch (...) {
      cleanup();
      a.deallocate(dst, kBytes, 1, e.s[1]);
      throw;
    }
    cleanup();
    a.deallocate(dst, kBytes, 1, e.s[1]);
#endif
  });
}

// --- a policy switch vs the global toggle ----------------------------------------

void BM_policy_switch(benchmark::State& state) {
  guarded(state, [&] {
    Env& e = env();
    TestDriver& d = *e.driver;
    const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * kMiB;
    if (global_off(d)) state.SetLabel("context peer access was on; turned off first");
    Allocator a(d);  // default scratch chunks (Config::scratch_chunk_bytes)
    require_per_allocation(a);
    void* p[2] = {a.scratch_allocate(bytes, 0, e.s[0]), a.scratch_allocate(bytes, 1, e.s[1])};
    auto expect_access = [&](Access want) {
      for (int dev = 0; dev < 2; ++dev) {
        Access acc = Access::read;
        must(d.mem_get_access(dp(p[dev]), 1 - dev, &acc), "cuMemGetAccess");
        if (acc != want) throw std::runtime_error("the switch did not change the peer's access");
      }
    };
    double revoke = 0, grant = 0;
    for (auto _ : state) {
      const auto t0 = Clock::now();
      a.set_peer_policy(PeerPolicy::none);
      const double r = seconds_since(t0);
      expect_access(Access::none);
      const auto t1 = Clock::now();
      a.set_peer_policy(PeerPolicy::per_allocation);
      const double g = seconds_since(t1);
      expect_access(Access::read_write);
      state.SetIterationTime(r + g);
      revoke += r;
      grant += g;
    }
    expect_global_still_off(d);
    const auto n = static_cast<double>(state.iterations());
    if (n > 0) {
      state.counters["revoke_ms"] = revoke / n * 1e3;
      state.counters["grant_ms"] = grant / n * 1e3;
      state.counters["pair_ms"] = (revoke + grant) / n * 1e3;
    }
    a.deallocate(p[0], bytes, 0, e.s[0]);
    a.deallocate(p[1], bytes, 1, e.s[1]);
  });
}

void BM_global_toggle(benchmark::State& state) {
  guarded(state, [&] {
    Env& e = env();
    TestDriver& d = *e.driver;
    const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * kMiB;
    global_off(d);
    DeviceBuffer m0(d, 0, bytes), m1(d, 1, bytes);  // the same memory live as the switch has
    double enable = 0, disable = 0;
    try {
      for (auto _ : state) {
        // Each toggle behind both devices synchronised: the only safe way
        // (docs/measurements.md), and what the allocator's switch does too.
        const auto t0 = Clock::now();
        global_on(d);
        const double on = seconds_since(t0);
        const auto t1 = Clock::now();
        if (!global_off(d)) throw std::runtime_error("context peer access did not turn on");
        const double off = seconds_since(t1);
        state.SetIterationTime(on + off);
        enable += on;
        disable += off;
      }
    } catch (...) {
      global_off(d);
      throw;
    }
    const auto n = static_cast<double>(state.iterations());
    if (n > 0) {
      state.counters["enable_ms"] = enable / n * 1e3;
      state.counters["disable_ms"] = disable / n * 1e3;
      state.counters["pair_ms"] = (enable + disable) / n * 1e3;
    }
  });
}

// --- (b) with context peer access enabled: last, and turned off again ----------

void BM_peer_copy_global(benchmark::State& state) {
  guarded(state, [&] {
    Env& e = env();
    TestDriver& d = *e.driver;
    const auto bytes = static_cast<std::size_t>(state.range(0));
    DeviceBuffer src(d, 0, bytes), dst(d, 1, bytes);
    must(d.memset_d8_async(0, src.get(), 0x5a, bytes, e.s[0]), "cuMemsetD8Async");
    must(d.stream_synchronize(0, e.s[0]), "cuStreamSynchronize");
    global_on(d);
    try {
      // Driven by device 1, like (a): a direct P2P copy now that it may.
      auto copy = [&] {
        must(d.memcpy_async(1, dst.get(), src.get(), bytes, e.s[1]), "cuMemcpyAsync");
      };
      timed_copy(d, 1, e.s[1], copy);
      double total = 0;
      for (auto _ : state) {
        const double s = timed_copy(d, 1, e.s[1], copy);
        state.SetIterationTime(s);
        total += s;
      }
      check_copied(d, 1, dst.get(), bytes, 0x5a);
      set_copy_counters(state, bytes, total);
    } catch (...) {
      global_off(d);
      throw;
    }
    global_off(d);
  });
}

// Registration order is run order (see the top of the file).
BENCHMARK(BM_peer_copy_scratch)
    ->Arg(256 * kMiB)
    ->Arg(kGiB)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peer_copy_staged)
    ->Arg(256 * kMiB)
    ->Arg(kGiB)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_grant_chunk)
    ->ArgName("MiB")
    ->Arg(2)
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fence)
    ->ArgNames({"tracked", "busy"})
    ->ArgsProduct({{0, 1}, {0, 1, 4}})
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_policy_switch)
    ->ArgName("MiB")
    ->Arg(256)
    ->Arg(1024)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_global_toggle)
    ->ArgName("MiB")
    ->Arg(256)
    ->Arg(1024)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peer_copy_global)
    ->Arg(256 * kMiB)
    ->Arg(kGiB)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
