// SimDriver's hazard model: pending accesses, their completion, and races
// between streams (vector clocks).
//
// Each stream numbers its operations 1, 2, 3, ... (seq). Its clock maps every
// stream it is ordered behind to the last seq of that stream it waited for
// (its own entry is its latest seq). An event record snapshots the clock; a
// stream_wait_event merges the snapshot into the waiting stream's clock, which
// makes the order transitive. An access at seq n of stream S is ordered before
// work on T exactly when clock(T)[S] >= n.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>

#include "sim_state.hpp"

namespace gvm::vmm {
namespace {

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

const char* kind_name(AccessKind k) noexcept {
  return k == AccessKind::write ? "write" : "read";
}

}  // namespace

std::string SimDriver::State::describe_stream(std::uint64_t id) const {
  auto it = streams.find(id);
  if (it == streams.end()) return "a finished stream";
  const sim::Stream& s = it->second;
  if (s.legacy) return "the legacy stream of device " + std::to_string(s.device);
  return "stream " + hex(reinterpret_cast<std::uintptr_t>(s.handle)) + " of device " +
         std::to_string(s.device);
}

void SimDriver::State::enqueue(sim::Stream& s, const std::vector<Touch>& touches,
                               const char* what) {
  const std::uint64_t seq = ++s.seq;
  s.clock[s.id] = seq;
  const std::uint64_t id = next_access++;
  std::vector<std::uint64_t> reported;  // one report per pair of operations
  for (const Touch& t : touches) {
    for (const auto& [other_id, other] : streams) {
      if (other_id == s.id) continue;  // stream order: never a race
      auto w = s.clock.find(other_id);
      const std::uint64_t waited = w == s.clock.end() ? 0 : w->second;
      for (const sim::Pending& p : other.pending) {
        if (p.seq <= waited) continue;
        if (p.hi <= t.seg.lo || t.seg.hi <= p.lo) continue;
        if (p.kind == AccessKind::read && t.kind == AccessKind::read) continue;
        if (std::find(reported.begin(), reported.end(), p.id) != reported.end()) continue;
        reported.push_back(p.id);
        ++race_total;
        if (races.size() < sim::kMaxRaceReports) {
          races.push_back(std::string("race: ") + kind_name(t.kind) + " of [" + hex(t.seg.lo) +
                          ", " + hex(t.seg.hi) + ") by device " + std::to_string(t.seg.accessor) +
                          " (" + what + " on " + describe_stream(s.id) +
                          ") is not ordered after the pending " + kind_name(p.kind) + " of [" +
                          hex(p.lo) + ", " + hex(p.hi) + ") by device " +
                          std::to_string(p.accessor) + " (" + p.what + " on " +
                          describe_stream(other_id) + "): no event orders them");
        }
      }
    }
  }
  for (const Touch& t : touches) {
    if (t.seg.hi <= t.seg.lo) continue;
    s.pending.push_back({id, seq, t.seg.accessor, t.seg.owner, t.seg.lo, t.seg.hi, t.kind, what});
  }
}

void SimDriver::State::complete(const sim::VectorClock& upto) {
  for (const auto& [id, seq] : upto) {
    auto it = streams.find(id);
    if (it == streams.end()) continue;
    auto& q = it->second.pending;
    while (!q.empty() && q.front().seq <= seq) q.pop_front();
  }
  prune_streams();
}

bool SimDriver::State::is_complete(const sim::VectorClock& upto) const {
  for (const auto& [id, seq] : upto) {
    auto it = streams.find(id);
    if (it == streams.end()) continue;
    const auto& q = it->second.pending;
    if (!q.empty() && q.front().seq <= seq) return false;
  }
  return true;
}

void SimDriver::State::complete_device(int device) {
  std::vector<sim::VectorClock> clocks;
  for (const auto& [id, s] : streams) {
    if (s.device == device) clocks.push_back(s.clock);
  }
  for (const auto& c : clocks) complete(c);
}

void SimDriver::State::prune_streams() {
  for (auto it = streams.begin(); it != streams.end();) {
    it = it->second.destroyed && it->second.pending.empty() ? streams.erase(it) : std::next(it);
  }
}

bool SimDriver::State::any_pending(DevicePtr lo, DevicePtr hi, int accessor) const {
  for (const auto& [id, s] : streams) {
    for (const sim::Pending& p : s.pending) {
      if ((accessor < 0 || p.accessor == accessor) && p.lo < hi && lo < p.hi) return true;
    }
  }
  return false;
}

}  // namespace gvm::vmm
