#include "engine_scenario.hpp"

#include <array>
#include <exception>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "gvm/allocator.hpp"

namespace gvm::test {
namespace {

using vmm::Access;
using vmm::DevicePtr;
using vmm::Result;
using vmm::StreamHandle;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Counter slots of one iteration on one device.
enum Slot : int {
  kCopyIn,     // a block filled by a direct peer copy (small) from the other's scratch
  kControl,    // the same block against a wrong value: must count every word
  kPeerRead,   // a peer kernel reading the other device's scratch
  kPeerWrite,  // the owner reading what the peer's kernel wrote into its scratch
  kStaged,     // a block filled by a staged copy (large) out of the other's scratch
  kRegrowth,   // a freshly regrown scratch block, filled and checked by its owner
  kSlots
};
const char* slot_name(int s) {
  static const char* const names[] = {"direct copy in", "control",        "peer read",
                                      "peer write",     "staged copy in", "regrowth"};
  return s >= 0 && s < kSlots ? names[s] : "?";
}

class Failed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void must(Result r, const std::string& what) {
  if (r != Result::success) throw Failed(what + ": " + vmm::result_name(r));
}

// A value per iteration and purpose, never one a neighbour uses.
std::uint32_t value_for(int iteration, std::uint32_t salt) {
  std::uint32_t x = static_cast<std::uint32_t>(iteration + 1) * 0x9e3779b9u ^ salt;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  return x;
}

DevicePtr dp(const void* p) {
  return reinterpret_cast<DevicePtr>(p);
}

class Engine {
 public:
  Engine(vmm::TestDriver& d, DeviceKernels& k, const EngineOptions& o, EngineReport& r)
      : d_(d), k_(k), o_(o), rep_(r) {}
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const std::string& where() const { return where_; }

  void setup() {
    where_ = "setup: ";
    if (o_.iterations < 1) throw Failed("iterations must be at least 1");
    if (o_.unit_bytes < kMiB || o_.unit_bytes % (kMiB / 2) != 0)
      throw Failed("unit_bytes must be a multiple of 512 KiB, at least 1 MiB");
    a_ = std::make_unique<Allocator>(d_, o_.config);
    if (a_->device_count() < 2) throw Failed("needs 2 devices");
    if (a_->peer_policy(0, 1) == PeerPolicy::none || a_->peer_policy(1, 0) == PeerPolicy::none)
      throw Failed("devices 0 and 1 have no P2P path");
    for (int dev = 0; dev < 2; ++dev) {
      must(d_.stream_create(dev, &s_[dev]), "stream_create(device " + std::to_string(dev) + ")");
      must(d_.event_create(dev, &ev_[dev]), "event_create(device " + std::to_string(dev) + ")");
      const std::size_t bytes = counter_bytes();
      must(d_.mem_alloc(dev, bytes, &counters_[dev]), "mem_alloc(counters)");
      must(d_.memset_d8_async(dev, counters_[dev], 0, bytes, s_[dev]), "memset(counters)");
      must(d_.mem_alloc(dev, 4, &sink_[dev]), "mem_alloc(sink)");
    }
    switch_to(o_.small_policy);
    // One scratch block per device lives through the whole run: the peer's
    // spin_read runs over it at every switch, and its access is checked.
    for (int dev = 0; dev < 2; ++dev) {
      persistent_[dev] = a_->scratch_allocate(o_.unit_bytes, dev, s_[dev]);
      must(k_.fill(dev, s_[dev], dp(persistent_[dev]), value_for(-1, 0x77u + dev),
                   words(o_.unit_bytes)),
           "fill(persistent scratch)");
    }
    for (int dev = 0; dev < 2; ++dev)
      must(d_.stream_synchronize(dev, s_[dev]), "stream_synchronize after setup");
    for (int dev = 0; dev < 2; ++dev) {
      must(k_.calibrate_spin(dev, s_[dev], dp(persistent_[other(dev)]), words(o_.unit_bytes),
                             o_.spin_seconds, &spin_iterations_[dev]),
           "calibrate_spin(device " + std::to_string(dev) + " over the peer's scratch)");
    }
  }

  void small_batch(int it) {
    where_ = "iteration " + std::to_string(it) + ", small batch: ";
    if (it > 0 && (pending(0) || pending(1))) ++rep_.pending_at_grant;
    switch_to(o_.small_policy);
    for (int dev = 0; dev < 2; ++dev)
      expect_access(persistent_[dev], other(dev), Access::read_write, scratch_name(dev));

    const std::size_t sb =
        o_.unit_bytes * (1 + it % 3) + static_cast<std::size_t>(it % 4) * kMiB / 2;
    const std::size_t h = sb / 2;
    const std::size_t nh = words(h);
    std::array<void*, 2> s{}, b{};
    for (int dev = 0; dev < 2; ++dev) {
      s[dev] = a_->scratch_allocate(sb, dev, s_[dev]);
      b[dev] = a_->allocate(sb, dev, s_[dev]);
      if (!a_->is_peer_copy_direct(s[dev], dev, other(dev)))
        throw Failed("peer_copy out of device " + std::to_string(dev) +
                     "'s scratch would be staged under " + to_string(o_.small_policy));
      expect_access(s[dev], other(dev), Access::read_write, scratch_name(dev));
      expect_access(b[dev], other(dev), Access::none,
                    "device " + std::to_string(dev) + "'s ordinary block");
    }
    const std::uint32_t v = value_for(it, 0x11), va = value_for(it, 0x22), vb = value_for(it, 0x33);

    // Device 0 fills the first half of its scratch; device 1 pulls it (a
    // direct copy), reads it in place (a peer kernel) and writes the second
    // half (a peer kernel), fills its own scratch and leaves a peer
    // spin_read running over device 0's persistent block.
    must(k_.fill(0, s_[0], dp(s[0]), v, nh), "fill(scratch 0)");
    order(0, 1);
    a_->peer_copy(b[1], 1, s[0], 0, h, s_[1]);
    must(k_.check(1, s_[1], dp(b[1]), v, nh, slot(1, it, kCopyIn)), "check(copy on device 1)");
    must(k_.check(1, s_[1], dp(b[1]), v + 1, nh, slot(1, it, kControl)), "check(control)");
    must(k_.check(1, s_[1], dp(s[0]), v, nh, slot(1, it, kPeerRead)), "check(peer read)");
    must(k_.fill(1, s_[1], dp(s[0]) + h, va, nh), "fill(peer write into scratch 0)");
    must(k_.fill(1, s_[1], dp(s[1]), vb, 2 * nh), "fill(scratch 1)");
    must(k_.spin_read(1, s_[1], dp(persistent_[0]), words(o_.unit_bytes), spin_iterations_[1],
                      sink_[1]),
         "spin_read(device 1 over device 0's scratch)");
    a_->record_stream(s[0], s_[1], 1);
    a_->record_stream(persistent_[0], s_[1], 1);
    control_expected_[1].push_back(static_cast<std::uint32_t>(nh));

    // Device 0 checks the peer's write, pulls device 1's scratch, and leaves
    // its own peer spin_read running over device 1's persistent block.
    order(1, 0);
    must(k_.check(0, s_[0], dp(s[0]) + h, va, nh, slot(0, it, kPeerWrite)), "check(peer write)");
    a_->peer_copy(b[0], 0, s[1], 1, sb, s_[0]);
    must(k_.check(0, s_[0], dp(b[0]), vb, 2 * nh, slot(0, it, kCopyIn)), "check(copy on device 0)");
    must(k_.check(0, s_[0], dp(b[0]), vb + 1, 2 * nh, slot(0, it, kControl)), "check(control)");
    must(k_.spin_read(0, s_[0], dp(persistent_[1]), words(o_.unit_bytes), spin_iterations_[0],
                      sink_[0]),
         "spin_read(device 0 over device 1's scratch)");
    a_->record_stream(s[1], s_[0], 0);
    a_->record_stream(persistent_[1], s_[0], 0);
    control_expected_[0].push_back(static_cast<std::uint32_t>(2 * nh));
    order(0, 1);

    // Frees, each on a stream already ordered after every use of the block.
    for (int dev = 0; dev < 2; ++dev) {
      a_->deallocate(s[dev], sb, dev, s_[dev]);
      a_->deallocate(b[dev], sb, dev, s_[dev]);
    }
    if (pending(0) || pending(1)) ++rep_.pending_at_revoke;
  }

  void large_batch(int it) {
    where_ = "iteration " + std::to_string(it) + ", large batch: ";
    // The switch, with both peer spin_reads still running.
    switch_to(PeerPolicy::none);
    for (int dev = 0; dev < 2; ++dev)
      expect_access(persistent_[dev], other(dev), Access::none, scratch_name(dev));

    // Staged copies out of fresh scratch blocks, and the blocks freed behind
    // them (stream-ordered), so that trim() finds them queued.
    const std::size_t lb = o_.unit_bytes * (2 + it % 5);
    const std::uint32_t w = value_for(it, 0x44);
    for (int o = 0; o < 2; ++o) {
      const int p = other(o);
      void* l = a_->scratch_allocate(lb, o, s_[o]);
      void* bl = a_->allocate(lb, p, s_[p]);
      if (a_->is_peer_copy_direct(l, o, p))
        throw Failed("peer_copy out of device " + std::to_string(o) +
                     "'s scratch is still direct under none");
      must(k_.fill(o, s_[o], dp(l), w ^ static_cast<std::uint32_t>(o), words(lb)), "fill(large)");
      order(o, p);
      a_->peer_copy(bl, p, l, o, lb, s_[p]);
      must(k_.check(p, s_[p], dp(bl), w ^ static_cast<std::uint32_t>(o), words(lb),
                    slot(p, it, kStaged)),
           "check(staged copy)");
      order(p, o);
      a_->deallocate(l, lb, o, s_[o]);
      a_->deallocate(bl, lb, p, s_[p]);
    }
    mark();
    if (pending(0) || pending(1)) ++rep_.pending_at_trim;
    const std::uint64_t unmapped = chunks(&DeviceStats::chunks_unmapped);
    a_->trim();
    if (chunks(&DeviceStats::chunks_unmapped) == unmapped)
      throw Failed("trim() unmapped no chunk although free scratch chunks were cached");

    // Regrowth past what trim left: new chunks, mapped without a peer grant,
    // with kernels on them still queued when the next phase grants again.
    const std::size_t rb = o_.unit_bytes * (3 + it % 4) + 2 * kMiB;
    const std::uint32_t w2 = value_for(it, 0x55);
    for (int dev = 0; dev < 2; ++dev) {
      const std::uint64_t mapped = a_->device_stats(dev).chunks_mapped;
      void* r = a_->scratch_allocate(rb, dev, s_[dev]);
      if (a_->device_stats(dev).chunks_mapped == mapped)
        throw Failed("scratch regrowth on device " + std::to_string(dev) + " mapped no chunk");
      expect_access(r, other(dev), Access::none,
                    "device " + std::to_string(dev) + "'s regrown scratch");
      const std::uint32_t x = w2 ^ static_cast<std::uint32_t>(dev);
      must(k_.fill(dev, s_[dev], dp(r), x, words(rb)), "fill(regrown scratch)");
      must(k_.check(dev, s_[dev], dp(r), x, words(rb), slot(dev, it, kRegrowth)),
           "check(regrown scratch)");
      a_->deallocate(r, rb, dev, s_[dev]);
    }
    mark();
  }

  // Never throws: synchronises, reads the counters, collects the stats and
  // releases everything.
  void finish() noexcept {
    try {
      for (int dev = 0; dev < 2; ++dev) rep_.final_sync[dev] = d_.ctx_synchronize(dev);
      const bool healthy =
          rep_.final_sync[0] == Result::success && rep_.final_sync[1] == Result::success;
      if (healthy && counters_[0] != 0 && counters_[1] != 0) read_counters();
      if (a_) {
        for (int dev = 0; dev < 2; ++dev)
          if (persistent_[dev] != nullptr && healthy)
            a_->deallocate(persistent_[dev], o_.unit_bytes, dev, s_[dev]);
        const Stats st = a_->stats();
        auto calls = [&](vmm::Call c) { return st.driver.calls[static_cast<std::size_t>(c)]; };
        rep_.enable_peer_calls = calls(vmm::Call::enable_peer_access);
        rep_.disable_peer_calls = calls(vmm::Call::disable_peer_access);
        rep_.set_access_calls = calls(vmm::Call::mem_set_access);
        for (const auto& ds : st.devices) {
          rep_.chunks_mapped += ds.chunks_mapped;
          rep_.chunks_unmapped += ds.chunks_unmapped;
          rep_.fences += ds.fences;
        }
        std::string why;
        if (healthy && !a_->check_invariants(&why)) rep_.invariants = why;
        a_.reset();
      }
      rep_.global_left[0] = d_.disable_peer_access(1, 0);
      rep_.global_left[1] = d_.disable_peer_access(0, 1);
    } catch (const std::exception& e) {
      if (rep_.error.empty()) rep_.error = std::string("finish: ") + e.what();
    }
    for (int dev = 0; dev < 2; ++dev) {
      if (counters_[dev] != 0) (void)d_.mem_free(dev, counters_[dev]);
      if (sink_[dev] != 0) (void)d_.mem_free(dev, sink_[dev]);
      if (ev_[dev] != nullptr) (void)d_.event_destroy(ev_[dev]);
      if (s_[dev] != nullptr) (void)d_.stream_destroy(dev, s_[dev]);
    }
  }

 private:
  static int other(int dev) { return 1 - dev; }
  static std::string scratch_name(int dev) {
    return "device " + std::to_string(dev) + "'s scratch block";
  }
  static std::size_t words(std::size_t bytes) { return bytes / 4; }
  std::size_t counter_bytes() const {
    return static_cast<std::size_t>(o_.iterations) * kSlots * sizeof(std::uint32_t);
  }
  DevicePtr slot(int dev, int it, int s) const {
    return counters_[dev] + (static_cast<std::size_t>(it) * kSlots + static_cast<std::size_t>(s)) *
                                sizeof(std::uint32_t);
  }

  void switch_to(PeerPolicy p) {
    a_->set_peer_policy(p);
    for (int dev = 0; dev < 2; ++dev) {
      const PeerPolicy got = a_->peer_policy(dev, other(dev));
      if (got != p)
        throw Failed(std::string("set_peer_policy(") + to_string(p) + ") left device " +
                     std::to_string(other(dev)) + " -> " + std::to_string(dev) + " at " +
                     to_string(got));
    }
  }

  // `what` names the block in the message ("device 0's scratch block").
  void expect_access(const void* block, int peer, Access want, const std::string& what) {
    Access got = Access::read;
    must(d_.mem_get_access(dp(block), peer, &got), "mem_get_access(" + what + ")");
    if (got != want)
      throw Failed("device " + std::to_string(peer) + "'s access to " + what + " is " +
                   vmm::access_name(got) + ", expected " + vmm::access_name(want));
  }

  // Stream `to` waits for the work queued so far on stream `from` (an event,
  // no host synchronisation).
  void order(int from, int to) {
    must(d_.event_record(from, ev_[from], s_[from]), "event_record");
    must(d_.stream_wait_event(to, s_[to], ev_[from]), "stream_wait_event");
  }
  void mark() {
    for (int dev = 0; dev < 2; ++dev) must(d_.event_record(dev, ev_[dev], s_[dev]), "event_record");
  }
  // Work before the last record of ev_[dev] still queued or running.
  bool pending(int dev) { return d_.event_query(ev_[dev]) == Result::not_ready; }

  std::uint64_t chunks(std::uint64_t DeviceStats::*field) const {
    return a_->device_stats(0).*field + a_->device_stats(1).*field;
  }

  void read_counters() {
    const int done = rep_.iterations_done;
    for (int dev = 0; dev < 2; ++dev) {
      std::vector<std::uint32_t> counts(static_cast<std::size_t>(o_.iterations) * kSlots);
      must(d_.memcpy_dtoh(dev, counts.data(), counters_[dev], counter_bytes()),
           "memcpy_dtoh(counters)");
      for (int it = 0; it < done; ++it) {
        for (int s = 0; s < kSlots; ++s) {
          const std::uint32_t c =
              counts[static_cast<std::size_t>(it) * kSlots + static_cast<std::size_t>(s)];
          const bool control = s == kControl;
          const std::uint32_t want =
              control ? control_expected_[dev][static_cast<std::size_t>(it)] : 0;
          if (c == want) continue;
          if (control) {
            ++rep_.control_failures;
          } else {
            rep_.wrong_words += c;
          }
          if (rep_.data_errors.size() < 8) {
            rep_.data_errors.push_back("iteration " + std::to_string(it) + ", device " +
                                       std::to_string(dev) + ", " + slot_name(s) + ": counted " +
                                       std::to_string(c) + ", expected " + std::to_string(want));
          }
        }
      }
    }
  }

  vmm::TestDriver& d_;
  DeviceKernels& k_;
  const EngineOptions& o_;
  EngineReport& rep_;
  std::string where_;
  std::unique_ptr<Allocator> a_;
  std::array<StreamHandle, 2> s_{};
  std::array<vmm::EventHandle, 2> ev_{};
  std::array<DevicePtr, 2> counters_{};
  std::array<DevicePtr, 2> sink_{};
  std::array<void*, 2> persistent_{};
  std::array<std::uint64_t, 2> spin_iterations_{};
  std::array<std::vector<std::uint32_t>, 2> control_expected_;
};

}  // namespace

EngineReport run_engine(vmm::TestDriver& driver, DeviceKernels& kernels, const EngineOptions& options) {
  EngineReport rep;
  Engine e(driver, kernels, options, rep);
  try {
    e.setup();
    for (int it = 0; it < options.iterations; ++it) {
      e.small_batch(it);
      e.large_batch(it);
      rep.iterations_done = it + 1;
    }
  } catch (const std::exception& ex) {
    rep.error = e.where() + ex.what();
  }
  e.finish();
  return rep;
}

std::string to_string(const EngineReport& r) {
  std::ostringstream o;
  o << "error=" << (r.error.empty() ? "none" : r.error) << "\n"
    << "iterations_done=" << r.iterations_done << "\n"
    << "pending_at_revoke=" << r.pending_at_revoke << "\n"
    << "pending_at_trim=" << r.pending_at_trim << "\n"
    << "pending_at_grant=" << r.pending_at_grant << "\n"
    << "wrong_words=" << r.wrong_words << "\n"
    << "control_failures=" << r.control_failures << "\n";
  for (const auto& e : r.data_errors) o << "data_error=" << e << "\n";
  o << "cuCtxEnablePeerAccess_calls=" << r.enable_peer_calls << "\n"
    << "cuCtxDisablePeerAccess_calls=" << r.disable_peer_calls << "\n"
    << "cuMemSetAccess_calls=" << r.set_access_calls << "\n"
    << "chunks_mapped=" << r.chunks_mapped << "\n"
    << "chunks_unmapped=" << r.chunks_unmapped << "\n"
    << "fences=" << r.fences << "\n"
    << "invariants=" << (r.invariants.empty() ? "ok" : r.invariants) << "\n"
    << "final_sync_0=" << vmm::result_name(r.final_sync[0]) << "\n"
    << "final_sync_1=" << vmm::result_name(r.final_sync[1]) << "\n"
    << "disable_peer_after_1_to_0=" << vmm::result_name(r.global_left[0]) << "\n"
    << "disable_peer_after_0_to_1=" << vmm::result_name(r.global_left[1]) << "\n";
  return o.str();
}

}  // namespace gvm::test
