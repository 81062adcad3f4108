// gvm-excess: where a trace's excess (reserved - live) is at its peak.
//
// Replays each trace on a simulated GPU twice: once to find the event after
// which reserved bytes first reach their peak, once more up to that event,
// where it reads Allocator::memory_map and the driver's mappings and prints
// what the reserved bytes hold (bench/excess.hpp), the free holes by size and
// stream, and the growth that set the peak. Markdown, for docs/design-notes.md.
// With --at N the same, after event N instead of the peak's: the moment
// before a peak is often where its cause shows (a hole too small for the
// request that then grows).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "excess.hpp"
#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/errors.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "mapping_log_driver.hpp"
#include "replay.hpp"
#include "replay_cli.hpp"
#include "trace.hpp"

namespace {

using gvm::bench::ArgError;
using gvm::bench::ExcessBreakdown;
using gvm::bench::Hole;
using gvm::bench::LiveRef;
using gvm::bench::Trace;
using gvm::bench::TraceEvent;
using gvm::bench::TraceOp;

constexpr const char* kUsage =
    "usage: gvm-excess [--profile NAME] [--conf \"key:value,...\"] [--holes] [--at N] TRACE...\n"
    "\n"
    "Replays each TRACE on a simulated GPU (default h200) and prints, as Markdown,\n"
    "where its reserved bytes are at the moment they first reach their peak:\n"
    "live bytes, rounding, small-block spans, free holes (by size and stream,\n"
    "inside chunks with live data or in wholly free chunks) and the growth that\n"
    "set the peak. docs/design-notes.md explains the categories.\n"
    "  --holes  also list every block of the arena at the peak, in address order\n"
    "  --at N   the same after event N (1-based, as the report numbers them)\n"
    "           instead of at the peak\n";

struct Args {
  std::string profile = "h200";
  std::string conf;
  std::vector<std::string> traces;
  bool help = false;
  bool list_holes = false;
  std::size_t at = 0;  // 1-based event; 0: the peak's
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (auto eq = arg.find('='); eq != std::string::npos) return arg.substr(eq + 1);
      if (i + 1 >= argc) throw ArgError(arg + " needs a value");
      return argv[++i];
    };
    const std::string flag = arg.substr(0, arg.find('='));
    if (arg == "-h" || arg == "--help") {
      a.help = true;
    } else if (flag == "--profile") {
      a.profile = value();
    } else if (flag == "--conf") {
      a.conf = value();
    } else if (arg == "--holes") {
      a.list_holes = true;
    } else if (flag == "--at") {
      const std::string v = value();
      std::size_t used = 0;
      unsigned long long n = 0;
      try {
        n = std::stoull(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || v.empty() || v[0] == '-' || n == 0)
        throw ArgError("--at: '" + v + "' is not an event number (1 or more)");
      a.at = static_cast<std::size_t>(n);
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw ArgError("unknown option '" + arg + "'");
    } else {
      a.traces.push_back(arg);
    }
  }
  if (!a.help && a.traces.empty()) throw ArgError("no trace given");
  return a;
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / double(1 << 20));
  return buf;
}

std::string pct(std::size_t part, std::size_t whole) {
  if (whole == 0) return "—";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * static_cast<double>(part) / double(whole));
  return buf;
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// One replay on a fresh simulated device, up to and including event `stop`
// (SIZE_MAX: all of them), with a hook after every event.
struct Run {
  std::unique_ptr<gvm::vmm::SimDriver> sim;
  std::unique_ptr<gvm::bench::MappingLogDriver> driver;
  std::unique_ptr<gvm::bench::TraceStreams> streams;
  std::unique_ptr<gvm::Allocator> allocator;
  std::vector<void*> held;
  std::unordered_map<std::uintptr_t, LiveRef> live;
  std::uint64_t live_bytes = 0;

  Run(const Trace& trace, gvm::vmm::Profile profile, const gvm::Config& config)
      : sim(gvm::vmm::SimDriver::uniform(profile, 1)),
        driver(std::make_unique<gvm::bench::MappingLogDriver>(*sim)),
        streams(std::make_unique<gvm::bench::TraceStreams>(*driver, 0, trace)),
        allocator(std::make_unique<gvm::Allocator>(*driver, config)),
        held(trace.block_count(), nullptr) {}
  ~Run() {
    allocator.reset();  // before its streams and driver
    streams.reset();
  }

  void step(const Trace& trace, const TraceEvent& e) {
    const gvm::vmm::StreamHandle s = (*streams)[e.stream];
    if (e.op == TraceOp::allocate) {
      void* p = allocator->allocate(e.bytes, 0, s);
      held[e.block] = p;
      live[reinterpret_cast<std::uintptr_t>(p)] = LiveRef{e.bytes, trace.stream_ids[e.stream]};
      live_bytes += e.bytes;
    } else {
      allocator->deallocate(held[e.block], e.bytes, 0, s);
      live.erase(reinterpret_cast<std::uintptr_t>(held[e.block]));
      held[e.block] = nullptr;
      live_bytes -= e.bytes;
    }
  }
  std::size_t reserved() const { return allocator->device_stats(0).reserved_bytes; }
};

struct Peaks {
  std::size_t reserved_event = 0;  // 0-based index of the event that first reached it
  std::size_t reserved = 0;
  std::size_t live_event = 0;
  std::uint64_t live = 0;
  std::uint64_t chunks_mapped = 0, chunks_unmapped = 0, fences = 0;
  std::string driver_calls;  // "cuMemCreate 12, cuMemMap 12, ..." over the replay
};

Peaks find_peaks(const Trace& trace, gvm::vmm::Profile profile, const gvm::Config& config) {
  Run run(trace, profile, config);
  const gvm::DriverCallStats before = run.allocator->stats().driver;
  Peaks p;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    run.step(trace, trace.events[i]);
    const std::size_t r = run.reserved();
    if (r > p.reserved) {
      p.reserved = r;
      p.reserved_event = i;
    }
    if (run.live_bytes > p.live) {
      p.live = run.live_bytes;
      p.live_event = i;
    }
  }
  const gvm::DeviceStats st = run.allocator->device_stats(0);
  p.chunks_mapped = st.chunks_mapped;
  p.chunks_unmapped = st.chunks_unmapped;
  p.fences = st.fences;
  const gvm::DriverCallStats after = run.allocator->stats().driver;
  std::uint64_t total = 0;
  for (int c = 0; c < gvm::vmm::kCallCount; ++c) {
    const std::uint64_t n = after.calls[static_cast<std::size_t>(c)] -
                            before.calls[static_cast<std::size_t>(c)];
    if (n == 0) continue;
    total += n;
    if (!p.driver_calls.empty()) p.driver_calls += ", ";
    p.driver_calls += std::string(gvm::vmm::call_name(static_cast<gvm::vmm::Call>(c))) + " " +
                      std::to_string(n);
  }
  p.driver_calls = std::to_string(total) + " driver calls (" + p.driver_calls + ")";
  return p;
}

std::unordered_map<const void*, std::uint64_t> stream_names(const Run& run, const Trace& trace) {
  std::unordered_map<const void*, std::uint64_t> names;
  for (std::size_t i = 1; i < run.streams->size(); ++i) names[(*run.streams)[i]] = trace.stream_ids[i];
  return names;
}

struct HoleStats {
  std::size_t largest = 0, free_total = 0;
};

HoleStats hole_stats(const std::vector<gvm::SegmentInfo>& map) {
  HoleStats h;
  for (const auto& s : map)
    for (const auto& b : s.blocks)
      if (!b.allocated && !b.small) {
        h.largest = std::max(h.largest, b.size);
        h.free_total += b.size;
      }
  return h;
}

void report(std::ostream& o, const std::string& path, gvm::vmm::Profile profile,
            const gvm::Config& config, bool list_holes, std::size_t at) {
  const Trace trace = gvm::bench::read_trace(path);
  if (trace.events.empty()) throw std::runtime_error(path + ": the trace has no events");
  if (at > trace.events.size())
    throw ArgError("--at " + std::to_string(at) + ": " + path + " has " +
                   std::to_string(trace.events.size()) + " events");
  const Peaks peaks = find_peaks(trace, profile, config);

  Run run(trace, profile, config);
  const std::size_t p = at != 0 ? at - 1 : peaks.reserved_event;
  for (std::size_t i = 0; i < p; ++i) run.step(trace, trace.events[i]);
  const std::size_t reserved_before = run.reserved();
  const auto map_before = run.allocator->memory_map(0);
  const HoleStats before = hole_stats(map_before);
  const gvm::bench::ChunkEnds ends = gvm::bench::chunk_free_ends(map_before, run.driver->mapped());
  run.step(trace, trace.events[p]);
  const auto map = run.allocator->memory_map(0);
  const ExcessBreakdown x = gvm::bench::analyze_excess(
      map, run.driver->mapped(), run.live, stream_names(run, trace),
      run.allocator->caps(0).granularity);
  if (at == 0 && x.reserved != peaks.reserved)
    throw std::logic_error("the second replay reached " + std::to_string(x.reserved) +
                           " reserved bytes at the peak event, the first " +
                           std::to_string(peaks.reserved));

  const TraceEvent& pe = trace.events[p];
  const double ratio = static_cast<double>(peaks.reserved) / static_cast<double>(peaks.live);
  o << "### " << base_name(path) << "\n\n";
  // The event reported: the peak's, or the one --at names.
  const std::string event = std::string(pe.op == TraceOp::allocate ? "allocate " : "free ") +
                           mib(pe.bytes) + " MiB on stream " +
                           std::to_string(trace.stream_ids[pe.stream]);
  if (at != 0) {
    o << "At event " << at << " of " << trace.events.size() << " (" << event << "): reserved "
      << mib(x.reserved) << " MiB, live " << mib(x.live) << " MiB. Peak reserved "
      << mib(peaks.reserved) << " MiB after event " << peaks.reserved_event + 1;
  } else {
    o << "Peak reserved " << mib(peaks.reserved) << " MiB after event " << p + 1 << " of "
      << trace.events.size() << " (" << event << "); live then " << mib(x.live) << " MiB";
  }
  o << "; peak live " << mib(peaks.live) << " MiB (event " << peaks.live_event + 1 << "); ratio ";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", ratio);
  o << buf << ". Over the whole replay: " << peaks.chunks_mapped << " chunks mapped, "
    << peaks.chunks_unmapped << " unmapped, " << peaks.fences << " fences; " << peaks.driver_calls
    << ".\n\n";

  const std::size_t e = x.excess();
  const char* moment = at != 0 ? "at the event" : "at the peak";
  o << "| " << moment << " | MiB | share of the excess |\n|---|---|---|\n";
  auto row = [&](const char* what, std::size_t bytes) {
    o << "| " << what << " | " << mib(bytes) << " | " << pct(bytes, e) << " |\n";
  };
  o << "| live (requested bytes) | " << mib(x.live) << " | — |\n";
  o << "| excess (reserved − live) | " << mib(e) << " | 100% |\n";
  row("rounding of live large blocks", x.rounding_large);
  row("rounding of live small blocks (size classes)", x.rounding_small);
  row("free slots of small-block spans in use", x.span_free);
  row("small-block spans with no live slot", x.empty_spans);
  row("free hole bytes in granules shared with live data", x.hole_shared);
  row("free granules in chunks that hold live data", x.hole_granules_live);
  row("granules of wholly free chunks", x.free_chunks);
  o << "\n" << x.chunks << " chunks mapped " << moment << ", " << x.chunks_wholly_free
    << " of them wholly free; live: " << x.live_blocks_large << " large blocks, "
    << x.live_blocks_small << " small ones (" << mib(x.live_bytes_small) << " MiB).\n\n";

  if (!x.span_classes.empty()) {
    std::vector<std::pair<std::size_t, gvm::bench::SpanClass>> classes(x.span_classes.begin(),
                                                                       x.span_classes.end());
    std::sort(classes.begin(), classes.end(),
              [](const auto& a, const auto& b) { return a.second.free_bytes > b.second.free_bytes; });
    o << "| small-block spans in use, by slot size (most free first) | spans | live slots | free "
         "MiB |\n|---|---|---|---|\n";
    std::size_t shown = 0, rest_spans = 0, rest_free = 0;
    for (const auto& [slot, c] : classes) {
      if (shown++ < 8) {
        o << "| " << slot << " B | " << c.spans << " | " << c.live_slots << " | "
          << mib(c.free_bytes) << " |\n";
      } else {
        rest_spans += c.spans;
        rest_free += c.free_bytes;
      }
    }
    if (classes.size() > 8)
      o << "| " << classes.size() - 8 << " more slot sizes | " << rest_spans << " | | "
        << mib(rest_free) << " |\n";
    o << "\n";
  }

  struct Bucket {
    const char* name;
    std::size_t max;  // exclusive upper bound
    std::size_t holes = 0, bytes = 0, free_granules = 0, in_live_chunks = 0;
  };
  constexpr std::size_t M = std::size_t{1} << 20;
  Bucket buckets[] = {{"< 2 MiB", 2 * M},        {"2–8 MiB", 8 * M},
                      {"8–32 MiB", 32 * M},      {"32–128 MiB", 128 * M},
                      {"128–512 MiB", 512 * M},  {"≥ 512 MiB", SIZE_MAX}};
  std::map<std::string, std::pair<std::size_t, std::size_t>> by_stream;  // holes, bytes
  for (const Hole& h : x.holes) {
    for (Bucket& b : buckets) {
      if (h.size >= b.max) continue;
      ++b.holes;
      b.bytes += h.size;
      b.free_granules += h.free_granule_bytes;
      if (h.chunk_has_live) b.in_live_chunks += h.size;
      break;
    }
    auto& s = by_stream[h.stream];
    ++s.first;
    s.second += h.size;
  }
  o << "| free holes by size | holes | MiB | MiB in whole free granules | MiB in chunks with live "
       "data |\n|---|---|---|---|---|\n";
  for (const Bucket& b : buckets) {
    if (b.holes == 0) continue;
    o << "| " << b.name << " | " << b.holes << " | " << mib(b.bytes) << " | "
      << mib(b.free_granules) << " | " << mib(b.in_live_chunks) << " |\n";
  }
  o << "\n| free holes by stream (last user) | holes | MiB |\n|---|---|---|\n";
  for (const auto& [name, s] : by_stream)
    o << "| " << name << " | " << s.first << " | " << mib(s.second) << " |\n";
  std::size_t crossing = 0;
  for (const Hole& h : x.holes) crossing += h.crosses_chunks ? 1 : 0;
  o << "\n" << x.holes.size() << " holes, " << crossing << " of them across a chunk boundary.";
  if (pe.op == TraceOp::allocate) {
    o << (at != 0 ? " The event" : " The growth that set the peak") << ": a request of "
      << mib(pe.bytes) << " MiB grew reserved by "
      << mib(x.reserved - std::min(x.reserved, reserved_before)) << " MiB; the largest free hole before it was "
      << mib(before.largest) << " MiB, all holes together " << mib(before.free_total) << " MiB.";
  }
  if (pe.op == TraceOp::allocate && run.allocator->caps(0).vmm && !config.force_no_vmm) {
    // What the free ends of two chunks could have served (bench/excess.hpp,
    // ChunkEnds): the rest of the request in new granules between them.
    // Only handles map again: without VMM a segment has one address.
    const std::size_t g = x.granule;
    const std::size_t rest = pe.bytes > ends.best_pair ? pe.bytes - ends.best_pair : 0;
    o << " Free chunk ends before it: one chunk's free end and another's free start "
      << mib(ends.best_pair) << " MiB together (the largest end " << mib(ends.largest_end)
      << " MiB, start " << mib(ends.largest_start) << " MiB), chunks with nothing in use "
      << mib(ends.wholly_free) << " MiB; the request made of those two chunks mapped again side by "
         "side would have needed "
      << mib((rest + g - 1) / g * g) << " MiB of new memory.";
  }
  o << "\n\n";
  if (list_holes && !map.empty()) {
    // Every block of the arena in address order, offsets from its first segment.
    const std::uintptr_t base = map.front().addr;
    o << "| offset MiB | MiB | what |\n|---|---|---|\n";
    for (const auto& seg : map) {
      if (seg.scratch) continue;
      o << "| " << mib(seg.addr - base) << " | " << mib(seg.size) << " | segment |\n";
      for (const auto& b : seg.blocks)
        o << "| " << mib(b.addr - base) << " | " << mib(b.size) << " | "
          << (b.allocated ? (b.small ? "live small" : "live") : (b.small ? "free slots" : "hole"))
          << " |\n";
    }
    o << "\n";
  }
}

int run(const Args& a) {
  gvm::vmm::Profile profile;
  try {
    profile = gvm::vmm::parse_profile(a.profile);
  } catch (const std::invalid_argument& e) {
    throw ArgError(std::string("--profile: ") + e.what());
  }
  gvm::Config config;
  try {
    config = gvm::parse_config(a.conf, gvm::config_from_env());
  } catch (const gvm::config_error& e) {
    throw ArgError(std::string("--conf / GVM_CONF: ") + e.what());
  }
  std::ostringstream o;
  o << "Simulated " << gvm::vmm::profile(profile).name << ", conf " << gvm::to_string(config)
    << ".\n\n";
  for (const std::string& t : a.traces) report(o, t, profile, config, a.list_holes, a.at);
  std::cout << o.str() << std::flush;
  return 0;
}

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
    std::cerr << "gvm-excess: " << e.what() << "\n(gvm-excess --help for the usage)\n";
  } catch (const gvm::bench::TraceError& e) {
    std::cerr << "gvm-excess: bad trace: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gvm-excess: " << e.what() << "\n";
  }
  return 1;
}
