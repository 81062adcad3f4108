// gvm-replay-baseline: replays an allocation trace through a baseline
// allocator, PyTorch's CUDACachingAllocator or cudaMallocAsync, and reports the
// same figures as gvm-replay (peak reserved / peak live, ns per operation), so
// that the three can be put side by side (docs/benchmarks.md). Both come from
// the benchmarks' backend layer (bench/backend.hpp, BackendOptions::fresh):
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
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "backend.hpp"
#include "quoted_input.hpp"
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
      throw ArgError("--impl wants torch or async, got " + gvm::bench::quoted_input(a.impl));
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

// The trace's streams: index 0 the legacy default stream, the others the
// host's streams (made once, alive to the end of the process).
class Streams {
 public:
  Streams(const Trace& trace, gvm::bench::BackendHost& host) : streams_(trace.stream_count()) {
    for (std::size_t i = 1; i < streams_.size(); ++i) streams_[i] = host.stream(i - 1);
  }
  gvm::bench::StreamHandle operator[](std::size_t i) const { return streams_[i]; }

 private:
  std::vector<gvm::bench::StreamHandle> streams_;
};

struct PassResult {
  std::uint64_t wall_ns = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t peak_reserved = 0;            // sampled after each event (memory pass)
  std::uint64_t allocator_peak_reserved = 0;  // the allocator's own peak, read at the end
};

std::string describe(const Trace& trace, std::size_t i) {
  const TraceEvent& e = trace.events[i];
  std::ostringstream o;
  o << "event " << (i + 1) << " of " << trace.source << " ("
    << (e.op == TraceOp::allocate ? "allocate" : "free") << " id " << trace.block_ids[e.block]
    << ", " << e.bytes << " bytes, stream " << trace.stream_ids[e.stream] << ")";
  return o.str();
}

PassResult run_pass(const Trace& trace, gvm::bench::BackendHost& host, bool sample,
                    std::size_t timeline_every, std::vector<TimelinePoint>* timeline) {
  Streams streams(trace, host);
  // Every pass starts empty: a pool of its own (async), or emptyCache and
  // resetPeakStats (torch, which lives once per process).
  gvm::bench::BackendOptions options;
  options.fresh = true;
  std::unique_ptr<gvm::bench::Backend> backend = host.make_backend(options);
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
        backend->deallocate(ptrs[e.block], e.bytes, streams[e.stream]);
        ptrs[e.block] = nullptr;
        live -= e.bytes;
      }
      if (sample) {
        const std::uint64_t reserved = backend->reserved_bytes().value_or(0);
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
      if (ptrs[b]) backend->deallocate(ptrs[b], 0, nullptr);
    }
    throw std::runtime_error(describe(trace, i) + ": " + e.what());
  }
  r.allocator_peak_reserved = backend->peak_reserved_bytes().value_or(0);
  for (void* p : ptrs) {
    if (p) backend->deallocate(p, 0, nullptr);  // what the trace leaves live; untimed
  }
  return r;
}

void write_timeline(const std::string& path, const Trace& trace, const std::string& impl_name,
                    std::size_t every, const std::vector<TimelinePoint>& points) {
  errno = 0;
  std::ofstream out(path, std::ios::trunc);
  if (!out) {
    throw gvm::bench::OutputFileError("--timeline " + gvm::bench::quoted_input(path) +
                                      ": cannot write: " + std::strerror(errno));
  }
  out << "# gvm-replay-baseline (" << impl_name << ") timeline of " << trace.source
      << ": one row every " << every
      << " event(s) and after the last; live = requested bytes of live blocks,"
         " reserved = the allocator's reserved bytes\n";
  out << "event,live_bytes,reserved_bytes\n";
  for (const TimelinePoint& p : points) {
    out << p.event << ',' << p.live_bytes << ',' << p.reserved_bytes << '\n';
  }
  errno = 0;
  out.flush();
  if (!out) {
    throw gvm::bench::OutputFileError("--timeline " + gvm::bench::quoted_input(path) +
                                      ": error writing: " + std::strerror(errno));
  }
}

int run(const Args& a) {
  const std::string trace_path = a.trace.empty() ? default_trace() : a.trace;
  const Trace trace = gvm::bench::read_trace(trace_path);
  const gvm::bench::BackendKind kind = a.impl == "torch"
                                           ? gvm::bench::BackendKind::torch
                                           : gvm::bench::BackendKind::cuda_malloc_async;
  std::string why;
  gvm::bench::BackendHost* host = gvm::bench::backend_host(kind, &why);
  if (host == nullptr) throw std::runtime_error("--impl " + a.impl + ": " + why);
  host->bind_thread();
  const std::string impl_name = gvm::bench::backend_name(kind);

  std::vector<double> ns_per_op;
  const double events = static_cast<double>(trace.events.size());
  for (int r = 0; r < a.repeat; ++r) {
    const PassResult p = run_pass(trace, *host, false, 0, nullptr);
    ns_per_op.push_back(events == 0 ? 0.0 : static_cast<double>(p.wall_ns) / events);
  }
  std::vector<TimelinePoint> timeline;
  const PassResult memory =
      run_pass(trace, *host, true, a.timeline_every, a.timeline.empty() ? nullptr : &timeline);
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
      << "events         " << trace.events.size() << " ("
      << gvm::bench::count_of(trace.allocations, "allocation") << ", "
      << gvm::bench::count_of(trace.frees, "free") << ")\n"
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
    gvm::bench::print_arg_error("gvm-replay-baseline", e);
  } catch (const gvm::bench::TraceError& e) {
    std::cerr << "gvm-replay-baseline: bad trace: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gvm-replay-baseline: " << e.what() << "\n";
  }
  return 1;
}
