// The replay core and gvm-replay, on the simulated driver.
#include "replay.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/json_check.hpp"
#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "trace.hpp"

namespace gvm::bench {
namespace {

using vmm::Profile;
using vmm::SimDriver;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

std::string shipped_trace() {
  return std::string(GVM_SOURCE_DIR) + "/traces/gpt2_train.trace.gz";
}

// Two streams, sizes from 512 B to 96 MiB, a block freed on another stream
// than the one it came from, an id reused, two blocks left live.
std::string synthetic_text() {
  std::ostringstream t;
  t << "a 1 512 0\n"
    << "a 2 " << 3 * kMiB << " 0\n"
    << "a 3 " << 96 * kMiB << " 5\n"
    << "f 1 0\n"
    << "a 4 4096 5\n"
    << "f 3 0\n"  // freed on stream 0, allocated on 5
    << "a 1 " << 40 * kMiB << " 0\n"
    << "f 2 0\n"
    << "a 5 1000 0\n"
    << "f 4 5\n";
  return t.str();
}

// Live bytes after each event of `trace`, recomputed from its events.
std::vector<std::uint64_t> live_after_each(const Trace& trace) {
  std::vector<std::uint64_t> live;
  std::uint64_t now = 0;
  for (const TraceEvent& e : trace.events) {
    now = e.op == TraceOp::allocate ? now + e.bytes : now - e.bytes;
    live.push_back(now);
  }
  return live;
}

class ReplayTest : public ::testing::Test {
 protected:
  std::unique_ptr<SimDriver> driver_ = SimDriver::uniform(Profile::h200, 1);
};

TEST_F(ReplayTest, SyntheticTraceTimedPass) {
  const Trace trace = parse_trace(synthetic_text(), "synthetic");
  ASSERT_EQ(trace.stream_count(), 2u);
  TraceStreams streams(*driver_, 0, trace);
  Allocator allocator(*driver_);
  ReplayOptions options;
  options.streams = &streams;
  const ReplayResult r = replay(trace, allocator, *driver_, 0, options);

  EXPECT_EQ(r.events, trace.events.size());
  EXPECT_EQ(r.allocations, 6u);
  EXPECT_EQ(r.frees, 4u);
  EXPECT_EQ(r.peak_live_bytes, trace.peak_live_bytes);
  EXPECT_EQ(r.peak_reserved_bytes, 0u) << "a timed pass samples nothing";
  EXPECT_GE(r.allocator_peak_reserved_bytes, r.peak_live_bytes);
  EXPECT_GT(r.driver_calls, 0u) << "the first allocation must map memory";
  EXPECT_GT(r.ns_per_op(), 0.0);
  // The leftovers were freed: nothing live, and the allocator is consistent.
  EXPECT_EQ(allocator.device_stats(0).live_bytes, 0u);
  std::string why;
  EXPECT_TRUE(allocator.check_invariants(&why)) << why;
}

TEST_F(ReplayTest, SyntheticTraceMemoryPassAndTimeline) {
  const Trace trace = parse_trace(synthetic_text(), "synthetic");
  TraceStreams streams(*driver_, 0, trace);
  Allocator allocator(*driver_);
  std::vector<TimelinePoint> timeline;
  ReplayOptions options;
  options.streams = &streams;
  options.sample_memory = true;
  options.timeline = &timeline;
  options.timeline_every = 1;
  const ReplayResult r = replay(trace, allocator, *driver_, 0, options);

  EXPECT_EQ(r.peak_live_bytes, trace.peak_live_bytes);
  EXPECT_GE(r.peak_reserved_bytes, r.peak_live_bytes);
  EXPECT_GE(r.allocator_peak_reserved_bytes, r.peak_reserved_bytes);

  const std::vector<std::uint64_t> live = live_after_each(trace);
  ASSERT_EQ(timeline.size(), trace.events.size());
  std::uint64_t max_reserved = 0;
  for (std::size_t i = 0; i < timeline.size(); ++i) {
    EXPECT_EQ(timeline[i].event, i + 1);
    EXPECT_EQ(timeline[i].live_bytes, live[i]) << "event " << i + 1;
    EXPECT_GE(timeline[i].reserved_bytes, timeline[i].live_bytes) << "event " << i + 1;
    max_reserved = std::max(max_reserved, timeline[i].reserved_bytes);
  }
  EXPECT_EQ(max_reserved, r.peak_reserved_bytes);
}

TEST_F(ReplayTest, TimelineKeepsEveryNthAndTheLast) {
  const Trace trace = parse_trace(synthetic_text(), "synthetic");  // 10 events
  TraceStreams streams(*driver_, 0, trace);
  Allocator allocator(*driver_);
  std::vector<TimelinePoint> timeline;
  ReplayOptions options;
  options.streams = &streams;
  options.sample_memory = true;
  options.timeline = &timeline;
  options.timeline_every = 4;
  replay(trace, allocator, *driver_, 0, options);
  ASSERT_EQ(timeline.size(), 3u);
  EXPECT_EQ(timeline[0].event, 4u);
  EXPECT_EQ(timeline[1].event, 8u);
  EXPECT_EQ(timeline[2].event, 10u);
}

TEST_F(ReplayTest, StreamsAreCreatedAndDestroyed) {
  const Trace trace = parse_trace("a 1 10 3\na 2 10 9\nf 1 9\nf 2 3\n", "three streams");
  ASSERT_EQ(trace.stream_count(), 3u);  // 0 (unused), 3, 9
  {
    TraceStreams streams(*driver_, 0, trace);
    ASSERT_EQ(streams.size(), 3u);
    EXPECT_EQ(streams[0], nullptr);
    EXPECT_NE(streams[1], nullptr);
    EXPECT_NE(streams[2], streams[1]);
    EXPECT_EQ(driver_->live_streams(), 2u);
  }
  EXPECT_EQ(driver_->live_streams(), 0u);
}

TEST_F(ReplayTest, AStreamThatCannotBeMadeIsAnErrorAndLeaksNothing) {
  const Trace trace = parse_trace("a 1 10 3\na 2 10 9\n", "two streams");
  driver_->fail_call(vmm::Call::stream_create, 2, vmm::Result::out_of_memory);
  try {
    TraceStreams streams(*driver_, 0, trace);
    FAIL() << "no error";
  } catch (const vmm::DriverError& e) {
    EXPECT_EQ(e.result(), vmm::Result::out_of_memory);
    EXPECT_NE(std::string(e.what()).find("trace stream 9"), std::string::npos) << e.what();
  }
  EXPECT_EQ(driver_->live_streams(), 0u);
}

TEST_F(ReplayTest, OtherStreamsNeedTraceStreams) {
  const Trace trace = parse_trace("a 1 10 2\nf 1 2\n", "t");
  Allocator allocator(*driver_);
  EXPECT_THROW(replay(trace, allocator, *driver_, 0), std::invalid_argument);
  // Stream 0 alone needs none.
  const Trace only0 = parse_trace("a 1 10 0\nf 1 0\n", "t0");
  EXPECT_EQ(replay(only0, allocator, *driver_, 0).events, 2u);
}

TEST_F(ReplayTest, OutOfMemoryNamesTheEventAndFreesWhatItHeld) {
  driver_->set_physical_budget(0, 64 * kMiB);
  std::ostringstream text;
  text << "a 7 " << 8 * kMiB << " 0\n"
       << "a 8 " << 40 * kMiB << " 0\n"
       << "a 9 " << 40 * kMiB << " 0\n";
  const Trace trace = parse_trace(text.str(), "oom");
  Allocator allocator(*driver_);
  try {
    replay(trace, allocator, *driver_, 0);
    FAIL() << "64 MiB cannot hold 88 MiB";
  } catch (const out_of_memory& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("event 3 of oom (allocate id 9, 41943040 bytes, stream 0): ", 0), 0u)
        << msg;
  }
  EXPECT_EQ(allocator.device_stats(0).live_bytes, 0u);
  std::string why;
  EXPECT_TRUE(allocator.check_invariants(&why)) << why;
}

// The shipped trace: every event replays and the replay's peak of live bytes
// is the reader's (19,089,979,616 per traces/README.md).
TEST_F(ReplayTest, ShippedTrace) {
  const Trace trace = read_trace(shipped_trace());
  TraceStreams streams(*driver_, 0, trace);
  Allocator allocator(*driver_);
  ReplayOptions options;
  options.streams = &streams;
  options.sample_memory = true;
  const ReplayResult r = replay(trace, allocator, *driver_, 0, options);
  EXPECT_EQ(r.events, 114839u);
  EXPECT_EQ(r.allocations, 57421u);
  EXPECT_EQ(r.frees, 57418u);
  EXPECT_EQ(r.peak_live_bytes, trace.peak_live_bytes);
  EXPECT_EQ(r.peak_live_bytes, 19089979616u);
  EXPECT_GE(r.peak_reserved_bytes, r.peak_live_bytes);
  EXPECT_GE(r.allocator_peak_reserved_bytes, r.peak_reserved_bytes);
  std::string why;
  EXPECT_TRUE(allocator.check_invariants(&why)) << why;
}

// --- the gvm-replay binary -----------------------------------------------------

struct ToolRun {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "gvm_replay_" + info->name() + "_" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ToolRun run_replay(const std::string& args) {
  const std::string err_path = temp_path("stderr");
  const std::string cmd = std::string("'") + GVM_REPLAY_EXE + "' " + args + " 2>'" + err_path + "'";
  ToolRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slurp(err_path);
  std::remove(err_path.c_str());
  return r;
}

TEST(ReplayTool, JsonHasTheKeysAndTheFigures) {
  const std::string trace_path = temp_path("synthetic.trace");
  std::ofstream(trace_path) << synthetic_text();
  const std::string csv = temp_path("timeline.csv");
  const ToolRun r = run_replay("--driver sim --json --repeat 3 --timeline " + csv +
                               " --timeline-every 3 '" + trace_path + "'");
  ASSERT_EQ(r.status, 0) << r.err;

  test::Json json;
  std::string why;
  ASSERT_TRUE(test::JsonReader::parse(r.out, &json, &why)) << why << "\n" << r.out;
  ASSERT_EQ(json.kind, test::Json::Kind::object);
  for (const char* key :
       {"events", "allocations", "frees", "peak_live_bytes", "peak_reserved_bytes",
        "allocator_peak_reserved_bytes", "ratio", "driver_calls", "ns_per_op", "ns_per_op_runs",
        "repeat", "driver", "device", "conf", "trace"}) {
    EXPECT_NE(json.find(key), nullptr) << "missing key " << key << " in " << r.out;
  }
  const Trace trace = parse_trace(synthetic_text(), "synthetic");
  ASSERT_NE(json.find("events"), nullptr);
  EXPECT_EQ(json.find("events")->as_u64(), trace.events.size());
  EXPECT_EQ(json.find("peak_live_bytes")->as_u64(), trace.peak_live_bytes);
  EXPECT_GE(json.find("peak_reserved_bytes")->as_u64(), trace.peak_live_bytes);
  EXPECT_EQ(json.find("driver")->text, "sim");
  EXPECT_EQ(json.find("device")->text, vmm::profile(Profile::h200).name);
  EXPECT_EQ(json.find("ns_per_op_runs")->items.size(), 3u);
  EXPECT_GE(std::stod(json.find("ratio")->text), 1.0);

  // Timeline: a comment, the header, events 3, 6, 9 and the last (10).
  std::istringstream lines(slurp(csv));
  std::string line;
  std::vector<std::string> rows;
  while (std::getline(lines, line)) rows.push_back(line);
  ASSERT_EQ(rows.size(), 6u) << slurp(csv);
  EXPECT_EQ(rows[0].rfind("# gvm-replay timeline", 0), 0u);
  EXPECT_EQ(rows[1], "event,live_bytes,reserved_bytes");
  const std::vector<std::uint64_t> live = live_after_each(trace);
  EXPECT_EQ(rows[2].rfind("3," + std::to_string(live[2]) + ",", 0), 0u) << rows[2];
  EXPECT_EQ(rows[5].rfind("10," + std::to_string(live[9]) + ",", 0), 0u) << rows[5];
  std::remove(trace_path.c_str());
  std::remove(csv.c_str());
}

TEST(ReplayTool, TextReportOnOneTrace) {
  const ToolRun r = run_replay("--driver sim --profile h200 '" + shipped_trace() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("gpt2_train.trace.gz"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("events         114839 (57421 allocations, 57418 frees)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("peak live      19089979616 bytes"), std::string::npos) << r.out;
  for (const char* label : {"peak reserved", "ratio", "driver calls", "ns per op", "device"}) {
    EXPECT_NE(r.out.find(label), std::string::npos) << label << " missing in\n" << r.out;
  }
  EXPECT_NE(r.out.find("conf           defaults\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CPU time on the simulated driver, not a GPU figure"), std::string::npos)
      << r.out;
  const ToolRun c = run_replay("--driver sim --conf reserve_slack:0.05 '" + shipped_trace() + "'");
  EXPECT_NE(c.out.find("conf           reserve_slack:0.05\n"), std::string::npos) << c.out;
}

// The main job: no trace, every shipped trace in one table beside the peers.
TEST(ReplayTool, WithoutATraceTheTableCoversEveryShippedTrace) {
  const ToolRun r = run_replay("--driver sim --plot none");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* t : {"gpt2_train", "resnet50_train", "bert_infer", "llama_generate", "vit_train",
                        "efficientnet_side", "gpt2_checkpointed", "speech_ctc", "t5_seq2seq",
                        "convnext_train", "segmentation_train", "moe_train", "bert_accum",
                        "whisper_train"})
    EXPECT_NE(r.out.find(std::string("\n") + t + " "), std::string::npos) << t << "\n" << r.out;
  for (const char* label : {"PyTorch", "expandable", "cudaMallocAsync", "best peer", "driver calls",
                            "1.948", "1.218", "1.004", "(simulated)", "not a GPU"})
    EXPECT_NE(r.out.find(label), std::string::npos) << label << " missing in\n" << r.out;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    EXPECT_LE(line.size(), 110u) << "a line too long to read: " << line;
  EXPECT_EQ(r.out.find("plot "), std::string::npos) << "--plot none draws nothing";
}

TEST(ReplayTool, WithoutATraceJsonIsOneObjectPerTrace) {
  const ToolRun r = run_replay("--driver sim --json");
  ASSERT_EQ(r.status, 0) << r.err;
  test::Json json;
  std::string why;
  ASSERT_TRUE(test::JsonReader::parse(r.out, &json, &why)) << why << "\n" << r.out;
  ASSERT_EQ(json.kind, test::Json::Kind::array);
  ASSERT_EQ(json.items.size(), 15u);  // every trace of traces/peers.csv
  for (const test::Json& t : json.items) {
    for (const char* key : {"trace", "ratio", "driver_calls", "ns_per_op", "peers", "peak_live_bytes"})
      EXPECT_NE(t.find(key), nullptr) << key;
    ASSERT_NE(t.find("peers"), nullptr);
    EXPECT_NE(t.find("peers")->find("torch_expandable"), nullptr);
  }
}

// --snapshot: a PyTorch memory snapshot (the one PyTorch 2.11 wrote on an H200,
// tests/python/data) converted by tools/snapshot_to_trace.py and replayed, beside
// what PyTorch reserved in the same run.
TEST(ReplayTool, SnapshotIsReplayedBesideWhatPyTorchReserved) {
  if (std::system("python3 -c 1 >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found (the converter is Python)";
  const std::string snap = std::string(GVM_SOURCE_DIR) + "/tests/python/data/small_snapshot.pickle";
  const ToolRun r = run_replay("--driver sim --snapshot '" + snap + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("events         221 (115 allocations, 106 frees)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak live      75845720 bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PyTorch        peak reserved 115343360 bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expandable_segments off"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("saving         gvmalloc reserves "), std::string::npos) << r.out;
  const ToolRun j = run_replay("--driver sim --json --snapshot '" + snap + "'");
  ASSERT_EQ(j.status, 0) << j.err;
  test::Json json;
  std::string why;
  ASSERT_TRUE(test::JsonReader::parse(j.out, &json, &why)) << why << "\n" << j.out;
  ASSERT_NE(json.find("pytorch_peak_reserved_bytes"), nullptr);
  EXPECT_EQ(json.find("pytorch_peak_reserved_bytes")->as_u64(), 115343360u);
}

// A snapshot of a run under gvmalloc's own backend: its reserved bytes are
// gvmalloc's, so the report names the recorded run, not PyTorch's allocator.
TEST(ReplayTool, SnapshotOfAGvmallocRunIsNotCalledPyTorchs) {
  if (std::system("python3 -c 1 >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found (the converter is Python)";
  const std::string src = std::string(GVM_SOURCE_DIR) + "/tests/python/data/small_snapshot.pickle";
  const std::string snap = temp_path("gvm.pickle");
  // The settings gvmalloc's backend reports (integrations/torch/src/memory_layout.cpp).
  const std::string make =
      "python3 -c \"import pickle,sys; s=pickle.load(open(sys.argv[1],'rb')); "
      "s['allocator_settings'].update(expandable_segments=True, "
      "PYTORCH_CUDA_ALLOC_CONF='gvmalloc GVM_CONF: reserve_slack:0.02'); "
      "pickle.dump(s, open(sys.argv[2],'wb'))\" '" + src + "' '" + snap + "'";
  ASSERT_EQ(std::system(make.c_str()), 0);
  const ToolRun r = run_replay("--driver sim --snapshot '" + snap + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("recorded       peak reserved 115343360 bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(gvmalloc's PyTorch backend (GVM_CONF: reserve_slack:0.02))"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("PyTorch        "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("PyTorch's caching allocator"), std::string::npos) << r.out;
  std::remove(snap.c_str());
}

TEST(ReplayTool, SnapshotsThatCannotBeUsedSayWhy) {
  if (std::system("python3 -c 1 >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found (the converter is Python)";
  const std::string junk = temp_path("junk.pickle");
  std::ofstream(junk) << "junk";
  ToolRun r = run_replay("--driver sim --snapshot '" + junk + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("not a PyTorch memory snapshot"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = run_replay("--driver sim --snapshot /nonexistent/x.pickle");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("cannot open /nonexistent/x.pickle"), std::string::npos) << r.err;
  r = run_replay("--driver sim --snapshot x.pickle x.trace");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("give a TRACE or --snapshot, not both"), std::string::npos) << r.err;
  std::remove(junk.c_str());
}

// --driver auto takes the real driver when one loads; otherwise it says so on
// stderr and replays on the simulated H200.
TEST(ReplayTool, AutoSaysWhichDriver) {
  const std::string trace_path = temp_path("small.trace");
  std::ofstream(trace_path) << "a 1 4096 0\nf 1 0\n";
  const ToolRun r = run_replay("--json '" + trace_path + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  test::Json json;
  std::string why;
  ASSERT_TRUE(test::JsonReader::parse(r.out, &json, &why)) << why << "\n" << r.out;
  ASSERT_NE(json.find("driver"), nullptr);
  const std::string driver = json.find("driver")->text;
  if (driver == "sim") {
    EXPECT_NE(r.err.find("replaying on a simulated GPU instead"), std::string::npos) << r.err;
    EXPECT_EQ(json.find("device")->text, vmm::profile(Profile::h200).name);
  } else {
    EXPECT_EQ(driver, "cuda");
    EXPECT_EQ(r.err.find("simulated"), std::string::npos) << r.err;
  }
  std::remove(trace_path.c_str());
}

struct BadRun {
  std::string args;
  const char* message;  // must appear on stderr
};

TEST(ReplayTool, BadInputExitsOneWithAMessage) {
  const std::string bad_trace = temp_path("bad.trace");
  std::ofstream(bad_trace) << "a 1 10 0\nf 2 0\n";
  const std::string bad = "'" + bad_trace + "'";
  const BadRun cases[] = {
      {"--driver gpu", "--driver wants cuda, sim or auto, got 'gpu'"},
      {"--repeat 0", "--repeat wants an integer from 1 to 1000000, got '0'"},
      {"--devices x", "--devices wants an integer from 1 to 64, got 'x'"},
      {"--bogus", "unknown option '--bogus'"},
      {"--conf", "--conf needs a value"},
      {"--json=yes", "--json takes no value"},
      {"a.trace b.trace", "more than one trace given"},
      {"--driver sim --profile z80", "--profile: "},
      {"--driver sim --conf nonsense_key:1", "--conf: "},
      {"--driver sim /nonexistent/x.trace", "cannot open: No such file or directory"},
      {"--driver sim " + bad, "bad trace: "},
      {"--driver sim --timeline x.csv", "--timeline needs one TRACE"},
      {"--driver sim --timeline /nonexistent/t.csv " + bad,
       "--timeline '/nonexistent/t.csv': cannot write: No such file or directory"},
      {"--plot=", "--plot needs a file name or none"},
  };
  for (const BadRun& c : cases) {
    SCOPED_TRACE(c.args);
    const ToolRun r = run_replay(c.args);
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  // One line, not the usage text: the message and where the options are.
  {
    const ToolRun r = run_replay("--bogus");
    EXPECT_EQ(r.err, "gvm-replay: unknown option '--bogus' (gvm-replay --help lists the options)\n");
  }
  // GVM_CONF's error names it once.
  {
    const std::string cmd = std::string("GVM_CONF=nonsense_key:1 '") + GVM_REPLAY_EXE +
                            "' --driver sim 2>&1 >/dev/null";
    std::string err;
    if (FILE* f = popen(cmd.c_str(), "r")) {
      char buf[512];
      while (std::fgets(buf, sizeof buf, f) != nullptr) err += buf;
      (void)pclose(f);
    }
    EXPECT_NE(err.find("GVM_CONF: "), std::string::npos) << err;
    EXPECT_EQ(err.find("GVM_CONF: GVM_CONF"), std::string::npos) << err;
  }
  // The line of the bad trace is named.
  const ToolRun r = run_replay("--driver sim " + bad);
  EXPECT_NE(r.err.find(bad_trace + ":2: free of unknown id 2"), std::string::npos) << r.err;
  std::remove(bad_trace.c_str());
}

TEST(ReplayTool, OutOfMemoryIsReportedClearly) {
  const std::string trace_path = temp_path("big.trace");
  std::ofstream(trace_path) << "a 1 " << (std::uint64_t{1} << 30) << " 0\n";
  const ToolRun r = run_replay("--driver sim --conf max_reserved:512MiB '" + trace_path + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("gvm-replay: out of memory: event 1 of "), std::string::npos) << r.err;
  std::remove(trace_path.c_str());
}

}  // namespace
}  // namespace gvm::bench
