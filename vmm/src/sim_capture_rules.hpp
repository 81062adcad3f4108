// What a CUDA graph capture forbids, call by call: the one table SimDriver
// follows (sim_capture.cpp applies it). Adjust it here from the output of
// tools/gvm-driver-probe (its part 2 prints, for each call and capture mode,
// what the real driver answered and whether the capture survived).
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
// Until the probe has run on a GPU these rows are a conservative guess: every
// call that changes memory, synchronizes or asks whether work is done is
// refused as unsafe, so the allocator is proven not to make it during a
// capture. Rows marked "documented" follow cuda.h: cudaMalloc is its example
// of an unsafe call; an event query on an event recorded inside a capture
// "necessarily conflicts" with it in every mode.
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
  // --- memory: guesses until probed -------------------------------------------------
  {Call::address_reserve,      When::unsafe,            kUnsupported, true},
  {Call::address_free,         When::unsafe,            kUnsupported, true},
  {Call::mem_create,           When::unsafe,            kUnsupported, true},
  {Call::mem_release,          When::unsafe,            kUnsupported, true},
  {Call::mem_map,              When::unsafe,            kUnsupported, true},
  {Call::mem_unmap,            When::unsafe,            kUnsupported, true},
  {Call::mem_set_access,       When::unsafe,            kUnsupported, true},
  {Call::mem_get_info,         When::unsafe,            kUnsupported, true},
  {Call::mem_alloc,            When::unsafe,            kUnsupported, true},  // documented
  {Call::mem_free,             When::unsafe,            kUnsupported, true},
  {Call::enable_peer_access,   When::unsafe,            kUnsupported, true},
  {Call::disable_peer_access,  When::unsafe,            kUnsupported, true},
  // --- completion and synchronization -----------------------------------------------
  // documented: an event recorded inside a capture conflicts with it in any mode
  {Call::event_query,          When::event_captured,    Result::captured_event, false},
  {Call::event_query,          When::unsafe,            kUnsupported, true},
  {Call::event_synchronize,    When::event_captured,    Result::captured_event, false},
  {Call::event_synchronize,    When::unsafe,            kUnsupported, true},
  {Call::stream_synchronize,   When::stream_capturing,  kUnsupported, true},
  {Call::stream_synchronize,   When::unsafe,            kUnsupported, true},
  {Call::ctx_synchronize,      When::device_capturing,  kUnsupported, true},
  {Call::ctx_synchronize,      When::unsafe,            kUnsupported, true},
  {Call::stream_wait_event,    When::waits_across,      Result::stream_capture_isolation, true},
  // --- test calls -------------------------------------------------------------------
  {Call::stream_destroy,       When::stream_capturing,  kUnsupported, true},
  {Call::memcpy_htod,          When::unsafe,            kUnsupported, true},
  {Call::memcpy_dtoh,          When::unsafe,            kUnsupported, true},
  // Allowed in every mode (no row): device queries, cuStreamGetId, the capture
  // status, event create/destroy, cuEventRecord (on a capturing stream it is
  // captured), stream create, copies and fills on any stream.
};
// clang-format on

}  // namespace gvm::vmm::sim
