// gvm-replay: replays an allocation trace through gvm::Allocator and reports
// peak live vs peak reserved bytes, driver calls and time per operation.
// docs/replay.md explains every figure.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/errors.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "replay_cli.hpp"
#include "replay.hpp"
#include "trace.hpp"

namespace {

using gvm::bench::ReplayOptions;
using gvm::bench::ReplayResult;
using gvm::bench::TimelinePoint;
using gvm::bench::ArgError;
using gvm::bench::default_trace;
using gvm::bench::json_string;
using gvm::bench::median;
using gvm::bench::Trace;
using gvm::bench::TraceStreams;

constexpr const char* kUsage =
    "usage: gvm-replay [--driver cuda|sim|auto] [--profile NAME] [--devices N]\n"
    "                  [--conf \"key:value,...\"] [--repeat N] [--json]\n"
    "                  [--timeline FILE [--timeline-every N]] [TRACE]\n"
    "\n"
    "Replays TRACE (default: traces/gpt2_train.trace.gz of the source tree) through\n"
    "gvm::Allocator on device 0.\n"
    "  --driver auto      the CUDA driver if one loads, else a simulated GPU (default)\n"
    "  --driver cuda|sim  only that driver\n"
    "  --profile NAME     simulated GPU: p40 v100 t4 a100 l4 h100 h200 b200 (default h200)\n"
    "  --devices N        simulated devices (default 1); with cuda, at least N must exist\n"
    "  --conf TEXT        allocator config over GVM_CONF, e.g. \"max_chunk_size:256MiB\"\n"
    "  --repeat N         timed replays, each on a fresh allocator; ns/op is the median\n"
    "  --json             one JSON object on stdout instead of the table\n"
    "  --timeline FILE    CSV event,live_bytes,reserved_bytes from the memory pass\n"
    "  --timeline-every N one row every N events (default 1; the last event always)\n";

struct Args : gvm::bench::ReplayArgs {
  std::string driver = "auto";
  std::optional<std::string> profile;
  std::optional<int> devices;
  std::string conf;
};

Args parse_args(int argc, char** argv) {
  Args a;
  gvm::bench::parse_replay_args(argc, argv, a, [&](const std::string& flag, const auto& value) {
    if (flag == "--driver") {
      a.driver = value();
      if (a.driver != "cuda" && a.driver != "sim" && a.driver != "auto") {
        throw ArgError("--driver wants cuda, sim or auto, got '" + a.driver + "'");
      }
    } else if (flag == "--profile") {
      a.profile = value();
    } else if (flag == "--devices") {
      a.devices = static_cast<int>(gvm::bench::parse_count(flag, value(), 1, 64));
    } else if (flag == "--conf") {
      a.conf = value();
    } else {
      return false;
    }
    return true;
  });
  return a;
}

struct DriverChoice {
  std::unique_ptr<gvm::vmm::TestDriver> driver;
  std::string description;  // "cuda" or "sim (simulated NVIDIA H200 x 1)"
};

DriverChoice choose_driver(const Args& a) {
  using namespace gvm::vmm;
  DriverChoice c;
  if (a.driver == "cuda" && a.profile) throw ArgError("--profile applies to --driver sim only");
  if (a.driver != "sim") {
    std::string why;
    c.driver = try_load_cuda_test_driver(&why);
    if (c.driver) {
      int count = 0;
      check(c.driver->device_count(&count), "cuDeviceGetCount");
      if (a.devices && count < *a.devices) {
        throw ArgError("--devices " + std::to_string(*a.devices) + ": the CUDA driver shows " +
                       std::to_string(count));
      }
      if (a.profile) std::cerr << "gvm-replay: --profile ignored: the CUDA driver loaded\n";
      c.description = "cuda";
      return c;
    }
    if (a.driver == "cuda") throw std::runtime_error("--driver cuda: " + why);
    std::cerr << "gvm-replay: " << why << "; replaying on a simulated GPU instead\n";
  }
  Profile p = Profile::h200;
  if (a.profile) {
    try {
      p = parse_profile(*a.profile);
    } catch (const std::invalid_argument& e) {
      throw ArgError(std::string("--profile: ") + e.what());
    }
  }
  const int devices = a.devices.value_or(1);
  c.driver = SimDriver::uniform(p, devices);
  c.description = std::string("sim (simulated ") + profile(p).name + " x " +
                  std::to_string(devices) + ", profile " + profile_name(p) + ")";
  return c;
}

std::string gib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

void write_timeline(const std::string& path, const Trace& trace, std::size_t every,
                    const std::vector<TimelinePoint>& points) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw std::runtime_error("--timeline: cannot write " + path);
  out << "# gvm-replay timeline of " << trace.source << ": one row every " << every
      << " event(s) and after the last; live = requested bytes of live blocks,"
         " reserved = Allocator::device_stats(0).reserved_bytes\n";
  out << "event,live_bytes,reserved_bytes\n";
  for (const TimelinePoint& p : points) {
    out << p.event << ',' << p.live_bytes << ',' << p.reserved_bytes << '\n';
  }
  out.flush();
  if (!out) throw std::runtime_error("--timeline: error writing " + path);
}

int run(const Args& a) {
  const std::string trace_path = a.trace.empty() ? default_trace() : a.trace;
  // GVM_CONF first, then --conf over it.
  gvm::Config config;
  try {
    config = gvm::config_from_env();
  } catch (const gvm::config_error& e) {
    throw ArgError(std::string("GVM_CONF: ") + e.what());
  }
  try {
    config = gvm::parse_config(a.conf, config);
  } catch (const gvm::config_error& e) {
    throw ArgError(std::string("--conf: ") + e.what());
  }

  const Trace trace = gvm::bench::read_trace(trace_path);
  DriverChoice choice = choose_driver(a);
  gvm::vmm::TestDriver& driver = *choice.driver;
  constexpr int kDevice = 0;

  // Timed passes: nothing sampled inside the loop.
  std::vector<double> ns_per_op;
  ReplayResult timed;
  for (int r = 0; r < a.repeat; ++r) {
    TraceStreams streams(driver, kDevice, trace);  // outlives the allocator
    gvm::Allocator allocator(driver, config);
    ReplayOptions options;
    options.streams = &streams;
    timed = gvm::bench::replay(trace, allocator, driver, kDevice, options);
    ns_per_op.push_back(timed.ns_per_op());
  }

  // Memory pass: device_stats after every event, on a fresh allocator.
  std::vector<TimelinePoint> timeline;
  ReplayResult memory;
  std::string device_name;
  std::string effective_conf;
  {
    TraceStreams streams(driver, kDevice, trace);
    gvm::Allocator allocator(driver, config);
    ReplayOptions options;
    options.streams = &streams;
    options.sample_memory = true;
    if (!a.timeline.empty()) {
      options.timeline = &timeline;
      options.timeline_every = a.timeline_every;
    }
    memory = gvm::bench::replay(trace, allocator, driver, kDevice, options);
    device_name = allocator.caps(kDevice).name;
    effective_conf = gvm::to_string(allocator.config());
  }
  if (!a.timeline.empty()) write_timeline(a.timeline, trace, a.timeline_every, timeline);
  // The memory pass stands for the timed ones only if the allocator made the
  // same reservations in both; its own peak, read once per pass, shows that.
  if (timed.allocator_peak_reserved_bytes != memory.allocator_peak_reserved_bytes) {
    std::cerr << "gvm-replay: note: the allocator's peak reserved differed between the timed pass ("
              << timed.allocator_peak_reserved_bytes << " bytes) and the memory pass ("
              << memory.allocator_peak_reserved_bytes << " bytes)\n";
  }

  const double ratio = memory.peak_live_bytes == 0
                           ? 0.0
                           : static_cast<double>(memory.peak_reserved_bytes) /
                                 static_cast<double>(memory.peak_live_bytes);
  const double ns = median(ns_per_op);
  const auto [min_ns, max_ns] = std::minmax_element(ns_per_op.begin(), ns_per_op.end());
  std::ostringstream o;
  o.precision(6);
  if (a.json) {
    o << "{\"trace\":" << json_string(trace.source) << ",\"events\":" << timed.events
      << ",\"allocations\":" << timed.allocations << ",\"frees\":" << timed.frees
      << ",\"peak_live_bytes\":" << memory.peak_live_bytes
      << ",\"peak_reserved_bytes\":" << memory.peak_reserved_bytes
      << ",\"allocator_peak_reserved_bytes\":" << memory.allocator_peak_reserved_bytes
      << ",\"ratio\":" << ratio << ",\"driver_calls\":" << timed.driver_calls
      << ",\"driver_call_ns\":" << timed.driver_call_ns << ",\"ns_per_op\":" << ns
      << ",\"ns_per_op_runs\":[";
    for (std::size_t i = 0; i < ns_per_op.size(); ++i) o << (i ? "," : "") << ns_per_op[i];
    o << "],\"repeat\":" << a.repeat << ",\"driver\":" << json_string(driver.name())
      << ",\"driver_detail\":" << json_string(choice.description)
      << ",\"device\":" << json_string(device_name) << ",\"conf\":" << json_string(effective_conf)
      << "}\n";
  } else {
    o << "trace          " << trace.source << "\n"
      << "driver         " << choice.description << "\n"
      << "device         " << device_name << " (device " << kDevice << ")\n"
      << "conf           " << effective_conf << "\n"
      << "events         " << timed.events << " (" << timed.allocations << " allocations, "
      << timed.frees << " frees)\n"
      << "peak live      " << memory.peak_live_bytes << " bytes (" << gib(memory.peak_live_bytes)
      << ")\n"
      << "peak reserved  " << memory.peak_reserved_bytes << " bytes ("
      << gib(memory.peak_reserved_bytes) << "), sampled after every event\n"
      << "ratio          " << ratio << " reserved / live\n"
      << "driver calls   " << timed.driver_calls << " in the replay loop ("
      << static_cast<double>(timed.driver_call_ns) / 1e6 << " ms inside them)\n"
      << "ns per op      " << ns;
    if (a.repeat > 1) {
      o << " (median of " << a.repeat << " runs, " << *min_ns << " to " << *max_ns << ")";
    }
    o << "\n";
  }
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
    std::cerr << "gvm-replay: " << e.what() << "\n\n" << kUsage;
  } catch (const gvm::bench::TraceError& e) {
    std::cerr << "gvm-replay: bad trace: " << e.what() << "\n";
  } catch (const gvm::out_of_memory& e) {
    std::cerr << "gvm-replay: out of memory: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gvm-replay: " << e.what() << "\n";
  }
  return 1;
}
