// gvm-replay-baseline: replays an allocation trace through a baseline
// allocator, PyTorch's CUDACachingAllocator or cudaMallocAsync, and reports the
// same figures as gvm-replay (peak reserved / peak live, ns per operation), so
// that the three can be put side by side (docs/benchmarks.md).
//
//   torch   raw_alloc_with_stream / raw_delete (bench/torch_baseline.hpp);
//           reported as torch_expandable when PYTORCH_CUDA_ALLOC_CONF says
//           expandable_segments:True. Reserved bytes from c10's device stats.
//   async   cudaMallocFromPoolAsync / cudaFreeAsync on a pool made for each
//           pass (release threshold UINT64_MAX: nothing is given back during
//           the pass, as the warm default pool would). Reserved bytes from
//           cudaMemPoolAttrReservedMemCurrent / ReservedMemHigh.
//
// As in gvm-replay: --repeat timed passes (nothing read inside the loop) give
// ns_per_op; one memory pass reads reserved bytes after every event for the
// peak and the timeline. Every pass starts empty: a fresh pool (async), or
// emptyCache + resetPeakStats (torch, which lives once per process).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "torch_baseline.hpp"
#include "replay_cli.hpp"
#include "trace.hpp"

#if GVM_BENCH_HAVE_CUDART
#include <cuda_runtime_api.h>
#endif

namespace {

using gvm::bench::ArgError;
using gvm::bench::default_trace;
using gvm::bench::json_string;
using gvm::bench::median;
using gvm::bench::Trace;
using gvm::bench::TraceEvent;
using gvm::bench::TraceOp;

constexpr const char* kUsage =
    "usage: gvm-replay-baseline --impl torch|async [--repeat N] [--json]\n"
    "                           [--timeline FILE [--timeline-every N]] [TRACE]\n"
    "\n"
    "Replays TRACE (default: traces/gpt2_train.trace.gz of the source tree) on CUDA\n"
    "device 0 through PyTorch's caching allocator (torch; its mode from\n"
    "PYTORCH_CUDA_ALLOC_CONF) or cudaMallocAsync (async). Options as gvm-replay's.\n";

struct Args : gvm::bench::ReplayArgs {
  std::string impl;
};

Args parse_args(int argc, char** argv) {
  Args a;
  gvm::bench::parse_replay_args(argc, argv, a, [&](const std::string& flag, const auto& value) {
    if (flag != "--impl") return false;
    a.impl = value();
    if (a.impl != "torch" && a.impl != "async") {
      throw ArgError("--impl wants torch or async, got '" + a.impl + "'");
    }
    return true;
  });
  if (!a.help && a.impl.empty()) throw ArgError("--impl is required (torch or async)");
  return a;
}

struct TimelinePoint {
  std::uint64_t event, live_bytes, reserved_bytes;
};

#if GVM_BENCH_HAVE_CUDART

void cuda_check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                             ")");
  }
}

// A baseline allocator for one pass on device 0.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual void* allocate(std::size_t bytes, cudaStream_t stream) = 0;
  virtual void deallocate(void* p, cudaStream_t stream) = 0;
  virtual std::size_t reserved() = 0;
  virtual std::size_t peak_reserved() = 0;
};

class TorchBackend final : public Backend {
 public:
  TorchBackend() {
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    gvm::bench::torch_empty_cache();
    gvm::bench::torch_reset_peak();
    if (const std::size_t r = gvm::bench::torch_reserved_bytes(); r != 0) {
      std::cerr << "gvm-replay-baseline: note: torch still reserves " << r
                << " bytes after emptyCache at the start of a pass\n";
    }
  }
  ~TorchBackend() override {
    (void)cudaDeviceSynchronize();
    gvm::bench::torch_empty_cache();
  }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    return gvm::bench::torch_alloc(bytes, stream);
  }
  void deallocate(void* p, cudaStream_t) override { gvm::bench::torch_free(p); }
  std::size_t reserved() override { return gvm::bench::torch_reserved_bytes(); }
  std::size_t peak_reserved() override { return gvm::bench::torch_peak_reserved(); }
};

class AsyncBackend final : public Backend {
 public:
  AsyncBackend() {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cuda_check(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    std::uint64_t threshold = UINT64_MAX;
    cuda_check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
               "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  ~AsyncBackend() override {
    (void)cudaDeviceSynchronize();
    (void)cudaMemPoolDestroy(pool_);
  }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    void* p = nullptr;
    cuda_check(cudaMallocFromPoolAsync(&p, bytes, pool_, stream),
               "cudaMallocFromPoolAsync(" + std::to_string(bytes) + ")");
    return p;
  }
  void deallocate(void* p, cudaStream_t stream) override {
    cuda_check(cudaFreeAsync(p, stream), "cudaFreeAsync");
  }
  std::size_t reserved() override { return attr(cudaMemPoolAttrReservedMemCurrent); }
  std::size_t peak_reserved() override { return attr(cudaMemPoolAttrReservedMemHigh); }

 private:
  std::size_t attr(cudaMemPoolAttr a) {
    std::uint64_t v = 0;
    cuda_check(cudaMemPoolGetAttribute(pool_, a, &v), "cudaMemPoolGetAttribute");
    return static_cast<std::size_t>(v);
  }
  cudaMemPool_t pool_ = nullptr;
};

// The trace's streams: index 0 the legacy default stream, the others made here.
class Streams {
 public:
  explicit Streams(const Trace& trace) : streams_(trace.stream_count(), nullptr) {
    for (std::size_t i = 1; i < streams_.size(); ++i) {
      cuda_check(cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking),
                 "cudaStreamCreate");
    }
  }
  ~Streams() {
    (void)cudaDeviceSynchronize();
    for (cudaStream_t s : streams_) {
      if (s) (void)cudaStreamDestroy(s);
    }
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  cudaStream_t operator[](std::size_t i) const { return streams_[i]; }

 private:
  std::vector<cudaStream_t> streams_;
};

struct PassResult {
  std::uint64_t wall_ns = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t peak_reserved = 0;            // sampled after each event (memory pass)
  std::uint64_t allocator_peak_reserved = 0;  // the allocator's own peak, read at the end
};

std::unique_ptr<Backend> make_backend(const std::string& impl) {
  if (impl == "torch") return std::make_unique<TorchBackend>();
  return std::make_unique<AsyncBackend>();
}

std::string describe(const Trace& trace, std::size_t i) {
  const TraceEvent& e = trace.events[i];
  std::ostringstream o;
  o << "event " << (i + 1) << " of " << trace.source << " ("
    << (e.op == TraceOp::allocate ? "allocate" : "free") << " id " << trace.block_ids[e.block]
    << ", " << e.bytes << " bytes, stream " << trace.stream_ids[e.stream] << ")";
  return o.str();
}

PassResult run_pass(const Trace& trace, const std::string& impl, bool sample,
                    std::size_t timeline_every, std::vector<TimelinePoint>* timeline) {
  Streams streams(trace);
  std::unique_ptr<Backend> backend = make_backend(impl);
  std::vector<void*> ptrs(trace.block_count(), nullptr);
  PassResult r;
  std::uint64_t live = 0;
  std::size_t i = 0;
  const std::size_t n = trace.events.size();
  try {
    const auto t0 = std::chrono::steady_clock::now();
    for (; i < n; ++i) {
      const TraceEvent& e = trace.events[i];
      if (e.op == TraceOp::allocate) {
        ptrs[e.block] = backend->allocate(e.bytes, streams[e.stream]);
        live += e.bytes;
        if (live > r.peak_live) r.peak_live = live;
      } else {
        backend->deallocate(ptrs[e.block], streams[e.stream]);
        ptrs[e.block] = nullptr;
        live -= e.bytes;
      }
      if (sample) {
        const std::uint64_t reserved = backend->reserved();
        if (reserved > r.peak_reserved) r.peak_reserved = reserved;
        if (timeline && (i % timeline_every == 0 || i + 1 == n)) {
          timeline->push_back({i + 1, live, reserved});
        }
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    r.wall_ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  } catch (const std::exception& e) {
    for (std::size_t b = 0; b < ptrs.size(); ++b) {
      if (ptrs[b]) backend->deallocate(ptrs[b], nullptr);
    }
    throw std::runtime_error(describe(trace, i) + ": " + e.what());
  }
  r.allocator_peak_reserved = backend->peak_reserved();
  for (void* p : ptrs) {
    if (p) backend->deallocate(p, nullptr);  // what the trace leaves live; untimed
  }
  return r;
}

void write_timeline(const std::string& path, const Trace& trace, const std::string& impl_name,
                    std::size_t every, const std::vector<TimelinePoint>& points) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw std::runtime_error("--timeline: cannot write " + path);
  out << "# gvm-replay-baseline (" << impl_name << ") timeline of " << trace.source
      << ": one row every " << every
      << " event(s) and after the last; live = requested bytes of live blocks,"
         " reserved = the allocator's reserved bytes\n";
  out << "event,live_bytes,reserved_bytes\n";
  for (const TimelinePoint& p : points) {
    out << p.event << ',' << p.live_bytes << ',' << p.reserved_bytes << '\n';
  }
  out.flush();
  if (!out) throw std::runtime_error("--timeline: error writing " + path);
}

int run(const Args& a) {
  const std::string trace_path = a.trace.empty() ? default_trace() : a.trace;
  const Trace trace = gvm::bench::read_trace(trace_path);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    throw std::runtime_error(std::string("no CUDA device (cudaGetDeviceCount: ") +
                             (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")");
  }
  cuda_check(cudaSetDevice(0), "cudaSetDevice");
  std::string why;
  if (a.impl == "torch" && !gvm::bench::torch_baseline_available(&why)) {
    throw std::runtime_error("--impl torch: " + why);
  }
  const std::string impl_name =
      a.impl == "torch" ? gvm::bench::torch_impl_name() : std::string("cudaMallocAsync");

  std::vector<double> ns_per_op;
  const double events = static_cast<double>(trace.events.size());
  for (int r = 0; r < a.repeat; ++r) {
    const PassResult p = run_pass(trace, a.impl, false, 0, nullptr);
    ns_per_op.push_back(events == 0 ? 0.0 : static_cast<double>(p.wall_ns) / events);
  }
  std::vector<TimelinePoint> timeline;
  const PassResult memory =
      run_pass(trace, a.impl, true, a.timeline_every, a.timeline.empty() ? nullptr : &timeline);
  if (!a.timeline.empty()) write_timeline(a.timeline, trace, impl_name, a.timeline_every, timeline);

  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver_version = 0, runtime_version = 0;
  (void)cudaDriverGetVersion(&driver_version);
  (void)cudaRuntimeGetVersion(&runtime_version);
  const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");

  const double ratio = memory.peak_live == 0 ? 0.0
                                             : static_cast<double>(memory.peak_reserved) /
                                                   static_cast<double>(memory.peak_live);
  const double ns = median(ns_per_op);
  std::ostringstream o;
  o.precision(6);
  if (a.json) {
    o << "{\"trace\":" << json_string(trace.source) << ",\"impl\":" << json_string(impl_name)
      << ",\"events\":" << trace.events.size() << ",\"allocations\":" << trace.allocations
      << ",\"frees\":" << trace.frees << ",\"peak_live_bytes\":" << memory.peak_live
      << ",\"peak_reserved_bytes\":" << memory.peak_reserved
      << ",\"allocator_peak_reserved_bytes\":" << memory.allocator_peak_reserved
      << ",\"ratio\":" << ratio << ",\"ns_per_op\":" << ns << ",\"ns_per_op_runs\":[";
    for (std::size_t i = 0; i < ns_per_op.size(); ++i) o << (i ? "," : "") << ns_per_op[i];
    o << "],\"repeat\":" << a.repeat << ",\"device\":" << json_string(prop.name)
      << ",\"cuda_driver_version\":" << driver_version
      << ",\"cuda_runtime_version\":" << runtime_version
      << ",\"pytorch_cuda_alloc_conf\":" << json_string(conf ? conf : "") << "}\n";
  } else {
    o << "trace          " << trace.source << "\n"
      << "allocator      " << impl_name << "\n"
      << "device         " << prop.name << " (device 0)\n"
      << "events         " << trace.events.size() << " (" << trace.allocations << " allocations, "
      << trace.frees << " frees)\n"
      << "peak live      " << memory.peak_live << " bytes\n"
      << "peak reserved  " << memory.peak_reserved << " bytes, sampled after every event ("
      << memory.allocator_peak_reserved << " by the allocator's own peak)\n"
      << "ratio          " << ratio << " reserved / live\n"
      << "ns per op      " << ns;
    if (a.repeat > 1) o << " (median of " << a.repeat << " runs)";
    o << "\n";
  }
  std::cout << o.str() << std::flush;
  return 0;
}

#else  // !GVM_BENCH_HAVE_CUDART

int run(const Args&) {
  throw std::runtime_error("built without the CUDA runtime (CUDA::cudart not found)");
}

#endif  // GVM_BENCH_HAVE_CUDART

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    if (args.help) {
      std::cout << kUsage;
      return 0;
    }
    return run(args);
  } catch (const ArgError& e) {
    std::cerr << "gvm-replay-baseline: " << e.what() << "\n\n" << kUsage;
  } catch (const gvm::bench::TraceError& e) {
    std::cerr << "gvm-replay-baseline: bad trace: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gvm-replay-baseline: " << e.what() << "\n";
  }
  return 1;
}
