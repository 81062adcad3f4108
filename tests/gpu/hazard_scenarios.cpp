#include "hazard_scenarios.hpp"

#include <cstddef>
#include <cstring>
#include <vector>

#include "test_kernels.hpp"

namespace gvm::test {

using vmm::AccessDesc;
using vmm::DevicePtr;
using vmm::TestDriver;
using vmm::Result;
using vmm::StreamHandle;

namespace {

constexpr std::uint32_t kPattern = 0x5a17c0deu;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// Sizes from docs/measurements.md ("Bandwidth"): a peer copy runs at ~396 GB/s on H200 NVLink,
// so 20 x 256 MiB keep the copy engine busy ~13 ms, thousands of times longer
// than the few microseconds between queueing them and the disable.
constexpr std::size_t kCopyBytes = 256 * kMiB;
constexpr int kCopies = 20;
// The kernels read 64 MiB per pass; the pass count is calibrated so the
// kernel runs for kSpinSeconds (unfenced) whatever the GPU and link.
constexpr std::size_t kReadBytes = 64 * kMiB;
constexpr double kSpinSeconds = 1.0;
constexpr double kFencedSpinSeconds = 0.2;

// Collects the first failure of setup steps into setup_error.
struct Setup {
  HazardReport& report;
  bool step(Result r, const char* what) {
    if (r == Result::success || !report.setup_error.empty()) return report.setup_error.empty();
    report.setup_error = std::string(what) + " failed: " + vmm::result_name(r);
    return false;
  }
};

bool enable_peer(TestDriver& d, int device, int peer, Setup& s, const char* what) {
  Result r = d.enable_peer_access(device, peer);
  if (r == Result::peer_access_already_enabled) r = Result::success;
  return s.step(r, what);
}

Result fence_both(TestDriver& d) {
  Result a = d.ctx_synchronize(0);
  Result b = d.ctx_synchronize(1);
  return a != Result::success ? a : b;
}

Result later_call(TestDriver& d, int device) {
  DevicePtr p = 0;
  Result r = d.mem_alloc(device, 2 * kMiB, &p);
  if (r == Result::success) (void)d.mem_free(device, p);
  return r;
}

bool pending(TestDriver& d, vmm::EventHandle e) {
  return d.event_query(e) == Result::not_ready;
}

// --- peer_disable_during_copy -------------------------------------------
HazardReport copy_scenario(TestDriver& d, bool fenced) {
  HazardReport rep;
  Setup s{rep};
  rep.busy_device = 0;
  TestKernels k1;
  DevicePtr src = 0, dst = 0;
  StreamHandle stream = nullptr;  // on device 0: memcpy_peer_async runs in the source's context
  vmm::EventHandle done = nullptr;
  if (!s.step(k1.load(d, 1), "loading the kernels on device 1") ||
      !s.step(d.mem_alloc(0, kCopyBytes, &src), "mem_alloc on device 0") ||
      !s.step(d.mem_alloc(1, kCopyBytes, &dst), "mem_alloc on device 1") ||
      !s.step(d.memset_d8_async(0, src, 0x5a, kCopyBytes, nullptr), "memset on device 0") ||
      !s.step(d.memset_d8_async(1, dst, 0, kCopyBytes, nullptr), "memset on device 1") ||
      !s.step(fence_both(d), "synchronizing after setup") ||
      !s.step(d.stream_create(0, &stream), "stream_create on device 0") ||
      !s.step(d.event_create(0, &done), "event_create on device 0") ||
      !enable_peer(d, 0, 1, s, "enable_peer_access(0 -> 1)") ||
      !enable_peer(d, 1, 0, s, "enable_peer_access(1 -> 0)"))
    return rep;

  for (int i = 0; i < kCopies; ++i)
    if (!s.step(d.memcpy_peer_async(dst, 1, src, 0, kCopyBytes, stream), "memcpy_peer_async"))
      return rep;
  if (!s.step(d.event_record(0, done, stream), "event_record")) return rep;
  rep.pending_before_change = pending(d, done);

  if (fenced) rep.fence = fence_both(d);
  Result a = d.disable_peer_access(0, 1);
  Result b = d.disable_peer_access(1, 0);
  rep.change = a != Result::success ? a : b;
  rep.sync = d.stream_synchronize(0, stream);
  rep.later = later_call(d, 0);
  if (!fenced) return rep;  // the context is broken: leave everything to process exit

  // The copied bytes are 0x5a in every byte: check them as words on device 1.
  std::uint32_t word = 0;
  std::memset(&word, 0x5a, sizeof word);
  rep.verify = k1.count_mismatches(nullptr, dst, word, kCopyBytes / 4, &rep.mismatches);
  (void)d.event_destroy(done);
  (void)d.stream_destroy(0, stream);
  (void)d.mem_free(0, src);
  (void)d.mem_free(1, dst);
  return rep;
}

// --- peer_disable_during_kernel -----------------------------------------
HazardReport kernel_scenario(TestDriver& d, bool fenced) {
  HazardReport rep;
  Setup s{rep};
  rep.busy_device = 1;
  TestKernels k0, k1;
  DevicePtr src = 0, sink = 0;
  StreamHandle stream = nullptr;
  vmm::EventHandle done = nullptr;
  const std::size_t n = kReadBytes / 4;
  if (!s.step(k0.load(d, 0), "loading the kernels on device 0") ||
      !s.step(k1.load(d, 1), "loading the kernels on device 1") ||
      !s.step(d.mem_alloc(0, kReadBytes, &src), "mem_alloc on device 0") ||
      !s.step(d.mem_alloc(1, 4, &sink), "mem_alloc on device 1") ||
      !s.step(k0.fill(nullptr, src, kPattern, n), "fill on device 0") ||
      !s.step(fence_both(d), "synchronizing after setup") ||
      !s.step(d.stream_create(1, &stream), "stream_create on device 1") ||
      !s.step(d.event_create(1, &done), "event_create on device 1") ||
      !enable_peer(d, 1, 0, s, "enable_peer_access(1 -> 0)") ||
      !s.step(k1.calibrate_spin(stream, src, n, fenced ? kFencedSpinSeconds : kSpinSeconds,
                                &rep.spin_iterations),
              "calibrating spin_read on device 1 over device 0's memory"))
    return rep;

  if (!s.step(k1.spin_read(stream, src, n, rep.spin_iterations, sink), "spin_read launch") ||
      !s.step(d.event_record(1, done, stream), "event_record"))
    return rep;
  rep.pending_before_change = pending(d, done);

  if (fenced) rep.fence = fence_both(d);
  rep.change = d.disable_peer_access(1, 0);
  rep.sync = d.stream_synchronize(1, stream);
  rep.later = later_call(d, 1);
  if (!fenced) return rep;

  // Device 0's memory is intact and device 0 still works.
  rep.verify = k0.count_mismatches(nullptr, src, kPattern, n, &rep.mismatches);
  (void)d.event_destroy(done);
  (void)d.stream_destroy(1, stream);
  (void)d.mem_free(0, src);
  (void)d.mem_free(1, sink);
  return rep;
}

// --- revoke_during_read --------------------------------------------------
HazardReport revoke_scenario(TestDriver& d, bool fenced) {
  HazardReport rep;
  Setup s{rep};
  rep.busy_device = 1;
  TestKernels k0, k1;
  std::size_t granule = 0;
  DevicePtr base = 0, sink = 0;
  vmm::PhysHandle handle = 0;
  StreamHandle stream = nullptr;
  vmm::EventHandle done = nullptr;
  if (!s.step(d.allocation_granularity(0, vmm::GranularityKind::minimum, &granule),
              "allocation_granularity on device 0"))
    return rep;
  const std::size_t size = (kReadBytes + granule - 1) / granule * granule;
  const std::size_t n = size / 4;
  const AccessDesc both[] = {{0, vmm::Access::read_write}, {1, vmm::Access::read_write}};
  if (!s.step(k0.load(d, 0), "loading the kernels on device 0") ||
      !s.step(k1.load(d, 1), "loading the kernels on device 1") ||
      !s.step(d.address_reserve(size, granule, &base), "address_reserve") ||
      !s.step(d.mem_create(0, size, vmm::ShareableHandleType::none, &handle),
              "mem_create on device 0") ||
      !s.step(d.mem_map(base, size, handle), "mem_map") ||
      !s.step(d.mem_set_access(base, size, both, 2), "mem_set_access(device 0 and 1)") ||
      !s.step(d.mem_alloc(1, 4, &sink), "mem_alloc on device 1") ||
      !s.step(k0.fill(nullptr, base, kPattern, n), "fill on device 0") ||
      !s.step(fence_both(d), "synchronizing after setup") ||
      !s.step(d.stream_create(1, &stream), "stream_create on device 1") ||
      !s.step(d.event_create(1, &done), "event_create on device 1") ||
      !s.step(k1.calibrate_spin(stream, base, n, fenced ? kFencedSpinSeconds : kSpinSeconds,
                                &rep.spin_iterations),
              "calibrating spin_read on device 1 over the granted range"))
    return rep;

  if (!s.step(k1.spin_read(stream, base, n, rep.spin_iterations, sink), "spin_read launch") ||
      !s.step(d.event_record(1, done, stream), "event_record"))
    return rep;
  rep.pending_before_change = pending(d, done);

  if (fenced) rep.fence = fence_both(d);
  // A revoke names the peer: setting access for the owner alone would not
  // take the peer's access away (docs/measurements.md, "Hazards").
  const AccessDesc revoke[] = {{1, vmm::Access::none}};
  rep.change = d.mem_set_access(base, size, revoke, 1);
  rep.sync = d.stream_synchronize(1, stream);
  rep.later = later_call(d, 1);
  if (!fenced) return rep;

  vmm::Access peer_access = vmm::Access::read_write;
  rep.verify = d.mem_get_access(base, 1, &peer_access);
  if (rep.verify == Result::success && peer_access != vmm::Access::none)
    rep.verify = Result::unknown;  // the revoke did not take
  if (rep.verify == Result::success)
    rep.verify = k0.count_mismatches(nullptr, base, kPattern, n, &rep.mismatches);
  (void)d.event_destroy(done);
  (void)d.stream_destroy(1, stream);
  (void)d.mem_free(1, sink);
  (void)d.mem_unmap(base, size);
  (void)d.mem_release(handle);
  (void)d.address_free(base, size);
  return rep;
}

}  // namespace

const char* hazard_name(Hazard h) noexcept {
  switch (h) {
    case Hazard::peer_disable_during_copy: return "peer_disable_during_copy";
    case Hazard::peer_disable_during_kernel: return "peer_disable_during_kernel";
    case Hazard::revoke_during_read: return "revoke_during_read";
  }
  return "?";
}

bool parse_hazard(const std::string& name, Hazard* h) noexcept {
  for (Hazard c : {Hazard::peer_disable_during_copy, Hazard::peer_disable_during_kernel,
                   Hazard::revoke_during_read}) {
    if (name == hazard_name(c)) {
      *h = c;
      return true;
    }
  }
  return false;
}

HazardReport run_hazard(TestDriver& driver, Hazard hazard, bool fenced) {
  int count = 0;
  if (Result r = driver.device_count(&count); r != Result::success || count < 2) {
    HazardReport rep;
    rep.setup_error = "needs 2 devices, the driver shows " + std::to_string(count);
    return rep;
  }
  bool p10 = false, p01 = false;
  if (driver.can_access_peer(1, 0, &p10) != Result::success ||
      driver.can_access_peer(0, 1, &p01) != Result::success || !p10 || !p01) {
    HazardReport rep;
    rep.setup_error = "devices 0 and 1 cannot access each other (no P2P path)";
    return rep;
  }
  switch (hazard) {
    case Hazard::peer_disable_during_copy: return copy_scenario(driver, fenced);
    case Hazard::peer_disable_during_kernel: return kernel_scenario(driver, fenced);
    case Hazard::revoke_during_read: return revoke_scenario(driver, fenced);
  }
  HazardReport rep;
  rep.setup_error = "unknown scenario";
  return rep;
}

void print_report(std::ostream& out, Hazard hazard, bool fenced, const HazardReport& r) {
  out << "scenario=" << hazard_name(hazard) << "\n";
  out << "fenced=" << (fenced ? "yes" : "no") << "\n";
  if (!r.setup_error.empty()) {
    out << "setup_error=" << r.setup_error << "\n";
    return;
  }
  out << "busy_device=" << r.busy_device << "\n";
  if (r.spin_iterations != 0) out << "spin_iterations=" << r.spin_iterations << "\n";
  out << "pending_before_change=" << (r.pending_before_change ? "yes" : "no") << "\n";
  if (fenced) out << "fence=" << vmm::result_name(r.fence) << "\n";
  out << "change=" << vmm::result_name(r.change) << "\n";
  out << "sync=" << vmm::result_name(r.sync) << "\n";
  out << "later=" << vmm::result_name(r.later) << "\n";
  out << "sticky=" << (vmm::is_sticky(r.sync) || vmm::is_sticky(r.later) ? "yes" : "no") << "\n";
  if (fenced) {
    out << "verify=" << vmm::result_name(r.verify) << "\n";
    out << "mismatches=" << r.mismatches << "\n";
  }
}

}  // namespace gvm::test
