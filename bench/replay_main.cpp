// gvm-replay: replays an allocation trace through gvm::Allocator and reports
// peak live vs peak reserved bytes, driver calls and time per operation.
// docs/replay.md explains every figure.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
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
#include "gvm/vmm/sim_driver.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "replay_cli.hpp"
#include "replay.hpp"
#include "shipped_traces.hpp"
#include "trace.hpp"

namespace {

using gvm::bench::ReplayOptions;
using gvm::bench::ReplayResult;
using gvm::bench::TimelinePoint;
using gvm::bench::ArgError;
using gvm::bench::json_string;
using gvm::bench::median;
using gvm::bench::Trace;
using gvm::bench::TraceStreams;

constexpr const char* kUsage =
    "usage: gvm-replay [--driver cuda|sim|auto] [--profile NAME] [--devices N]\n"
    "                  [--conf \"key:value,...\"] [--repeat N] [--json]\n"
    "                  [--timeline FILE [--timeline-every N]] [--plot FILE|none]\n"
    "                  [TRACE | --snapshot SNAPSHOT.pickle]\n"
    "\n"
    "Without TRACE: replays every shipped trace (traces/peers.csv of the source tree)\n"
    "and prints gvmalloc's peak reserved / peak live beside the peers' recorded\n"
    "figures, its driver calls and its time per operation, and draws the table\n"
    "as a plot where python3 has matplotlib. With TRACE: that trace alone, in detail.\n"
    "With --snapshot: a PyTorch memory snapshot with history (torch.cuda.memory.\n"
    "_record_memory_history, then _dump_snapshot), converted by tools/snapshot_to_trace.py\n"
    "and replayed, beside what PyTorch reserved in the same run.\n"
    "  --driver auto      the CUDA driver if one loads, else a simulated GPU (default)\n"
    "  --driver cuda|sim  only that driver\n"
    "  --profile NAME     simulated GPU: p40 v100 t4 a100 l4 h100 h200 b200 (default h200)\n"
    "  --devices N        simulated devices (default 1); with cuda, at least N must exist\n"
    "  --conf TEXT        allocator config over GVM_CONF, e.g. \"max_chunk_size:256MiB\"\n"
    "  --repeat N         timed replays, each on a fresh allocator; ns/op is the median\n"
    "  --json             JSON on stdout instead of the table (an array without TRACE)\n"
    "  --timeline FILE    CSV event,live_bytes,reserved_bytes from the memory pass (TRACE only)\n"
    "  --timeline-every N one row every N events (default 1; the last event always)\n"
    "  --plot FILE|none   without TRACE: the plot's file (default gvm-replay.png), or none\n";

struct Args : gvm::bench::ReplayArgs {
  std::string driver = "auto";
  std::optional<std::string> profile;
  std::optional<int> devices;
  std::string conf;
  std::string plot = "gvm-replay.png";
  std::string snapshot;
};

Args parse_args(int argc, char** argv) {
  Args a;
  gvm::bench::parse_replay_args(argc, argv, a, [&](const std::string& flag, const auto& value) {
    if (flag == "--driver") {
      a.driver = value();
      if (a.driver != "cuda" && a.driver != "sim" && a.driver != "auto") {
        throw ArgError("--driver wants cuda, sim or auto, got " + gvm::bench::quoted_input(a.driver));
      }
    } else if (flag == "--profile") {
      a.profile = value();
    } else if (flag == "--devices") {
      a.devices = static_cast<int>(gvm::bench::parse_count(flag, value(), 1, 64));
    } else if (flag == "--conf") {
      a.conf = value();
    } else if (flag == "--snapshot") {
      a.snapshot = value();
      if (a.snapshot.empty()) throw ArgError("--snapshot needs a file name");
    } else if (flag == "--plot") {
      a.plot = value();
      if (a.plot.empty()) throw ArgError("--plot needs a file name or none");
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
  if (!out)
    throw std::runtime_error("--timeline " + gvm::bench::quoted_input(path) +
                             ": cannot write: " + std::strerror(errno));
  out << "# gvm-replay timeline of " << trace.source << ": one row every " << every
      << " event(s) and after the last; live = requested bytes of live blocks,"
         " reserved = Allocator::device_stats(0).reserved_bytes\n";
  out << "event,live_bytes,reserved_bytes\n";
  for (const TimelinePoint& p : points) {
    out << p.event << ',' << p.live_bytes << ',' << p.reserved_bytes << '\n';
  }
  out.flush();
  if (!out)
    throw std::runtime_error("--timeline " + gvm::bench::quoted_input(path) +
                             ": error writing: " + std::strerror(errno));
}

std::string fixed_percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * f);
  return buf;
}

// The allocator's config as the keys that differ from the defaults.
std::string conf_changes(const gvm::Config& c) {
  auto fields = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string f; std::getline(in, f, ',');) out.push_back(f);
    return out;
  };
  const std::vector<std::string> now = fields(gvm::to_string(c));
  const std::vector<std::string> dflt = fields(gvm::to_string(gvm::Config{}));
  std::string out;
  for (const std::string& f : now)
    if (std::find(dflt.begin(), dflt.end(), f) == dflt.end()) out += (out.empty() ? "" : ",") + f;
  return out.empty() ? "defaults" : out;
}

gvm::Config config_of(const Args& a) {
  // GVM_CONF first, then --conf over it.
  gvm::Config config;
  try {
    config = gvm::config_from_env();
  } catch (const gvm::config_error& e) {
    throw ArgError(e.what());  // it names GVM_CONF itself
  }
  try {
    config = gvm::parse_config(a.conf, config);
  } catch (const gvm::config_error& e) {
    throw ArgError(std::string("--conf: ") + e.what());
  }
  return config;
}

// One trace measured: --repeat timed passes and one memory pass.
struct Measurement {
  ReplayResult timed, memory;
  std::vector<double> ns_per_op;
  std::vector<TimelinePoint> timeline;
  std::string device_name, effective_conf;
  double ratio() const {
    return memory.peak_live_bytes == 0 ? 0.0
                                       : static_cast<double>(memory.peak_reserved_bytes) /
                                             static_cast<double>(memory.peak_live_bytes);
  }
};

Measurement measure(const Trace& trace, gvm::vmm::TestDriver& driver, const gvm::Config& config,
                    const Args& a, bool keep_timeline) {
  constexpr int kDevice = 0;
  Measurement m;
  // Timed passes: nothing sampled inside the loop.
  for (int r = 0; r < a.repeat; ++r) {
    TraceStreams streams(driver, kDevice, trace);  // outlives the allocator
    gvm::Allocator allocator(driver, config);
    ReplayOptions options;
    options.streams = &streams;
    m.timed = gvm::bench::replay(trace, allocator, driver, kDevice, options);
    m.ns_per_op.push_back(m.timed.ns_per_op());
  }
  // Memory pass: device_stats after every event, on a fresh allocator.
  {
    TraceStreams streams(driver, kDevice, trace);
    gvm::Allocator allocator(driver, config);
    ReplayOptions options;
    options.streams = &streams;
    options.sample_memory = true;
    if (keep_timeline) {
      options.timeline = &m.timeline;
      options.timeline_every = a.timeline_every;
    }
    m.memory = gvm::bench::replay(trace, allocator, driver, kDevice, options);
    m.device_name = allocator.caps(kDevice).name;
    m.effective_conf = gvm::to_string(allocator.config());
  }
  // The memory pass stands for the timed ones only if the allocator made the
  // same reservations in both; its own peak, read once per pass, shows that.
  if (m.timed.allocator_peak_reserved_bytes != m.memory.allocator_peak_reserved_bytes) {
    std::cerr << "gvm-replay: note: " << trace.source
              << ": the allocator's peak reserved differed between the timed pass ("
              << m.timed.allocator_peak_reserved_bytes << " bytes) and the memory pass ("
              << m.memory.allocator_peak_reserved_bytes << " bytes)\n";
  }
  return m;
}

// What tools/snapshot_to_trace.py said about the snapshot (its --summary).
struct SnapshotSummary {
  std::string snapshot;
  std::map<std::string, std::string> fields;
  std::string get(const std::string& k) const {
    auto it = fields.find(k);
    return it == fields.end() ? "" : it->second;
  }
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Converts the snapshot to a temporary trace; the converter's own message on failure.
SnapshotSummary convert_snapshot(const std::string& snapshot, std::string* trace_path) {
  const std::string script = std::string(GVM_SOURCE_DIR) + "/tools/snapshot_to_trace.py";
  if (!std::ifstream(script).good())
    throw std::runtime_error("--snapshot: " + script + " is not there");
  if (!std::ifstream(snapshot).good())
    throw std::runtime_error("--snapshot: cannot open " + snapshot + ": " + std::strerror(errno));
  char dir[] = "/tmp/gvm-snapshot-XXXXXX";
  if (mkdtemp(dir) == nullptr)
    throw std::runtime_error(std::string("--snapshot: no temporary folder: ") + std::strerror(errno));
  const std::string d = dir;
  *trace_path = d + "/snapshot.trace.gz";
  const std::string summary = d + "/summary.txt";
  const std::string cmd = "python3 " + shell_quote(script) + " " + shell_quote(snapshot) + " -o " +
                          shell_quote(*trace_path) + " --summary " + shell_quote(summary) + " 2>&1";
  std::string said;
  int status = -1;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p) != nullptr) said += buf;
    status = pclose(p);
  }
  SnapshotSummary s;
  s.snapshot = snapshot;
  std::ifstream in(summary);
  for (std::string line; std::getline(in, line);)
    if (auto eq = line.find('='); eq != std::string::npos) s.fields[line.substr(0, eq)] = line.substr(eq + 1);
  std::remove(summary.c_str());
  if (status != 0 || s.fields.empty()) {
    std::remove(trace_path->c_str());
    ::rmdir(dir);
    while (!said.empty() && said.back() == '\n') said.pop_back();
    const std::string prefix = "snapshot_to_trace: ";
    if (said.rfind(prefix, 0) == 0) said = said.substr(prefix.size());
    throw std::runtime_error("--snapshot: " +
                             (said.empty() ? std::string("python3 could not run ") + script : said));
  }
  // Notes of the converter (a late start of the recording) go to stderr.
  std::istringstream lines(said);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("note: ", 0) == 0) std::cerr << "gvm-replay: " << line << "\n";
  return s;
}

int run_one(const Args& a) {
  const gvm::Config config = config_of(a);
  std::optional<SnapshotSummary> snap;
  std::string trace_path = a.trace;
  if (!a.snapshot.empty()) snap = convert_snapshot(a.snapshot, &trace_path);
  struct Cleanup {
    const std::optional<SnapshotSummary>& snap;
    const std::string& path;
    ~Cleanup() {
      if (!snap) return;
      std::remove(path.c_str());
      ::rmdir(path.substr(0, path.find_last_of('/')).c_str());
    }
  } cleanup{snap, trace_path};
  Trace trace = gvm::bench::read_trace(trace_path);
  if (snap) trace.source = a.snapshot + " (its history as a trace)";
  DriverChoice choice = choose_driver(a);
  gvm::vmm::TestDriver& driver = *choice.driver;
  constexpr int kDevice = 0;
  const Measurement m = measure(trace, driver, config, a, !a.timeline.empty());
  if (!a.timeline.empty()) write_timeline(a.timeline, trace, a.timeline_every, m.timeline);

  const ReplayResult& timed = m.timed;
  const ReplayResult& memory = m.memory;
  const double ratio = m.ratio();
  const double ns = median(m.ns_per_op);
  const auto [min_ns, max_ns] = std::minmax_element(m.ns_per_op.begin(), m.ns_per_op.end());
  const bool simulated = std::string(driver.name()) == "sim";
  std::ostringstream o;
  o.precision(6);
  if (a.json) {
    o << "{\"trace\":" << json_string(trace.source) << ",\"events\":" << timed.events
      << ",\"allocations\":" << timed.allocations << ",\"frees\":" << timed.frees
      << ",\"peak_live_bytes\":" << memory.peak_live_bytes
      << ",\"peak_reserved_bytes\":" << memory.peak_reserved_bytes
      << ",\"allocator_peak_reserved_bytes\":" << memory.allocator_peak_reserved_bytes
      << ",\"ratio\":" << ratio << ",\"driver_calls\":" << timed.driver_calls
      << ",\"driver_call_ns\":" << timed.driver_call_ns << ",\"driver_calls_by\":{";
    bool first = true;
    for (std::size_t c = 0; c < timed.calls_by.size(); ++c) {
      if (timed.calls_by[c] == 0) continue;
      o << (first ? "" : ",") << json_string(gvm::vmm::call_name(static_cast<gvm::vmm::Call>(c)))
        << ":{\"calls\":" << timed.calls_by[c] << ",\"ns\":" << timed.ns_by[c] << "}";
      first = false;
    }
    o << "},\"ns_per_op\":" << ns << ",\"ns_per_op_runs\":[";
    for (std::size_t i = 0; i < m.ns_per_op.size(); ++i) o << (i ? "," : "") << m.ns_per_op[i];
    o << "],\"repeat\":" << a.repeat << ",\"driver\":" << json_string(driver.name())
      << ",\"driver_detail\":" << json_string(choice.description)
      << ",\"device\":" << json_string(m.device_name)
      << ",\"conf\":" << json_string(m.effective_conf);
    if (snap) {
      o << ",\"snapshot\":" << json_string(snap->snapshot)
        << ",\"pytorch_allocator\":" << json_string(snap->get("pytorch_allocator"))
        << ",\"pytorch_peak_reserved_bytes\":"
        << (snap->get("pytorch_peak_reserved_bytes").empty() ? "null" : snap->get("pytorch_peak_reserved_bytes"));
    }
    o << "}\n";
  } else {
    o << "trace          " << trace.source << "\n"
      << "driver         " << choice.description << "\n"
      << "device         " << m.device_name << " (device " << kDevice << ")\n"
      << "conf           " << conf_changes(config) << "\n"
      << "events         " << timed.events << " ("
      << gvm::bench::count_of(timed.allocations, "allocation") << ", "
      << gvm::bench::count_of(timed.frees, "free") << ")\n"
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
    if (simulated) o << " - CPU time on the simulated driver, not a GPU figure";
    o << "\n";
    if (snap) {
      o << "snapshot       " << snap->snapshot << ", device " << snap->get("device")
        << " (converted by tools/snapshot_to_trace.py)\n";
      const std::string pt = snap->get("pytorch_peak_reserved_bytes");
      // A snapshot of a run under gvmalloc's own PyTorch backend holds
      // gvmalloc's figures, not PyTorch's allocator's (the converter says so).
      const std::string recorder = snap->get("pytorch_allocator");
      const char* label = snap->get("recorded_by_gvmalloc") == "1" ? "recorded       " : "PyTorch        ";
      if (pt.empty()) {
        o << label << "no segment events in the history: its reserved bytes are unknown\n";
      } else {
        const double pytorch = std::stod(pt);
        const double ours = static_cast<double>(memory.peak_reserved_bytes);
        o << label << "peak reserved " << pt << " bytes (" << gib(static_cast<std::uint64_t>(pytorch))
          << ") in the recorded run, " << pytorch / static_cast<double>(memory.peak_live_bytes)
          << " reserved / live (" << recorder << ")\n";
        if (ours <= pytorch) {
          o << "saving         gvmalloc reserves " << static_cast<std::uint64_t>(pytorch - ours)
            << " bytes (" << gib(static_cast<std::uint64_t>(pytorch - ours)) << ", "
            << fixed_percent((pytorch - ours) / pytorch) << ") less at the peak\n";
        } else {
          o << "saving         none: gvmalloc reserves " << static_cast<std::uint64_t>(ours - pytorch)
            << " bytes more at the peak\n";
        }
      }
    }
  }
  std::cout << o.str() << std::flush;
  return 0;
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string time_text(double ns) {
  return ns >= 1000 ? fixed(ns / 1000, 2) + " us" : fixed(ns, 0) + " ns";
}

std::string pad(const std::string& s, std::size_t w) {
  // Widths count code points: the labels are ASCII, the figures too.
  return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' ');
}

// Where the peers' figures were measured, from peers.csv's "measured"
// column ("2026-12-04 (1× NVIDIA H200)"): "1× NVIDIA H200 (9 traces) and
// 1× NVIDIA H100 80GB HBM3 (5 traces)", the GPU of the most traces first.
std::string peer_gpus(const std::vector<gvm::bench::ShippedTrace>& traces) {
  std::vector<std::pair<std::string, int>> gpus;
  for (const auto& t : traces) {
    if (t.peers.empty()) continue;
    const std::string& m = t.peers.begin()->second.measured;
    const auto open = m.find('('), close = m.rfind(')');
    const std::string gpu = open != std::string::npos && close != std::string::npos && close > open
                                ? m.substr(open + 1, close - open - 1)
                                : "a GPU peers.csv does not name";
    auto it = std::find_if(gpus.begin(), gpus.end(), [&](const auto& g) { return g.first == gpu; });
    if (it == gpus.end())
      gpus.emplace_back(gpu, 1);
    else
      ++it->second;
  }
  std::stable_sort(gpus.begin(), gpus.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    if (i != 0) out += i + 1 == gpus.size() ? " and " : ", ";
    out += gpus[i].first;
    if (gpus.size() > 1)
      out += " (" + std::to_string(gpus[i].second) + " trace" + (gpus[i].second == 1 ? "" : "s") + ")";
  }
  return out;
}

// Draws the table with tools/replay_plot.py where python3 has matplotlib;
// says in one line what it did.
void plot(const std::string& json, const std::string& file) {
  const std::string script = std::string(GVM_SOURCE_DIR) + "/tools/replay_plot.py";
  if (!std::ifstream(script).good()) {
    std::cout << "plot           none: " << script << " is not there\n";
    return;
  }
  char tmpl[] = "/tmp/gvm-replay-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) {
    std::cout << "plot           none: no temporary file (" << std::strerror(errno) << ")\n";
    return;
  }
  {
    std::ofstream out(tmpl);
    out << json;
  }
  ::close(fd);
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::cout << std::flush;
  const std::string cmd = "python3 " + quote(script) + " " + quote(tmpl) + " " + quote(file) +
                          " 2>/dev/null || echo 'plot           none: python3 could not run " +
                          "tools/replay_plot.py'";
  if (std::system(cmd.c_str()) == -1) std::cout << "plot           none: no shell to run python3\n";
  std::remove(tmpl);
}

int run_table(const Args& a) {
  if (!a.timeline.empty()) throw ArgError("--timeline needs one TRACE");
  const gvm::Config config = config_of(a);
  const std::vector<gvm::bench::ShippedTrace> shipped = gvm::bench::shipped_traces(GVM_SOURCE_DIR);
  DriverChoice choice = choose_driver(a);
  gvm::vmm::TestDriver& driver = *choice.driver;
  const bool simulated = std::string(driver.name()) == "sim";

  struct Row {
    const gvm::bench::ShippedTrace* t;
    Measurement m;
  };
  std::vector<Row> rows;
  for (const auto& t : shipped) {
    const Trace trace = gvm::bench::read_trace(t.path);
    rows.push_back(Row{&t, measure(trace, driver, config, a, false)});
  }

  std::ostringstream json;
  json.precision(6);
  json << "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    json << (i ? "," : "") << "{\"trace\":" << json_string(r.t->name)
         << ",\"events\":" << r.m.timed.events << ",\"peak_live_bytes\":" << r.m.memory.peak_live_bytes
         << ",\"peak_reserved_bytes\":" << r.m.memory.peak_reserved_bytes
         << ",\"ratio\":" << r.m.ratio() << ",\"driver_calls\":" << r.m.timed.driver_calls
         << ",\"ns_per_op\":" << median(r.m.ns_per_op) << ",\"driver\":" << json_string(driver.name())
         << ",\"device\":" << json_string(r.m.device_name) << ",\"peers\":{";
    bool first = true;
    for (const auto& [impl, p] : r.t->peers) {
      json << (first ? "" : ",") << json_string(impl) << ":{\"ratio\":" << p.ratio;
      if (p.ns_per_op) json << ",\"ns_per_op\":" << *p.ns_per_op;
      json << ",\"measured\":" << json_string(p.measured) << "}";
      first = false;
    }
    json << "}}";
  }
  json << "]\n";
  if (a.json) {
    std::cout << json.str() << std::flush;
    return 0;
  }

  std::ostringstream o;
  const std::string device = rows.empty() ? "" : rows.front().m.device_name;
  o << "gvmalloc on " << rows.size() << " shipped traces, " << choice.description << ", conf "
    << conf_changes(config) << "\n\n"
    << "Peak reserved / peak live (1.000 = the live bytes and nothing more; lower is better).\n"
    << "The peers' figures were recorded with gvm-replay-baseline on\n"
    << peer_gpus(shipped) << "\n(traces/peers.csv, traces/README.md); gvmalloc's are this run's.\n\n";
  // The first column as wide as the longest trace name, and two more.
  std::size_t w0 = std::string("trace").size();
  for (const Row& r : rows) w0 = std::max(w0, r.t->name.size());
  w0 += 2;
  const std::size_t w = 12;
  o << pad("trace", w0) << pad("gvmalloc", w - 2);
  for (const auto& c : gvm::bench::kPeerColumns) o << pad(c.label, w + 4);
  o << pad("best peer", w + 8) << "driver calls\n";
  for (const Row& r : rows) {
    double best = 0;
    for (const auto& [impl, p] : r.t->peers) best = best == 0 ? p.ratio : std::min(best, p.ratio);
    o << pad(r.t->name, w0) << pad(fixed(r.m.ratio(), 3), w - 2);
    for (const auto& c : gvm::bench::kPeerColumns) {
      auto it = r.t->peers.find(c.key);
      o << pad(it == r.t->peers.end() ? "-" : fixed(it->second.ratio, 3), w + 4);
    }
    const char* verdict = r.m.ratio() < best ? " (below)" : " (not below)";
    o << pad(fixed(best, 3) + verdict, w + 8) << r.m.timed.driver_calls << "\n";
  }
  o << "\nTime per allocate or free, median of " << a.repeat << " run(s):\n";
  if (simulated) {
    o << "(gvmalloc's figure is CPU time of the allocator on the simulated driver, not a GPU\n"
      << "figure; the peers' GPU times are not shown beside it. Run on a GPU for those.)\n";
    for (const Row& r : rows)
      o << pad(r.t->name, w0) << time_text(median(r.m.ns_per_op)) << " (simulated)\n";
  } else {
    o << pad("trace", w0) << pad("gvmalloc", w);
    for (const auto& c : gvm::bench::kPeerColumns) o << pad(c.label, w + 4);
    o << "\n";
    for (const Row& r : rows) {
      o << pad(r.t->name, w0) << pad(time_text(median(r.m.ns_per_op)), w);
      for (const auto& c : gvm::bench::kPeerColumns) {
        auto it = r.t->peers.find(c.key);
        const bool have = it != r.t->peers.end() && it->second.ns_per_op;
        o << pad(have ? time_text(*it->second.ns_per_op) : "not recorded", w + 4);
      }
      o << "\n";
    }
    o << "(peers' times recorded on " << peer_gpus(shipped) << ",\ntraces/peers.csv; "
      << "tools/bench-all.sh measures all of them side by side in one run)\n";
  }
  o << "\n";
  std::cout << o.str() << std::flush;
  if (a.plot != "none") plot(json.str(), a.plot);
  return 0;
}

int run(const Args& a) {
  if (!a.snapshot.empty() && !a.trace.empty())
    throw ArgError("give a TRACE or --snapshot, not both");
  return a.trace.empty() && a.snapshot.empty() ? run_table(a) : run_one(a);
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
    gvm::bench::print_arg_error("gvm-replay", e);
  } catch (const gvm::bench::TraceError& e) {
    std::cerr << "gvm-replay: bad trace: " << e.what() << "\n";
  } catch (const gvm::out_of_memory& e) {
    std::cerr << "gvm-replay: out of memory: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gvm-replay: " << e.what() << "\n";
  }
  return 1;
}
