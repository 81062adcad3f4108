// What a CUDA graph capture forbids, call by call: the one table SimDriver
// follows (sim_capture.cpp applies it).
//
// A row reads: while a capture is under way, `call` under condition `when`
// answers `result`, changes nothing else, and with `invalidates` the capture
// the condition names fails (stream_capture_status says invalidated, the end
// of the capture answers stream_capture_invalidated). For each call the
// first row whose condition holds decides; a call with no row that holds runs
// as usual. Work put on a capturing stream (copies, fills, kernels, event
// records) is captured, not run: it leaves nothing pending (sim_capture.cpp).
//
// The conditions:
//   unsafe            the CUDA rule for "potentially unsafe" calls: the calling
//                     thread has a capture under way not begun in relaxed
//                     mode, or another thread has one begun in global mode
//   stream_capturing  the call's stream takes part in a capture (any mode)
//   device_capturing  a capture is under way on the call's device (any mode)
//   event_captured    the call's event was last recorded inside a capture
//                     still under way (any mode)
//   waits_across      a capturing stream waits for an event recorded outside
//                     its capture
//
// Measured: tools/gvm-driver-probe on one H200 (driver 580.159.04, CUDA 13.0,
// 2026-12-01), every call of its part 2 in each capture mode, the capture
// begun on the calling thread and on another one. Its table is kept in
// tests/unit/data/probe_h200_capture.txt; the CTest
// gvm_driver_probe_sim_matches_h200 runs `gvm-driver-probe --sim` and fails,
// naming the row, where the simulator answers a row otherwise. Rows marked
// "not probed" are guesses (the probe does not make that call, or not in that
// state); they refuse, so that the allocator is shown not to make the call.
#pragma once

#include "gvm/vmm/driver.hpp"

namespace gvm::vmm::sim {

enum class When : int { unsafe, stream_capturing, device_capturing, event_captured, waits_across };

struct CaptureRule {
  Call call;
  When when;
  Result result;
  bool invalidates;
};

inline constexpr Result kUnsupported = Result::stream_capture_unsupported;

// clang-format off
inline constexpr CaptureRule kCaptureRules[] = {
  // --- memory ---------------------------------------------------------------------
  // The VMM calls (reserve, free, create, release, map, unmap, set access) and
  // cuMemGetInfo are allowed in every mode, on every thread: no row.
  {Call::mem_alloc,            When::unsafe,            kUnsupported, true},
  {Call::mem_free,             When::unsafe,            kUnsupported, true},
  {Call::enable_peer_access,   When::unsafe,            kUnsupported, true},  // not probed
  {Call::disable_peer_access,  When::unsafe,            kUnsupported, true},  // not probed
  // --- completion and synchronization -----------------------------------------------
  // An event recorded inside the capture conflicts with it in every mode, on
  // every thread, and the capture fails.
  {Call::event_query,          When::event_captured,    Result::captured_event, true},
  {Call::event_query,          When::unsafe,            kUnsupported, true},
  {Call::event_synchronize,    When::event_captured,    Result::captured_event, true},
  {Call::event_synchronize,    When::unsafe,            kUnsupported, true},
  {Call::stream_synchronize,   When::stream_capturing,  kUnsupported, true},
  {Call::stream_synchronize,   When::unsafe,            kUnsupported, true},
  {Call::ctx_synchronize,      When::device_capturing,  kUnsupported, true},
  // Of another device than the capture's: not probed.
  {Call::ctx_synchronize,      When::unsafe,            kUnsupported, true},
  {Call::stream_wait_event,    When::waits_across,      Result::stream_capture_isolation, true},
  // --- streams ------------------------------------------------------------------------
  // cuStreamGetId of the capturing stream, in every mode (of another
  // stream, the legacy one included: allowed).
  {Call::stream_get_id,        When::stream_capturing,  kUnsupported, true},
  {Call::stream_destroy,       When::stream_capturing,  kUnsupported, true},  // not probed
  // --- test calls -------------------------------------------------------------------
  // cuMemcpyHtoD is allowed in every mode: no row.
  {Call::memcpy_dtoh,          When::unsafe,            kUnsupported, true},  // not probed
  // Allowed in every mode (no row): device queries, the capture status,
  // event create/destroy, cuEventRecord (on a capturing stream it is
  // captured), stream create, destroy of a stream not capturing, copies and
  // fills on any stream. cuStreamEndCapture on another thread than the one
  // that began a global capture: sim_capture.cpp.
};
// clang-format on

}  // namespace gvm::vmm::sim
