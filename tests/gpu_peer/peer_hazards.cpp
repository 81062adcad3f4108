#include "peer_hazards.hpp"

#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "gvm/allocator.hpp"

namespace gvm::test {
namespace {

using vmm::Access;
using vmm::DevicePtr;
using vmm::Result;
using vmm::StreamHandle;

constexpr std::uint32_t kPattern = 0x5a17c0deu;

DevicePtr dp(const void* p) {
  return reinterpret_cast<DevicePtr>(p);
}

// What every scenario holds. Unfenced, the destructor leaks it all: device
// 1's context is broken and the process is about to exit.
class Run {
 public:
  Run(vmm::TestDriver& d, DeviceKernels& k, bool fenced, PeerHazardReport& rep)
      : d_(d), k_(k), fenced_(fenced), rep_(rep) {}
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  ~Run() {
    try {
      if (a_)
        rep_.enable_peer_calls =
            a_->stats().driver.calls[static_cast<std::size_t>(vmm::Call::enable_peer_access)];
    } catch (...) {  // a report without the count; never throw from here
    }
    // Unfenced on the real driver, device 1's context is broken: leave it
    // all to the process's exit. The simulator's state is plain bookkeeping
    // that tolerates the teardown.
    if (!fenced_ && std::string(d_.name()) != "sim") {
      (void)a_.release();  // deliberately leaked
      return;
    }
    a_.reset();
    if (done_ != nullptr) (void)d_.event_destroy(done_);
    if (sink_ != 0) (void)d_.mem_free(1, sink_);
    for (int dev = 0; dev < 2; ++dev)
      if (s_[dev] != nullptr) (void)d_.stream_destroy(dev, s_[dev]);
  }

  // Records the first failed setup step; false once one failed.
  bool step(Result r, const std::string& what) {
    if (r == Result::success) return rep_.setup_error.empty();
    if (rep_.setup_error.empty()) rep_.setup_error = what + " failed: " + vmm::result_name(r);
    return false;
  }
  bool fail(const std::string& why) {
    if (rep_.setup_error.empty()) rep_.setup_error = why;
    return false;
  }

  // The allocator, streams on both devices, an event and a sink on device 1.
  bool open(const Config& c) {
    try {
      a_ = std::make_unique<Allocator>(d_, c);
    } catch (const std::exception& e) {
      return fail(std::string("Allocator: ") + e.what());
    }
    rep_.policy = to_string(a_->peer_policy(0, 1));
    return step(d_.stream_create(0, &s_[0]), "stream_create(device 0)") &&
           step(d_.stream_create(1, &s_[1]), "stream_create(device 1)") &&
           step(d_.event_create(1, &done_), "event_create(device 1)") &&
           step(d_.mem_alloc(1, 4, &sink_), "mem_alloc(device 1)");
  }

  // The allocator call that changes access, with its driver error if any.
  template <class F>
  void change(F&& f) {
    try {
      f();
    } catch (const vmm::DriverError& e) {
      rep_.change = e.result();
      rep_.change_error = e.what();
    } catch (const std::exception& e) {
      rep_.change = Result::unknown;
      rep_.change_error = e.what();
    }
  }

  // After the change: the busy stream, then an unrelated call on device 1.
  void aftermath() {
    rep_.sync = d_.stream_synchronize(1, s_[1]);
    DevicePtr p = 0;
    rep_.later = d_.mem_alloc(1, std::size_t{2} << 20, &p);
    if (rep_.later == Result::success) (void)d_.mem_free(1, p);
  }

  // Keeps device 1 reading [p, p + bytes) for about `seconds`.
  bool start_spin(DevicePtr p, std::size_t bytes, const PeerHazardOptions& o) {
    const std::size_t n = bytes / 4;
    if (!step(k_.calibrate_spin(1, s_[1], p, n, fenced_ ? o.fenced_spin_seconds : o.spin_seconds,
                                &rep_.spin_iterations),
              "calibrating spin_read on device 1 over device 0's scratch") ||
        !step(k_.spin_read(1, s_[1], p, n, rep_.spin_iterations, sink_), "spin_read launch") ||
        !step(d_.event_record(1, done_, s_[1]), "event_record"))
      return false;
    rep_.pending_before_change = d_.event_query(done_) == Result::not_ready;
    return true;
  }

  void verify(Result r, const std::string& what) {
    if (r == Result::success || rep_.verify != Result::success) return;
    rep_.verify = r;
    rep_.verify_error = what + ": " + vmm::result_name(r);
  }
  void verify_that(bool ok, const std::string& why) {
    if (ok || rep_.verify != Result::success) return;
    rep_.verify = Result::unknown;
    rep_.verify_error = why;
  }

  vmm::TestDriver& d_;
  DeviceKernels& k_;
  bool fenced_;
  PeerHazardReport& rep_;
  std::unique_ptr<Allocator> a_;
  StreamHandle s_[2] = {nullptr, nullptr};
  vmm::EventHandle done_ = nullptr;
  DevicePtr sink_ = 0;
};

Config config_for(bool fenced) {
  Config c;
  c.fence_enabled = fenced;  // the test hook; the only difference between the runs
  return c;
}

// --- switch_during_peer_kernel ----------------------------------------------
void switch_during_peer_kernel(Run& r, const PeerHazardOptions& o) {
  if (!r.open(config_for(r.fenced_))) return;
  Allocator& a = *r.a_;
  if (a.peer_policy(0, 1) != PeerPolicy::per_allocation) {
    r.fail("needs per_allocation between devices 0 and 1; the allocator chose " + r.rep_.policy);
    return;
  }
  void* p = nullptr;
  try {
    p = a.scratch_allocate(o.read_bytes, 0, r.s_[0]);
  } catch (const std::exception& e) {
    r.fail(std::string("scratch_allocate: ") + e.what());
    return;
  }
  const std::size_t n = o.read_bytes / 4;
  if (!r.step(r.k_.fill(0, r.s_[0], dp(p), kPattern, n), "fill on device 0") ||
      !r.step(r.d_.stream_synchronize(0, r.s_[0]), "stream_synchronize(device 0)") ||
      !r.start_spin(dp(p), o.read_bytes, o))
    return;
  a.record_stream(p, r.s_[1], 1);

  r.change([&] { a.set_peer_policy(PeerPolicy::none); });
  r.aftermath();
  if (!r.fenced_) return;

  Access acc = Access::read_write;
  r.verify(r.d_.mem_get_access(dp(p), 1, &acc), "mem_get_access");
  r.verify_that(acc == Access::none, std::string("device 1 still has ") + vmm::access_name(acc) +
                                         " access to the scratch after set_peer_policy(none)");
  std::uint32_t m = 0;
  r.verify(r.k_.count_mismatches(r.d_, 0, r.s_[0], dp(p), kPattern, n, &m), "check on device 0");
  r.rep_.mismatches += m;
  // And back: the grant returns and device 1 reads the same data.
  r.change([&] { a.set_peer_policy(PeerPolicy::per_allocation); });
  m = 0;
  r.verify(r.k_.count_mismatches(r.d_, 1, r.s_[1], dp(p), kPattern, n, &m),
           "check on device 1 after the grant returned");
  r.rep_.mismatches += m;
  a.deallocate(p, o.read_bytes, 0, r.s_[0]);
}

// --- global_switch_during_peer_copy -----------------------------------------
void global_switch_during_peer_copy(Run& r, const PeerHazardOptions& o) {
  Config c = config_for(r.fenced_);
  c.peer_policy = PeerPolicy::global;
  if (!r.open(c)) return;
  Allocator& a = *r.a_;
  if (a.peer_policy(0, 1) != PeerPolicy::global) {
    r.fail("needs a P2P path to force global; the allocator chose " + r.rep_.policy);
    return;
  }
  void* src = nullptr;
  void* dst = nullptr;
  try {
    src = a.scratch_allocate(o.copy_bytes, 0, r.s_[0]);  // enables context peer access 1 -> 0
    dst = a.allocate(o.copy_bytes, 1, r.s_[1]);
  } catch (const std::exception& e) {
    r.fail(std::string("allocation: ") + e.what());
    return;
  }
  if (!r.step(r.d_.memset_d8_async(0, dp(src), 0x5a, o.copy_bytes, r.s_[0]),
              "memset on device 0") ||
      !r.step(r.d_.memset_d8_async(1, dp(dst), 0, o.copy_bytes, r.s_[1]), "memset on device 1") ||
      !r.step(r.d_.stream_synchronize(0, r.s_[0]), "stream_synchronize(device 0)") ||
      !r.step(r.d_.stream_synchronize(1, r.s_[1]), "stream_synchronize(device 1)"))
    return;
  if (!a.is_peer_copy_direct(src, 0, 1)) {
    r.fail("peer_copy out of device 0's scratch would be staged under global");
    return;
  }
  try {
    for (int i = 0; i < o.copies; ++i) a.peer_copy(dst, 1, src, 0, o.copy_bytes, r.s_[1]);
  } catch (const std::exception& e) {
    r.fail(std::string("peer_copy: ") + e.what());
    return;
  }
  if (!r.step(r.d_.event_record(1, r.done_, r.s_[1]), "event_record")) return;
  r.rep_.pending_before_change = r.d_.event_query(r.done_) == Result::not_ready;

  r.change([&] { a.set_peer_policy(PeerPolicy::none); });
  r.aftermath();
  if (!r.fenced_) return;

  std::uint32_t word = 0;
  std::memset(&word, 0x5a, sizeof word);
  r.verify(
      r.k_.count_mismatches(r.d_, 1, r.s_[1], dp(dst), word, o.copy_bytes / 4, &r.rep_.mismatches),
      "check on device 1");
  // The allocator enabled context peer access; leaving global must undo it.
  const Result left = r.d_.disable_peer_access(1, 0);
  r.verify_that(left == Result::peer_access_not_enabled,
                "context peer access 1 -> 0 after leaving global: cuCtxDisablePeerAccess says " +
                    vmm::result_name(left) + " (expected CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)");
  a.deallocate(src, o.copy_bytes, 0, r.s_[0]);
  a.deallocate(dst, o.copy_bytes, 1, r.s_[1]);
}

// --- trim_during_peer_kernel ------------------------------------------------
void trim_during_peer_kernel(Run& r, const PeerHazardOptions& o) {
  Config c = config_for(r.fenced_);
  c.scratch_chunk_bytes = o.read_bytes;  // the block is exactly one chunk
  if (!r.open(c)) return;
  Allocator& a = *r.a_;
  if (a.peer_policy(0, 1) == PeerPolicy::none) {
    r.fail("devices 0 and 1 have no P2P path");
    return;
  }
  void* p = nullptr;
  try {
    p = a.scratch_allocate(o.read_bytes, 0, r.s_[0]);
  } catch (const std::exception& e) {
    r.fail(std::string("scratch_allocate: ") + e.what());
    return;
  }
  const std::size_t n = o.read_bytes / 4;
  if (!r.step(r.k_.fill(0, r.s_[0], dp(p), kPattern, n), "fill on device 0") ||
      !r.step(r.d_.stream_synchronize(0, r.s_[0]), "stream_synchronize(device 0)") ||
      !r.start_spin(dp(p), o.read_bytes, o))
    return;
  a.record_stream(p, r.s_[1], 1);
  // The free is ordered after the peer's read, as any caller must order it;
  // only the unmap that trim() does would outrun it.
  if (!r.step(r.d_.stream_wait_event(0, r.s_[0], r.done_), "stream_wait_event")) return;
  a.deallocate(p, o.read_bytes, 0, r.s_[0]);
  r.rep_.pending_before_change = r.d_.event_query(r.done_) == Result::not_ready;

  r.change([&] { a.trim(0); });
  r.aftermath();
  if (!r.fenced_) return;
  const std::size_t left = a.device_stats(0).scratch_reserved_bytes;
  r.verify_that(left == 0, "trim(0) left " + std::to_string(left) + " bytes of scratch mapped");
}

// --- peer_reads_private_block -----------------------------------------------
void peer_reads_private_block(Run& r, const PeerHazardOptions& o) {
  if (r.fenced_) {
    r.fail("peer_reads_private_block has no fenced form: the read is never allowed");
    return;
  }
  if (!r.open(config_for(false))) return;
  Allocator& a = *r.a_;
  void* q = nullptr;
  try {
    q = a.allocate(o.read_bytes, 0, r.s_[0]);
  } catch (const std::exception& e) {
    r.fail(std::string("allocate: ") + e.what());
    return;
  }
  const std::size_t n = o.read_bytes / 4;
  Access acc = Access::read_write;
  if (!r.step(r.k_.fill(0, r.s_[0], dp(q), kPattern, n), "fill on device 0") ||
      !r.step(r.d_.stream_synchronize(0, r.s_[0]), "stream_synchronize(device 0)") ||
      !r.step(r.d_.mem_get_access(dp(q), 1, &acc), "mem_get_access"))
    return;
  r.rep_.peer_access = vmm::access_name(acc);
  // The "change" here is the read itself: a kernel on device 1 over memory
  // it was never granted. (The simulator refuses it at launch; the GPU
  // faults while it runs.)
  r.rep_.change = r.k_.check(1, r.s_[1], dp(q), kPattern, n, r.sink_);
  if (r.rep_.change == Result::success)
    r.rep_.pending_before_change = r.d_.event_record(1, r.done_, r.s_[1]) == Result::success &&
                                   r.d_.event_query(r.done_) == Result::not_ready;
  r.aftermath();
}

}  // namespace

bool PeerHazardReport::sticky() const noexcept {
  return vmm::is_sticky(change) || vmm::is_sticky(sync) || vmm::is_sticky(later);
}

const char* peer_hazard_name(PeerHazard h) noexcept {
  switch (h) {
    case PeerHazard::switch_during_peer_kernel: return "switch_during_peer_kernel";
    case PeerHazard::global_switch_during_peer_copy: return "global_switch_during_peer_copy";
    case PeerHazard::trim_during_peer_kernel: return "trim_during_peer_kernel";
    case PeerHazard::peer_reads_private_block: return "peer_reads_private_block";
  }
  return "?";
}

bool parse_peer_hazard(const std::string& name, PeerHazard* h) noexcept {
  for (PeerHazard c :
       {PeerHazard::switch_during_peer_kernel, PeerHazard::global_switch_during_peer_copy,
        PeerHazard::trim_during_peer_kernel, PeerHazard::peer_reads_private_block}) {
    if (name == peer_hazard_name(c)) {
      *h = c;
      return true;
    }
  }
  return false;
}

PeerHazardReport run_peer_hazard(vmm::TestDriver& driver, DeviceKernels& kernels, PeerHazard hazard,
                                 bool fenced, const PeerHazardOptions& options) {
  PeerHazardReport rep;
  int count = 0;
  if (Result r = driver.device_count(&count); r != Result::success || count < 2) {
    rep.setup_error = "needs 2 devices, the driver shows " + std::to_string(count);
    return rep;
  }
  {
    // Scoped: Run's destructor adds to the report before it is returned.
    Run run(driver, kernels, fenced, rep);
    try {
      switch (hazard) {
        case PeerHazard::switch_during_peer_kernel: switch_during_peer_kernel(run, options); break;
        case PeerHazard::global_switch_during_peer_copy:
          global_switch_during_peer_copy(run, options);
          break;
        case PeerHazard::trim_during_peer_kernel: trim_during_peer_kernel(run, options); break;
        case PeerHazard::peer_reads_private_block: peer_reads_private_block(run, options); break;
      }
    } catch (const std::exception& e) {
      // An allocator call outside the change itself (a deallocate, record_stream).
      run.verify_that(false, std::string("unexpected error: ") + e.what());
    }
  }
  return rep;
}

void print_peer_report(std::ostream& out, PeerHazard hazard, bool fenced,
                       const PeerHazardReport& r) {
  out << "scenario=" << peer_hazard_name(hazard) << "\n";
  out << "fenced=" << (fenced ? "yes" : "no") << "\n";
  if (!r.setup_error.empty()) {
    out << "setup_error=" << r.setup_error << "\n";
    return;
  }
  out << "policy=" << r.policy << "\n";
  out << "busy_device=1\n";
  if (r.spin_iterations != 0) out << "spin_iterations=" << r.spin_iterations << "\n";
  if (!r.peer_access.empty()) out << "peer_access=" << r.peer_access << "\n";
  out << "pending_before_change=" << (r.pending_before_change ? "yes" : "no") << "\n";
  out << "change=" << vmm::result_name(r.change) << "\n";
  if (!r.change_error.empty()) out << "change_error=" << r.change_error << "\n";
  out << "sync=" << vmm::result_name(r.sync) << "\n";
  out << "later=" << vmm::result_name(r.later) << "\n";
  out << "sticky=" << (r.sticky() ? "yes" : "no") << "\n";
  out << "cuCtxEnablePeerAccess_calls=" << r.enable_peer_calls << "\n";
  if (fenced) {
    out << "verify=" << vmm::result_name(r.verify) << "\n";
    if (!r.verify_error.empty()) out << "verify_error=" << r.verify_error << "\n";
    out << "mismatches=" << r.mismatches << "\n";
  }
}

}  // namespace gvm::test
