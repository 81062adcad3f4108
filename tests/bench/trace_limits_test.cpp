// Peak reserved / peak live of every shipped trace on a simulated H200, against
// what the peers reserve on the same trace (traces/peers.csv, measured on one
// H200), and the driver work it takes; the synthetic traces of tests/bench/traces
// (tools/synth_traces.py) against bounds of their own. A trace test, not a
// timing: the simulated H200 makes the allocator's decisions exactly as the real
// one does (docs/replay.md), so these figures are the GPU's.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "replay.hpp"
#include "shipped_traces.hpp"
#include "trace.hpp"

namespace gvm::bench {
namespace {

struct Replayed {
  double ratio = 0;
  std::uint64_t driver_calls = 0;
  std::uint64_t chunks_mapped = 0;
  std::uint64_t fences = 0;
};

Replayed replay_on_sim_h200(const std::string& path) {
  const Trace trace = read_trace(path);
  auto sim = vmm::SimDriver::uniform(vmm::Profile::h200, 1);
  TraceStreams streams(*sim, 0, trace);
  Allocator allocator(*sim);
  ReplayOptions options;
  options.streams = &streams;
  options.sample_memory = true;
  const ReplayResult r = replay(trace, allocator, *sim, 0, options);
  const DeviceStats s = allocator.device_stats(0);
  std::string why;
  EXPECT_TRUE(allocator.check_invariants(&why)) << why;
  return Replayed{static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(r.peak_live_bytes),
                  r.driver_calls, s.chunks_mapped, s.fences};
}

// The lowest peer ratio of each trace in traces/peers.csv.
std::map<std::string, double> best_peers() {
  std::ifstream in(std::string(GVM_SOURCE_DIR) + "/traces/peers.csv");
  EXPECT_TRUE(in.good()) << "traces/peers.csv";
  std::map<std::string, double> best;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {
      header = false;
      continue;
    }
    std::istringstream f(line);
    std::string trace, impl, ratio;
    std::getline(f, trace, ',');
    std::getline(f, impl, ',');
    std::getline(f, ratio, ',');
    const double r = std::stod(ratio);
    auto it = best.find(trace);
    if (it == best.end() || r < it->second) best[trace] = r;
  }
  return best;
}

struct Limit {
  const char* trace;
  // Budgets of driver work in the replay: chunks mapped and fences, today's
  // figures with a little room. More of either costs time on the GPU (one
  // chunk ~0.14 ms to make, map and grant on an H200, docs/benchmarks.md).
  std::uint64_t max_chunks_mapped;
  std::uint64_t max_fences;
};

class ShippedTraceLimit : public ::testing::TestWithParam<Limit> {};

TEST_P(ShippedTraceLimit, ReservesLessThanTheBestPeerWithinItsDriverBudget) {
  const Limit& l = GetParam();
  const auto peers = best_peers();
  ASSERT_TRUE(peers.count(l.trace)) << l.trace << " missing in traces/peers.csv";
  const Replayed r = replay_on_sim_h200(std::string(GVM_SOURCE_DIR) + "/traces/" + l.trace + ".trace.gz");
  EXPECT_LT(r.ratio, peers.at(l.trace)) << "best peer " << peers.at(l.trace);
  EXPECT_LE(r.chunks_mapped, l.max_chunks_mapped);
  EXPECT_LE(r.fences, l.max_fences);
  RecordProperty("ratio", std::to_string(r.ratio));
  RecordProperty("driver_calls", std::to_string(r.driver_calls));
}

INSTANTIATE_TEST_SUITE_P(Sim, ShippedTraceLimit,
                         // 417 chunks before a block's shared last granule got
                         // a chunk of its own (handle_stash.hpp, plan_chunks)
                         ::testing::Values(Limit{"gpt2_train", 450, 30},
                                           // 445 and 142 with the idle-pool release
                                           // (growth_policy.hpp, kIdlePoolFactor)
                                           Limit{"bert_infer", 450, 145},
                                           Limit{"llama_generate", 80, 2},
                                           // Recorded after the policy, from workloads it
                                           // was not tuned on (bench/record_workloads.py).
                                           Limit{"efficientnet_side", 340, 4},
                                           Limit{"speech_ctc", 205, 4},
                                           // 15 fences before the shared last granule's chunk
                                           Limit{"t5_seq2seq", 550, 17},
                                           // 1.036, above cudaMallocAsync's 1.032, until the
                                           // shared last granule's chunk (docs/design-notes.md,
                                           // "Rule 7"): 1.0305, 1.0278 since rule 9; 199
                                           // chunks and 19 fences before rule 7
                                           Limit{"gpt2_checkpointed", 235, 27},
                                           Limit{"vit_train", 95, 2},
                                           // Recorded 2026-12-06, after rule 7, from more
                                           // workloads none of the rules was studied on (229,
                                           // 296, 599, 278 and 364 chunks; 2, 8, 19, 1, 11 fences).
                                           Limit{"convnext_train", 250, 3},
                                           Limit{"segmentation_train", 325, 9},
                                           Limit{"moe_train", 660, 21},
                                           Limit{"bert_accum", 305, 2},
                                           Limit{"whisper_train", 400, 12},
                                           // 1.0175 (3,210 MiB), above expandable segments'
                                           // 1.0124, until rule 8 (docs/design-notes.md):
                                           // classes of slots above span_max served best fit
                                           Limit{"resnet50_program", 160, 2}),
                         [](const ::testing::TestParamInfo<Limit>& i) { return std::string(i.param.trace); });

// ResNet-50: 1.0168 (1.0196 before rule 8), not below PyTorch with expandable
// segments (1.011). At its peak the excess is holes inside chunks that hold live
// data (docs/design-notes.md, "Fragmentation"); what would release them costs more
// driver calls than it may. This holds today's figure so that it only gets better.
TEST(ShippedTraceKnownGap, ResNetStaysAtItsMeasuredRatio) {
  const Replayed r = replay_on_sim_h200(std::string(GVM_SOURCE_DIR) + "/traces/resnet50_train.trace.gz");
  EXPECT_LE(r.ratio, 1.0170);
  EXPECT_LE(r.chunks_mapped, 200u);
  EXPECT_LE(r.fences, 6u);
}

struct Synthetic {
  const char* trace;
  double max_ratio;  // today's figure with a little room; the old policy's in the comment
  std::uint64_t max_fences;
};

class SyntheticTrace : public ::testing::TestWithParam<Synthetic> {};

TEST_P(SyntheticTrace, StaysWithinItsBounds) {
  const Synthetic& s = GetParam();
  const Replayed r =
      replay_on_sim_h200(std::string(GVM_SOURCE_DIR) + "/tests/bench/traces/" + s.trace + ".trace.gz");
  EXPECT_LE(r.ratio, s.max_ratio);
  EXPECT_LE(r.fences, s.max_fences);
}

INSTANTIATE_TEST_SUITE_P(
    Sim, SyntheticTrace,
    ::testing::Values(Synthetic{"side_stream", 1.13, 45},       // without the policy: 1.435
                      Synthetic{"checkpoint_train", 1.012, 8},  // 1.015 (1.0132 before the idle
                                                                // pool lifted the slack bound)
                      Synthetic{"kv_growth", 1.07, 12},         // 1.063
                      // 1.194 until rule 9 (a close mapped fit before a growth), 1.182
                      // until rule 10 (a mapped fit before a growth that sets a peak), 1.171
                      Synthetic{"mixed", 1.18, 42},             // random churn, fences guard
                                                                // (40 with the idle-pool release, 12 before)
                      Synthetic{"streams4", 1.50, 40}),         // 3.309: four streams' churn
    [](const ::testing::TestParamInfo<Synthetic>& i) { return std::string(i.param.trace); });

TEST(PeersCsv, TheShippedFileListsEveryTraceWithThreePeers) {
  const auto traces = shipped_traces(GVM_SOURCE_DIR);
  // The four of the fragmentation study, the five workloads recorded after
  // it, the five recorded after rule 7 and the ResNet-50 program (traces/README.md).
  ASSERT_EQ(traces.size(), 15u);
  for (const ShippedTrace& t : traces) {
    EXPECT_TRUE(std::ifstream(t.path).good()) << t.path;
    for (const PeerColumn& c : kPeerColumns) EXPECT_TRUE(t.peers.count(c.key)) << t.name << " " << c.key;
  }
}

TEST(PeersCsv, BadLinesAreNamed) {
  const std::string header = "trace,allocator,ratio,ns_per_op,measured\n";
  auto error_of = [](const std::string& text) -> std::string {
    try {
      parse_peers_csv(text, "p.csv", "traces");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("trace,ratio\n").find("p.csv:1: expected the header"), std::string::npos);
  EXPECT_NE(error_of(header + "gpt2,torch,x,,now\n").find("p.csv:2: expected a positive number, got 'x'"),
            std::string::npos);
  EXPECT_NE(error_of(header + "# only a comment\n").find("p.csv: no traces listed"), std::string::npos);
  EXPECT_NE(error_of("# c\n" + header + "gpt2\n").find("p.csv:3: expected trace,allocator"),
            std::string::npos);
  const auto ok = parse_peers_csv(header + "a,torch,1.5,,x\na,cudaMallocAsync,1.25,900,y\n", "p.csv", "d");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].path, "d/a.trace.gz");
  EXPECT_FALSE(ok[0].peers.at("torch").ns_per_op.has_value());
  EXPECT_EQ(*ok[0].peers.at("cudaMallocAsync").ns_per_op, 900.0);
}

}  // namespace
}  // namespace gvm::bench
