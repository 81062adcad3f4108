#include "soak.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gvm/allocator.hpp"

namespace gvm::test {
namespace {

using vmm::Access;
using vmm::DevicePtr;
using vmm::EventHandle;
using vmm::Result;
using vmm::StreamHandle;
using Clock = std::chrono::steady_clock;
using Rng = std::mt19937_64;

class Failed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void must(Result r, const std::string& what) {
  if (r != Result::success) throw Failed(what + ": " + vmm::result_name(r));
}

DevicePtr dp(const void* p) {
  return reinterpret_cast<DevicePtr>(p);
}

int other(int device) {
  return 1 - device;
}

double coin(Rng& rng) {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

// Log-uniform in [lo, hi], a whole number of 4-byte words (the kernels'
// unit), at least one word.
std::size_t log_uniform(Rng& rng, std::size_t lo, std::size_t hi) {
  const double x = std::uniform_real_distribution<double>(std::log(static_cast<double>(lo)),
                                                          std::log(static_cast<double>(hi)))(rng);
  const auto bytes = static_cast<std::size_t>(std::exp(x));
  return std::max<std::size_t>(4, bytes & ~std::size_t{3});
}

// What one thread did; merged into the report when the thread ends, so the
// hot loops count without atomics.
struct Tally {
  std::uint64_t allocations = 0, frees = 0, cross_stream_frees = 0, out_of_memory = 0;
  std::uint64_t scratch_blocks = 0, peer_kernels = 0, direct_copies = 0, staged_copies = 0;
  std::uint64_t trims = 0, policy_switches = 0, invariant_checks = 0;
  std::uint64_t switches_with_work_queued = 0, trims_with_work_queued = 0;
  std::uint64_t access_checks = 0, ordinary_block_peer_access = 0, scratch_access_wrong = 0;
  std::uint64_t words_checked = 0, wrong_words = 0;
  std::uint64_t control_checks = 0, control_failures = 0, counter_reads = 0;

  void add_to(SoakReport& r) const {
    r.allocations += allocations;
    r.frees += frees;
    r.cross_stream_frees += cross_stream_frees;
    r.out_of_memory += out_of_memory;
    r.scratch_blocks += scratch_blocks;
    r.peer_kernels += peer_kernels;
    r.direct_copies += direct_copies;
    r.staged_copies += staged_copies;
    r.trims += trims;
    r.policy_switches += policy_switches;
    r.invariant_checks += invariant_checks;
    r.switches_with_work_queued += switches_with_work_queued;
    r.trims_with_work_queued += trims_with_work_queued;
    r.access_checks += access_checks;
    r.ordinary_block_peer_access += ordinary_block_peer_access;
    r.scratch_access_wrong += scratch_access_wrong;
    r.words_checked += words_checked;
    r.wrong_words += wrong_words;
    r.control_checks += control_checks;
    r.control_failures += control_failures;
    r.counter_reads += counter_reads;
  }
};

// Per-thread counters in device memory: [0] wrong words seen by the checks,
// [1] words counted by the control checks (a wrong value on purpose).
struct Counters {
  int device = -1;
  DevicePtr mem = 0;
  std::uint64_t control_expected = 0;  // since the last read
  DevicePtr wrong() const { return mem; }
  DevicePtr control() const { return mem + 4; }
};

// A block a worker holds.
struct Held {
  void* p = nullptr;
  std::size_t bytes = 0;
  int stream = 0;  // index into the worker's streams
  std::uint32_t value = 0;
};

// The largest control check: its count must fit the 32-bit counter many
// times over between two reads.
constexpr std::size_t kControlMaxWords = std::size_t{1} << 16;
// Operations between two counter reads.
constexpr std::uint64_t kReadEvery = 256;

class Soak {
 public:
  Soak(vmm::TestDriver& d, DeviceKernels& k, const SoakOptions& o, SoakReport& r)
      : d_(d), k_(k), o_(o), rep_(r) {}
  Soak(const Soak&) = delete;
  Soak& operator=(const Soak&) = delete;
  ~Soak() { release_resources(); }

  void run() {
    setup();
    if (!error_.empty()) {
      rep_.error = error_;
      return;
    }
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    const int workers = 2 * o_.threads_per_device;
    for (int i = 0; i < workers; ++i) threads.emplace_back([this, i] { block_worker(i); });
    for (int o = 0; o < 2; ++o) threads.emplace_back([this, o] { scratch_worker(o); });
    guarded("control", [this] { control(); });
    stop_ = true;
    for (auto& t : threads) t.join();
    rep_.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    guarded("the end", [this] { finish(); });
    // Whatever happened above: a sticky error shows here.
    for (int dev = 0; dev < 2; ++dev) rep_.final_sync[dev] = d_.ctx_synchronize(dev);
    rep_.error = error_;
  }

 private:
  // --- setup and the end -------------------------------------------------

  void setup() {
    guarded("setup", [this] {
      if (o_.threads_per_device < 1 || o_.streams_per_thread < 1 || o_.max_held < 2)
        throw Failed("threads_per_device, streams_per_thread >= 1 and max_held >= 2 needed");
      int devices = 0;
      must(d_.device_count(&devices), "device_count");
      if (devices < 2) throw Failed("needs 2 devices");
      // The threads' own resources first, so that the baseline includes them.
      const int workers = 2 * o_.threads_per_device;
      workers_.resize(static_cast<std::size_t>(workers));
      for (int i = 0; i < workers; ++i) {
        Worker& w = workers_[static_cast<std::size_t>(i)];
        w.device = i % 2;
        w.rng.seed(o_.seed * 1000003u + static_cast<unsigned>(i));
        w.streams.resize(static_cast<std::size_t>(o_.streams_per_thread));
        for (auto& s : w.streams) must(d_.stream_create(w.device, &s), "stream_create");
        must(d_.event_create(w.device, &w.event), "event_create");
        w.counters = make_counters(w.device, w.streams[0]);
      }
      for (int o = 0; o < 2; ++o) {
        ScratchWorker& w = scratch_workers_[o];
        w.rng.seed(o_.seed * 7919u + static_cast<unsigned>(o));
        must(d_.stream_create(o, &w.owner_stream), "stream_create");
        must(d_.stream_create(other(o), &w.peer_stream), "stream_create");
        must(d_.event_create(o, &w.owner_event), "event_create");
        must(d_.event_create(other(o), &w.peer_event), "event_create");
        w.counters = make_counters(other(o), w.peer_stream);
        must(d_.mem_alloc(other(o), 4, &w.sink), "mem_alloc(sink)");
      }
      for (int dev = 0; dev < 2; ++dev) {
        must(d_.stream_create(dev, &control_stream_[dev]), "stream_create");
        must(d_.ctx_synchronize(dev), "ctx_synchronize");
        std::size_t total = 0;
        must(d_.mem_get_info(dev, &free_before_[dev], &total), "mem_get_info");
      }

      Config c = o_.config;
      c.max_reserved_bytes = o_.reserved_cap;
      a_ = std::make_unique<Allocator>(d_, c);
      mode_ = a_->peer_policy(0, 1);
      if (mode_ == PeerPolicy::none || a_->peer_policy(1, 0) == PeerPolicy::none)
        throw Failed("devices 0 and 1 have no P2P path");

      // How long a peer spin_read over 1 MiB of scratch keeps a stream busy:
      // about a millisecond, so that the control's switches and trims meet
      // peer work still queued.
      for (int o = 0; o < 2; ++o) {
        ScratchWorker& w = scratch_workers_[o];
        void* s = a_->scratch_allocate(kSpinBytes, o, w.owner_stream);
        must(k_.fill(o, w.owner_stream, dp(s), 0, kSpinBytes / 4), "fill(spin scratch)");
        must(d_.stream_synchronize(o, w.owner_stream), "stream_synchronize");
        must(k_.calibrate_spin(other(o), w.peer_stream, dp(s), kSpinBytes / 4, 0.001,
                               &w.spin_iterations),
             "calibrate_spin");
        must(d_.stream_synchronize(other(o), w.peer_stream), "stream_synchronize");
        a_->deallocate(s, kSpinBytes, o, w.owner_stream);
      }
      must(d_.ctx_synchronize(0), "ctx_synchronize");
      must(d_.ctx_synchronize(1), "ctx_synchronize");
      a_->trim();
    });
  }

  void finish() {
    if (a_ == nullptr) return;
    // Back to the policy DeviceCaps chose (leaves no context peer access on).
    a_->set_peer_policy(PeerPolicy::automatic);
    for (int dev = 0; dev < 2; ++dev) must(d_.ctx_synchronize(dev), "ctx_synchronize");
    a_->trim();
    for (int dev = 0; dev < 2; ++dev) {
      const DeviceStats s = a_->device_stats(dev);
      rep_.peak_reserved[dev] = s.peak_reserved_bytes;
      rep_.reserved_after_trim[dev] = s.reserved_bytes;
      rep_.live_after[dev] = s.live_bytes;
      std::size_t free_after = 0, total = 0;
      must(d_.mem_get_info(dev, &free_after, &total), "mem_get_info");
      rep_.free_memory_delta[dev] =
          static_cast<long long>(free_after) - static_cast<long long>(free_before_[dev]);
    }
    std::string why;
    if (!a_->check_invariants(&why)) rep_.invariants = why;
    a_.reset();
  }

  Counters make_counters(int device, StreamHandle stream) {
    Counters c;
    c.device = device;
    must(d_.mem_alloc(device, 8, &c.mem), "mem_alloc(counters)");
    must(d_.memset_d8_async(device, c.mem, 0, 8, stream), "memset(counters)");
    must(d_.stream_synchronize(device, stream), "stream_synchronize");
    return c;
  }

  void release_resources() {
    a_.reset();
    for (auto& w : workers_) {
      for (auto s : w.streams)
        if (s != nullptr) (void)d_.stream_destroy(w.device, s);
      if (w.event != nullptr) (void)d_.event_destroy(w.event);
      if (w.counters.mem != 0) (void)d_.mem_free(w.device, w.counters.mem);
    }
    for (int o = 0; o < 2; ++o) {
      ScratchWorker& w = scratch_workers_[o];
      if (w.owner_stream != nullptr) (void)d_.stream_destroy(o, w.owner_stream);
      if (w.peer_stream != nullptr) (void)d_.stream_destroy(other(o), w.peer_stream);
      if (w.owner_event != nullptr) (void)d_.event_destroy(w.owner_event);
      if (w.peer_event != nullptr) (void)d_.event_destroy(w.peer_event);
      if (w.counters.mem != 0) (void)d_.mem_free(other(o), w.counters.mem);
      if (w.sink != 0) (void)d_.mem_free(other(o), w.sink);
    }
    for (int dev = 0; dev < 2; ++dev)
      if (control_stream_[dev] != nullptr) (void)d_.stream_destroy(dev, control_stream_[dev]);
  }

  // --- the workers -------------------------------------------------------

  struct Worker {
    int device = 0;
    std::vector<StreamHandle> streams;
    EventHandle event = nullptr;
    Counters counters;
    Rng rng;
    std::uint32_t next_value = 1;
  };

  struct ScratchWorker {
    StreamHandle owner_stream = nullptr;  // on the owner, o
    StreamHandle peer_stream = nullptr;   // on the peer, 1 - o
    EventHandle owner_event = nullptr;
    EventHandle peer_event = nullptr;  // recorded after the peer's last use (the control queries it)
    Counters counters;                 // on the peer
    DevicePtr sink = 0;
    std::uint64_t spin_iterations = 1;
    Rng rng;
    std::uint32_t next_value = 1;
  };

  static constexpr std::size_t kSpinBytes = std::size_t{1} << 20;

  std::uint32_t value_for(std::uint32_t& next, std::uint32_t salt) {
    std::uint32_t x = next++ * 0x9e3779b9u ^ salt;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    return x;
  }

  void block_worker(int index) {
    Worker& w = workers_[static_cast<std::size_t>(index)];
    Tally t;
    std::vector<Held> held;
    guarded("block worker " + std::to_string(index) + " (device " + std::to_string(w.device) + ")",
            [&] {
              std::uint64_t ops = 0;
              while (!stop_) {
                const bool grow = held.size() < static_cast<std::size_t>(o_.max_held) &&
                                  (held.empty() || coin(w.rng) < 0.55);
                if (grow) {
                  allocate_block(w, held, t);
                } else {
                  const auto i = static_cast<std::size_t>(w.rng() % held.size());
                  free_block(w, held, i, t);
                }
                if (++ops % kReadEvery == 0) read_counters(w.counters, w.streams, t);
              }
              while (!held.empty()) free_block(w, held, held.size() - 1, t);
              read_counters(w.counters, w.streams, t);
            });
    merge(t);
  }

  std::size_t block_size(Rng& rng) const {
    const double r = coin(rng);
    if (r < 0.70) return log_uniform(rng, 64, o_.small_max);
    if (r < 0.97) return log_uniform(rng, o_.small_max, o_.large_max);
    return log_uniform(rng, o_.huge_min, o_.huge_max);
  }

  void allocate_block(Worker& w, std::vector<Held>& held, Tally& t) {
    const std::size_t bytes = block_size(w.rng);
    const int k = static_cast<int>(w.rng() % w.streams.size());
    void* p = nullptr;
    try {
      p = a_->allocate(bytes, w.device, w.streams[static_cast<std::size_t>(k)]);
    } catch (const gvm::out_of_memory&) {
      // The cap: give back half of what this worker holds, and go on.
      ++t.out_of_memory;
      for (std::size_t n = held.size() / 2; n > 0; --n)
        free_block(w, held, static_cast<std::size_t>(w.rng() % held.size()), t);
      return;
    }
    ++t.allocations;
    held.push_back({p, bytes, k, value_for(w.next_value, static_cast<std::uint32_t>(w.device))});
    expect_private(p, w.device, t);
    must(k_.fill(w.device, w.streams[static_cast<std::size_t>(k)], dp(p), held.back().value,
                 bytes / 4),
         "fill");
  }

  // Checks the block's data, sometimes on another stream of the worker
  // (behind an event, with record_stream), then frees it on its own stream.
  void free_block(Worker& w, std::vector<Held>& held, std::size_t i, Tally& t) {
    const Held b = held[i];
    held[i] = held.back();
    held.pop_back();
    const std::size_t n = b.bytes / 4;
    const StreamHandle s = w.streams[static_cast<std::size_t>(b.stream)];
    if (n <= kControlMaxWords && coin(w.rng) < 0.1) {
      must(k_.check(w.device, s, dp(b.p), b.value + 1, n, w.counters.control()), "check(control)");
      w.counters.control_expected += n;
      ++t.control_checks;
    }
    if (w.streams.size() > 1 && coin(w.rng) < 0.25) {
      const StreamHandle u =
          w.streams[(static_cast<std::size_t>(b.stream) + 1) % w.streams.size()];
      must(d_.event_record(w.device, w.event, s), "event_record");
      must(d_.stream_wait_event(w.device, u, w.event), "stream_wait_event");
      must(k_.check(w.device, u, dp(b.p), b.value, n, w.counters.wrong()), "check(other stream)");
      a_->record_stream(b.p, u);
      ++t.cross_stream_frees;
    } else {
      must(k_.check(w.device, s, dp(b.p), b.value, n, w.counters.wrong()), "check");
    }
    t.words_checked += n;
    a_->deallocate(b.p, b.bytes, w.device, s);
    ++t.frees;
  }

  // One scratch round trip per iteration: the owner fills a scratch block,
  // the peer reads it in place and copies it into a block of its own, and
  // the scratch is freed behind the peer's work. Peer work is queued under
  // the shared policy lock (so the policy cannot change between the check of
  // the mode and the launch); it is still running when the lock is let go,
  // and a switch or trim that comes then has only the fence to rely on.
  void scratch_worker(int o) {
    ScratchWorker& w = scratch_workers_[o];
    const int p = other(o);
    Tally t;
    guarded("scratch worker " + std::to_string(o), [&] {
      std::uint64_t ops = 0;
      const std::vector<StreamHandle> peer_streams{w.peer_stream};
      while (!stop_) {
        if (switch_wanted_) {
          // Let the control in: shared locks taken back to back would starve it.
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          continue;
        }
        scratch_round(w, o, p, t);
        if (++ops % (kReadEvery / 4) == 0) {
          must(d_.stream_synchronize(o, w.owner_stream), "stream_synchronize");
          read_counters(w.counters, peer_streams, t);
        }
      }
      must(d_.stream_synchronize(o, w.owner_stream), "stream_synchronize");
      read_counters(w.counters, peer_streams, t);
    });
    merge(t);
  }

  void scratch_round(ScratchWorker& w, int o, int p, Tally& t) {
    const std::size_t bytes = log_uniform(w.rng, 4096, o_.scratch_max);
    const std::size_t n = bytes / 4;
    std::shared_lock<std::shared_mutex> lock(policy_mu_);
    const PeerPolicy mode = mode_;
    void* s = nullptr;
    void* b = nullptr;
    try {
      s = a_->scratch_allocate(bytes, o, w.owner_stream);
      b = a_->allocate(bytes, p, w.peer_stream);
    } catch (const gvm::out_of_memory&) {
      ++t.out_of_memory;
      if (s != nullptr) a_->deallocate(s, bytes, o, w.owner_stream);
      return;
    }
    ++t.scratch_blocks;
    ++t.allocations;
    expect_scratch_access(s, o, mode, t);
    expect_private(b, p, t);
    const std::uint32_t v = value_for(w.next_value, 0x5c000000u + static_cast<std::uint32_t>(o));
    must(k_.fill(o, w.owner_stream, dp(s), v, n), "fill(scratch)");
    must(d_.event_record(o, w.owner_event, w.owner_stream), "event_record");
    must(d_.stream_wait_event(p, w.peer_stream, w.owner_event), "stream_wait_event");

    const bool direct = a_->is_peer_copy_direct(s, o, p);
    if (direct != (mode != PeerPolicy::none))
      throw Failed(std::string("peer_copy out of the scratch would be ") +
                   (direct ? "direct" : "staged") + " under policy " + to_string(mode));
    if (mode != PeerPolicy::none) {
      // The peer reads the scratch in place, then keeps reading it a while.
      must(k_.check(p, w.peer_stream, dp(s), v, n, w.counters.wrong()), "check(peer read)");
      must(k_.spin_read(p, w.peer_stream, dp(s), std::min(n, kSpinBytes / 4), w.spin_iterations,
                        w.sink),
           "spin_read(peer)");
      ++t.peer_kernels;
      t.words_checked += n;
    }
    a_->peer_copy(b, p, s, o, bytes, w.peer_stream);
    ++(direct ? t.direct_copies : t.staged_copies);
    a_->record_stream(s, w.peer_stream, p);
    must(k_.check(p, w.peer_stream, dp(b), v, n, w.counters.wrong()), "check(copy)");
    t.words_checked += n;
    if (n <= kControlMaxWords && coin(w.rng) < 0.1) {
      must(k_.check(p, w.peer_stream, dp(b), v + 1, n, w.counters.control()), "check(control)");
      w.counters.control_expected += n;
      ++t.control_checks;
    }
    must(d_.event_record(p, w.peer_event, w.peer_stream), "event_record");
    lock.unlock();

    // Frees behind the peer's use: the owner's stream waits for it.
    must(d_.stream_wait_event(o, w.owner_stream, w.peer_event), "stream_wait_event");
    a_->deallocate(s, bytes, o, w.owner_stream);
    a_->deallocate(b, bytes, p, w.peer_stream);
    t.frees += 2;
  }

  // Waits for `streams`, reads and resets the counters.
  void read_counters(Counters& c, const std::vector<StreamHandle>& streams, Tally& t) {
    for (StreamHandle s : streams) must(d_.stream_synchronize(c.device, s), "stream_synchronize");
    std::uint32_t v[2] = {0, 0};
    must(d_.memcpy_dtoh(c.device, v, c.mem, sizeof v), "memcpy_dtoh(counters)");
    if (v[0] != 0) data_error("device " + std::to_string(c.device) + ": " +
                              std::to_string(v[0]) + " wrong words since the last read");
    t.wrong_words += v[0];
    if (v[1] != c.control_expected) {
      ++t.control_failures;
      data_error("device " + std::to_string(c.device) + ": control checks counted " +
                 std::to_string(v[1]) + " words, expected " + std::to_string(c.control_expected));
    }
    c.control_expected = 0;
    must(d_.memset_d8_async(c.device, c.mem, 0, 8, streams[0]), "memset(counters)");
    must(d_.stream_synchronize(c.device, streams[0]), "stream_synchronize");
    ++t.counter_reads;
  }

  // --- access rights -----------------------------------------------------

  // An ordinary block of `device`: the other device must have no access.
  void expect_private(const void* p, int device, Tally& t) {
    Access a = Access::read;
    must(d_.mem_get_access(dp(p), other(device), &a), "mem_get_access(ordinary block)");
    ++t.access_checks;
    if (a != Access::none) {
      ++t.ordinary_block_peer_access;
      throw Failed("device " + std::to_string(other(device)) + " has " + vmm::access_name(a) +
                   " access to an ordinary block of device " + std::to_string(device));
    }
  }

  // A scratch block of `owner`: the peer has read_write unless the policy is
  // none.
  void expect_scratch_access(const void* p, int owner, PeerPolicy mode, Tally& t) {
    Access a = Access::read;
    must(d_.mem_get_access(dp(p), other(owner), &a), "mem_get_access(scratch)");
    ++t.access_checks;
    const Access want = mode == PeerPolicy::none ? Access::none : Access::read_write;
    if (a != want) {
      ++t.scratch_access_wrong;
      throw Failed("device " + std::to_string(other(owner)) + " has " + vmm::access_name(a) +
                   " access to device " + std::to_string(owner) + "'s scratch under policy " +
                   to_string(mode) + ", expected " + vmm::access_name(want));
    }
  }

  // --- the control -------------------------------------------------------

  void control() {
    Tally t;
    Rng rng(o_.seed * 104729u);
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(o_.seconds));
    try {
      while (!stop_ && Clock::now() < deadline) {
        const auto pause = 1 + static_cast<int>(rng() % static_cast<unsigned>(
                                                    std::max(1, o_.control_pause_ms)));
        std::this_thread::sleep_for(std::chrono::milliseconds(pause));
        const double r = coin(rng);
        if (r < 0.45) {
          switch_policy(rng, t);
        } else if (r < 0.9) {
          if (peer_work_queued()) ++t.trims_with_work_queued;
          if (coin(rng) < 0.5) {
            a_->trim();
          } else {
            a_->trim(static_cast<int>(rng() % 2));
          }
          ++t.trims;
        } else {
          std::string why;
          ++t.invariant_checks;
          if (!a_->check_invariants(&why)) throw Failed("check_invariants: " + why);
        }
      }
    } catch (...) {
      merge(t);
      throw;
    }
    merge(t);
  }

  void switch_policy(Rng& rng, Tally& t) {
    static constexpr PeerPolicy kModes[] = {PeerPolicy::per_allocation, PeerPolicy::none,
                                            PeerPolicy::global};
    switch_wanted_ = true;
    std::unique_lock<std::shared_mutex> lock(policy_mu_);
    switch_wanted_ = false;
    PeerPolicy next = mode_;
    while (next == mode_) next = kModes[rng() % 3];
    if (peer_work_queued()) ++t.switches_with_work_queued;
    a_->set_peer_policy(next);
    mode_ = next;
    ++t.policy_switches;
    // A scratch block of each device under the new policy: the peer's access
    // must follow it (a cached chunk, or one mapped now).
    for (int dev = 0; dev < 2; ++dev) {
      // The reserve cap counts a device's arena and scratch together: with
      // the block workers holding the device's share, there may be no room.
      void* s = nullptr;
      try {
        s = a_->scratch_allocate(64 << 10, dev, control_stream_[dev]);
      } catch (const gvm::out_of_memory&) {
        ++t.out_of_memory;
        continue;
      }
      try {
        expect_scratch_access(s, dev, next, t);
      } catch (...) {
        a_->deallocate(s, 64 << 10, dev, control_stream_[dev]);
        throw;
      }
      a_->deallocate(s, 64 << 10, dev, control_stream_[dev]);
    }
  }

  // Whether a scratch worker's peer work is still queued or running.
  bool peer_work_queued() {
    bool any = false;
    for (auto& w : scratch_workers_) any |= d_.event_query(w.peer_event) == Result::not_ready;
    return any;
  }

  // --- failures ----------------------------------------------------------

  template <class F>
  void guarded(const std::string& who, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      fail(who + ": " + e.what());
    }
  }

  void fail(const std::string& what) {
    std::lock_guard<std::mutex> g(mu_);
    if (error_.empty()) error_ = what;
    stop_ = true;
  }

  void data_error(const std::string& what) {
    std::lock_guard<std::mutex> g(mu_);
    if (first_data_error_.empty()) first_data_error_ = what;
  }

  void merge(const Tally& t) {
    std::lock_guard<std::mutex> g(mu_);
    t.add_to(rep_);
  }

  vmm::TestDriver& d_;
  DeviceKernels& k_;
  const SoakOptions& o_;
  SoakReport& rep_;
  std::unique_ptr<Allocator> a_;
  std::vector<Worker> workers_;
  ScratchWorker scratch_workers_[2];
  StreamHandle control_stream_[2] = {nullptr, nullptr};
  std::size_t free_before_[2] = {0, 0};

  std::shared_mutex policy_mu_;
  PeerPolicy mode_ = PeerPolicy::none;  // written under policy_mu_ held exclusively
  std::atomic<bool> switch_wanted_{false};
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // error_, first_data_error_, merges into rep_
  std::string error_;
  std::string first_data_error_;

 public:
  std::string first_data_error() const { return first_data_error_; }
};

}  // namespace

SoakReport run_soak(vmm::TestDriver& driver, DeviceKernels& kernels, const SoakOptions& options) {
  SoakReport r;
  Soak soak(driver, kernels, options, r);
  soak.run();
  if (r.error.empty() && !soak.first_data_error().empty())
    r.error = "data: " + soak.first_data_error();
  return r;
}

bool soak_passed(const SoakReport& r, const SoakOptions& o, std::string* why) {
  std::ostringstream out;
  if (!r.error.empty()) out << "error: " << r.error << "\n";
  if (r.wrong_words != 0) out << r.wrong_words << " wrong words\n";
  if (r.control_failures != 0) out << r.control_failures << " control counts wrong\n";
  if (r.ordinary_block_peer_access != 0)
    out << r.ordinary_block_peer_access << " ordinary blocks reachable by the peer\n";
  if (r.scratch_access_wrong != 0) out << r.scratch_access_wrong << " scratch access wrong\n";
  if (!r.invariants.empty()) out << "invariants: " << r.invariants << "\n";
  for (int dev = 0; dev < 2; ++dev) {
    if (r.reserved_after_trim[dev] != 0)
      out << "device " << dev << ": " << r.reserved_after_trim[dev]
          << " bytes reserved after the final trim (baseline 0)\n";
    if (r.live_after[dev] != 0) out << "device " << dev << ": " << r.live_after[dev] << " bytes live at the end\n";
    if (r.free_memory_delta[dev] < -static_cast<long long>(o.free_memory_tolerance))
      out << "device " << dev << ": the driver reports " << -r.free_memory_delta[dev]
          << " bytes less free memory than before the allocator\n";
    if (r.final_sync[dev] != vmm::Result::success)
      out << "device " << dev << ": final ctx_synchronize " << vmm::result_name(r.final_sync[dev])
          << "\n";
  }
  if (r.counter_reads == 0 || r.words_checked == 0) out << "no data was checked\n";
  if (why != nullptr) *why = out.str();
  return out.str().empty();
}

std::string to_string(const SoakReport& r) {
  std::ostringstream o;
  o << "error=" << (r.error.empty() ? "none" : r.error) << "\n"
    << "seconds=" << r.seconds << "\n"
    << "allocations=" << r.allocations << "\nfrees=" << r.frees
    << "\ncross_stream_frees=" << r.cross_stream_frees << "\nout_of_memory=" << r.out_of_memory
    << "\nscratch_blocks=" << r.scratch_blocks << "\npeer_kernels=" << r.peer_kernels
    << "\ndirect_copies=" << r.direct_copies << "\nstaged_copies=" << r.staged_copies
    << "\ntrims=" << r.trims << "\ntrims_with_work_queued=" << r.trims_with_work_queued
    << "\npolicy_switches=" << r.policy_switches
    << "\nswitches_with_work_queued=" << r.switches_with_work_queued
    << "\ninvariant_checks=" << r.invariant_checks << "\naccess_checks=" << r.access_checks
    << "\nordinary_block_peer_access=" << r.ordinary_block_peer_access
    << "\nscratch_access_wrong=" << r.scratch_access_wrong << "\nwords_checked=" << r.words_checked
    << "\nwrong_words=" << r.wrong_words << "\ncontrol_checks=" << r.control_checks
    << "\ncontrol_failures=" << r.control_failures << "\ncounter_reads=" << r.counter_reads;
  for (int dev = 0; dev < 2; ++dev) {
    o << "\ndevice" << dev << "_peak_reserved=" << r.peak_reserved[dev] << "\ndevice" << dev
      << "_reserved_after_trim=" << r.reserved_after_trim[dev] << "\ndevice" << dev
      << "_live_after=" << r.live_after[dev] << "\ndevice" << dev
      << "_free_memory_delta=" << r.free_memory_delta[dev] << "\ndevice" << dev
      << "_final_sync=" << vmm::result_name(r.final_sync[dev]);
  }
  o << "\ninvariants=" << (r.invariants.empty() ? "ok" : r.invariants) << "\n";
  return o.str();
}

}  // namespace gvm::test
