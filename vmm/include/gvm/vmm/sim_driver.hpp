// SimDriver: the CUDA driver simulated on the CPU, for tests and trace replay.
//
// It keeps the driver's bookkeeping (reservations, physical handles, mappings,
// per-device access, peer access, streams, events) and returns the result the
// real driver returns for each misuse, so allocator logic can be proven on a
// machine with no GPU. Physical memory is metadata only unless backing is
// enabled, so a simulated 141 GiB device costs no RAM.
//
// It refuses what the real driver refuses and decides nothing the real one
// would decide otherwise; where the real driver's behaviour is undefined it
// fails loudly instead of carrying on.
//
// Hazards (docs/measurements.md "Hazards"). Work on a stream is modelled as
// pending accesses to address ranges: enqueue_access() stands for a kernel,
// and the copy entry points register their reads and writes. Nothing runs by
// itself: an access stays pending until something synchronizes it (stream,
// event, context, complete_all()). While an access is pending:
//   - revoking the accessing device's access to the range (cuMemSetAccess
//     with PROT_NONE), unmapping the range or cuMemFree of it kills the
//     context with illegal_address, as measured for a revoke under a reading
//     kernel (cuMemFree is no implicit synchronization here);
//   - disabling global peer access from the accessing device to the device
//     that owns the memory kills it with launch_failed ("unspecified launch
//     failure", as measured for a toggle under a queued peer copy);
//   - on a device below compute capability 8.0 (P40, V100, T4), where the
//     driver emulates per-range peer access with the global toggle
//     (docs/peer-access.md), any cuMemSetAccess that changes peer D's access
//     to a range of owner O kills it with launch_failed while D has work on
//     any memory of O in flight, and costs a toggle (simulated_ns()).
// An access the device has no right to at enqueue time (unmapped, not granted,
// classic memory of a peer without peer access) kills it with
// illegal_address. A dead context is sticky: every later driver call returns
// the same error (one context for the whole simulation: stricter than the real
// driver, which may keep other devices usable). Work pending at that moment is
// dropped, as it is on a real dead context.
//
// Stream order is tracked with vector clocks: two overlapping accesses on
// different streams, at least one a write, race unless the later one's stream
// waited (through events, transitively) for the earlier one. Races are
// recorded (races()), not fatal: they are what the allocator's stream-order
// logic must never produce.
//
// Copies. cuMemcpyAsync runs on its stream's device, which must reach both
// ranges itself: VMM memory that device was not granted (or was revoked
// from) is invalid_value, validated up front, as the real driver answers;
// classic memory of a peer without peer access is staged. cuMemcpyPeerAsync
// stages whatever dst_device cannot reach through its owner; its stream must
// be a stream of dst_device (invalid_handle otherwise), nullptr being
// dst_device's legacy stream, as the Driver interface says.
//
// Streams. Handles are recycled as the real driver's are: the next
// cuStreamCreate gets the most recently destroyed handle back (last in, first
// out), with a new id (stream_get_id). A destroyed handle that has not come
// back is dead: any call with it records a misuse report (misuse()) and kills
// the context with context_is_destroyed, what an H200 answered to a
// cuEventRecord on a destroyed stream (docs/measurements.md). Work still
// pending on a destroyed stream stays pending until synchronized.
//
// Capture (stream_begin_capture .. stream_end_capture). Work put on a
// capturing stream goes into the graph and does not run: it leaves nothing
// pending and moves no data. What a capture forbids, in which mode, on which
// thread, and whether the capture fails for it is one table,
// vmm/src/sim_capture_rules.hpp, set from tools/gvm-driver-probe.
//
// Simplifications, all deliberate:
//   - One mutex around everything; any thread may call anything.
//   - Streams from stream_create behave as non-blocking streams: the legacy
//     default stream (nullptr) has no implicit barrier with them.
//     CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2) are both taken as
//     the legacy default stream of the device named in the call.
//   - Copies move their data at enqueue time (when backing is on); hazards
//     are tracked separately, on the pending accesses.
//   - Synchronous copies (memcpy_htod/dtoh) are ordered on the legacy stream
//     and complete on return; an unmapped range is invalid_value (validated
//     up front), not a dead context.
//   - A shareable handle holds no reference: importing the fd (or fabric
//     handle) of an allocation that has been fully released fails. A posix_fd
//     export writes a fake descriptor, never a real one; fabric handles are
//     64 bytes (CUmemFabricHandle).
//   - Modules and kernel launches return not_supported: tests enqueue
//     accesses instead.
//   - Destroyed events are not tracked: using one is invalid_handle.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gvm/vmm/test_driver.hpp"

namespace gvm::vmm {

// The GPUs the simulator can pretend to be (each one's caps: vmm/src/sim_profiles.cpp).
enum class Profile : int { p40, v100, t4, a100, l4, h100, h200, b200 };

inline constexpr std::array<Profile, 8> kAllProfiles = {Profile::p40,  Profile::v100, Profile::t4,
                                                        Profile::a100, Profile::l4,   Profile::h100,
                                                        Profile::h200, Profile::b200};

// What one simulated device reports. Fields mirror DeviceCaps.
struct DeviceProfile {
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  std::size_t memory_bytes = 0;
  bool vmm = true;  // false: the VMM calls return not_supported (old driver, some vGPUs)
  bool posix_fd_handles = true;
  bool fabric_handles = false;
  bool compression = false;
  std::size_t granularity = std::size_t{2} << 20;  // 2 MiB on every GPU we know
  std::size_t recommended_granularity = std::size_t{2} << 20;
  int multiprocessor_count = 0;
};

// The published figures of `p` ("NVIDIA H200", sm_90, 141 GiB, 132 SMs, ...).
DeviceProfile profile(Profile p);
// "p40", "h200", ...
const char* profile_name(Profile p) noexcept;
// The inverse of profile_name. Throws std::invalid_argument naming the text.
Profile parse_profile(std::string_view name);

class SimDriver final : public TestDriver {
 public:
  // Throws std::invalid_argument for a profile with no memory or a
  // granularity that is not a power of two.
  explicit SimDriver(std::vector<DeviceProfile> devices);
  // `count` devices of profile `p`, every pair peer-capable.
  static std::unique_ptr<SimDriver> uniform(Profile p, int count);
  ~SimDriver() override;

  const char* name() const noexcept override { return "sim"; }

  // --- configuration (call before use; throws std::invalid_argument) -------
  // cuDeviceCanAccessPeer(a, b); every distinct pair is true by default.
  void set_peer(int a, int b, bool can);
  // Physical bytes `device` may hand out (default: its memory size). Lowering
  // it below what is in use makes the next create fail; nothing is evicted.
  void set_physical_budget(int device, std::size_t bytes);
  // With backing, mapped memory holds data (64 KiB host pages, allocated on
  // first write; never-written bytes read as zero). Without it, copies only
  // validate and register accesses, and memcpy_dtoh writes zeros.
  void enable_backing(bool on);
  // With auto-complete, an event_query completes the work before the event
  // (as if the GPU had caught up) instead of answering not_ready.
  void set_auto_complete(bool on);

  // --- fault injection ------------------------------------------------------
  // The nth next call (1 = the very next) of `call` returns `result` and
  // changes nothing. Every invocation counts, including ones that fail anyway.
  // Several may be pending for one call. Throws std::invalid_argument for
  // nth < 1 or result == success.
  void fail_call(Call call, int nth, Result result);
  // Every call of `call` returns `result` until clear_faults().
  void fail_every_call(Call call, Result result);
  void clear_faults();

  // --- hazards --------------------------------------------------------------
  // A kernel on `device`'s `stream` touching [addr, addr + bytes): checks the
  // device's right to the range (else the context dies with illegal_address),
  // records races with unordered pending accesses of other streams, and
  // leaves the access pending. Returns the sticky error once the context is
  // dead, invalid_device / invalid_handle / invalid_value for bad arguments.
  Result enqueue_access(int device, StreamHandle stream, DevicePtr addr, std::size_t bytes,
                        AccessKind kind);
  // success while the context is healthy, else the error that killed it.
  Result sticky_error() const;
  // Revives the context (tests only).
  void clear_sticky();
  // Completes every pending access, as if every device had been synchronized.
  void complete_all();
  std::size_t pending_accesses() const;
  // One line per race: both accesses, their streams and devices.
  std::vector<std::string> races() const;
  std::size_t race_count() const;
  void clear_races();

  // --- counters for leak checks ---------------------------------------------
  std::size_t live_reservations() const;
  // Physical allocations still alive: not yet released, or released but
  // still mapped (the driver defers the release until the unmap).
  std::size_t live_handles() const;
  std::size_t live_mappings() const;
  std::size_t live_events() const;
  // Streams from stream_create not yet destroyed (legacy streams not counted).
  std::size_t live_streams() const;
  std::size_t live_classic_allocations() const;
  // Physical bytes in use on `device` (handles and classic allocations).
  std::size_t physical_used(int device) const;
  // Invocations of `call` so far, failed ones included.
  std::uint64_t call_count(Call call) const;
  const DeviceProfile& device_profile(int device) const;

  // Misuse the real driver does not answer with an error but with undefined
  // behaviour (so far: a destroyed stream handle used again), one line each.
  // Each also killed the context with context_is_destroyed.
  std::vector<std::string> misuse() const;
  std::size_t misuse_count() const;
  void clear_misuse();

  // --- simulated time ---------------------------------------------------------
  // What the calls of `call` so far would have cost on a GPU (sim_costs.hpp:
  // the measured medians, 0 where nothing was measured), and all of them.
  std::uint64_t simulated_ns(Call call) const;
  std::uint64_t simulated_ns_total() const;
  // Peer access changes a pre-Ampere driver made with the global toggle: one
  // per peer whose access to an owner's range a cuMemSetAccess changed.
  std::uint64_t emulated_peer_toggles() const;

  // --- Driver and TestDriver --------------------------------------------------
#define GVM_VMM_SIM_DECLARE(name, cu_name, params, args) Result name params override;
  GVM_VMM_DRIVER_CALLS(GVM_VMM_SIM_DECLARE)
  GVM_VMM_TEST_CALLS(GVM_VMM_SIM_DECLARE)
#undef GVM_VMM_SIM_DECLARE

  struct State;  // sim_state.hpp

 private:
  std::unique_ptr<State> s_;
};

}  // namespace gvm::vmm
