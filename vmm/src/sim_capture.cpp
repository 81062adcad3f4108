// SimDriver: stream capture. Begin, end and status, the rules of
// sim_capture_rules.hpp, and what happens to work put on a capturing stream.
//
// Simplifications: a capture's graph is not kept (nothing can launch it);
// streams joined into a capture through an event wait (a fork) leave it at
// its end without the unjoined-work check the real driver makes, and a stream
// of one capture waiting for an event of another is not refused (the real
// driver's CUDA_ERROR_STREAM_CAPTURE_MERGE); the calling
// thread's capture interaction mode is always global (cuThreadExchange-
// StreamCaptureMode is not simulated).
#include <string>
#include <thread>
#include <vector>

#include "sim_capture_rules.hpp"
#include "sim_state.hpp"

namespace gvm::vmm {

sim::Capture* SimDriver::State::capture_of(const sim::Stream& s) {
  if (s.capture == 0) return nullptr;
  auto it = captures.find(s.capture);
  return it == captures.end() ? nullptr : &it->second;
}

Result SimDriver::State::capture_work(const sim::Stream& s, bool* captured) {
  *captured = false;
  const sim::Capture* c = capture_of(s);
  if (c == nullptr) return Result::success;
  *captured = true;
  return c->invalidated ? Result::stream_capture_invalidated : Result::success;
}

Result SimDriver::State::capture_check(Call call, const CaptureArgs& a) {
  const std::thread::id me = std::this_thread::get_id();
  for (const sim::CaptureRule& rule : sim::kCaptureRules) {
    if (rule.call != call) continue;
    std::vector<sim::Capture*> hit;
    switch (rule.when) {
      case sim::When::unsafe:
        for (auto& [id, c] : captures) {
          const bool mine = c.thread == me && c.mode != CaptureMode::relaxed;
          const bool others_global = c.thread != me && c.mode == CaptureMode::global;
          if (mine || others_global) hit.push_back(&c);
        }
        break;
      case sim::When::stream_capturing:
        if (a.stream != nullptr) {
          if (sim::Capture* c = capture_of(*a.stream)) hit.push_back(c);
        }
        break;
      case sim::When::device_capturing:
        for (auto& [id, c] : captures)
          if (c.device == a.device) hit.push_back(&c);
        break;
      case sim::When::event_captured:
        if (a.event != nullptr && a.event->capture != 0) {
          auto it = captures.find(a.event->capture);
          if (it != captures.end()) hit.push_back(&it->second);
        }
        break;
      case sim::When::waits_across:
        if (a.stream != nullptr && a.event != nullptr && a.event->recorded) {
          sim::Capture* c = capture_of(*a.stream);
          if (c != nullptr && a.event->capture != c->id) hit.push_back(c);
        }
        break;
    }
    if (hit.empty()) continue;
    if (rule.invalidates)
      for (sim::Capture* c : hit) c->invalidated = true;
    return rule.result;
  }
  return Result::success;
}

// --- entry points -----------------------------------------------------------------

Result SimDriver::stream_capture_status(int device, StreamHandle stream, CaptureStatus* status,
                                        std::uint64_t* capture_id) {
  GVM_SIM_ENTER(stream_capture_status);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(stream_capture_status, s, device, stream);
  if (status == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(stream_capture_status, {device, s, nullptr});
  const sim::Capture* c = s_->capture_of(*s);
  *status = c == nullptr     ? CaptureStatus::none
            : c->invalidated ? CaptureStatus::invalidated
                             : CaptureStatus::active;
  if (capture_id != nullptr && c != nullptr) *capture_id = c->id;
  return Result::success;
}

Result SimDriver::stream_begin_capture(int device, StreamHandle stream, CaptureMode mode) {
  GVM_SIM_ENTER(stream_begin_capture);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(stream_begin_capture, s, device, stream);
  if (s->device != device) return Result::invalid_handle;
  if (mode != CaptureMode::global && mode != CaptureMode::local_thread &&
      mode != CaptureMode::relaxed) {
    return Result::invalid_value;
  }
  // The legacy stream cannot be captured (it synchronizes with every
  // blocking stream of its context).
  if (s->legacy) return Result::stream_capture_unsupported;
  if (s->capture != 0) return Result::illegal_state;
  GVM_SIM_CAPTURE(stream_begin_capture, {device, s, nullptr});
  const std::uint64_t id = s_->next_capture++;
  sim::Capture& c = s_->captures[id];
  c.id = id;
  c.device = device;
  c.origin = s->id;
  c.mode = mode;
  c.thread = std::this_thread::get_id();
  s->capture = id;
  return Result::success;
}

Result SimDriver::stream_end_capture(int device, StreamHandle stream) {
  GVM_SIM_ENTER(stream_end_capture);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(stream_end_capture, s, device, stream);
  sim::Capture* c = s_->capture_of(*s);
  if (c == nullptr) return Result::illegal_state;
  if (c->origin != s->id) return Result::stream_capture_unmatched;
  GVM_SIM_CAPTURE(stream_end_capture, {device, s, nullptr});
  // Ended on another thread than the one that began it: the capture is over
  // all the same (an H200 answered the beginning thread's own end with
  // CUDA_ERROR_ILLEGAL_STATE next: tests/unit/data/probe_h200_capture.txt).
  // Measured in global mode; thread-local mode is taken to end alike.
  const bool wrong_thread =
      c->mode != CaptureMode::relaxed && c->thread != std::this_thread::get_id();
  const std::uint64_t id = c->id;
  const bool failed = c->invalidated;
  for (auto& [sid, st] : s_->streams)
    if (st.capture == id) st.capture = 0;
  // Events recorded inside the capture stand for graph nodes nothing runs
  // here: they count as complete from now on.
  for (auto& [h, e] : s_->events) {
    if (e.capture == id) {
      e.capture = 0;
      e.recorded = false;
    }
  }
  s_->captures.erase(id);
  if (wrong_thread) return Result::stream_capture_wrong_thread;
  return failed ? Result::stream_capture_invalidated : Result::success;
}

}  // namespace gvm::vmm
