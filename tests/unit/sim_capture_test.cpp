// Stream capture on the simulated driver (issue 14 (f)): status, what work on
// a capturing stream does, and what a capture forbids in each mode, on the
// capturing thread and on another one, following vmm/src/sim_capture_rules.hpp
// (the real driver's answers, measured on an H200:
// tests/unit/data/probe_h200_capture.txt).
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <queue>
#include <string>
#include <thread>

#include "sim_fixture.hpp"

namespace gvm::test {
namespace {

using vmm::CaptureMode;
using vmm::CaptureStatus;

// A thread of its own that runs one call at a time, in order, and hands the
// result back: where a capture is begun (and must be ended) off the test's
// thread.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  Result run(std::function<Result()> f) {
    std::packaged_task<Result()> task(std::move(f));
    std::future<Result> r = task.get_future();
    {
      std::lock_guard lock(mu_);
      jobs_.push(std::move(task));
    }
    cv_.notify_one();
    return r.get();
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<Result()> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return done_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::queue<std::packaged_task<Result()>> jobs_;
  bool done_ = false;
  std::thread thread_;
};

class SimCapture : public SimTest {
 protected:
  CaptureStatus status(vmm::StreamHandle s, std::uint64_t* id = nullptr) {
    CaptureStatus st = CaptureStatus::none;
    EXPECT_EQ(sim().stream_capture_status(0, s, &st, id), Result::success);
    return st;
  }
  // An event of device 0 recorded (outside any capture) after some work.
  vmm::EventHandle recorded_event() {
    vmm::EventHandle e = event(0);
    vmm::StreamHandle other = stream(0);
    DevicePtr p = 0;
    EXPECT_EQ(sim().mem_alloc(0, 4096, &p), Result::success);
    EXPECT_EQ(sim().enqueue_access(0, other, p, 4096, AccessKind::write), Result::success);
    EXPECT_EQ(sim().event_record(0, e, other), Result::success);
    return e;
  }
};

TEST_F(SimCapture, StatusFollowsBeginAndEndAndIdsAreUnique) {
  vmm::StreamHandle s = stream(0);
  EXPECT_EQ(status(s), CaptureStatus::none);
  EXPECT_EQ(status(nullptr), CaptureStatus::none) << "the legacy stream";
  ASSERT_EQ(sim().stream_begin_capture(0, s, CaptureMode::global), Result::success);
  std::uint64_t first = 0;
  EXPECT_EQ(status(s, &first), CaptureStatus::active);
  EXPECT_NE(first, 0u);
  EXPECT_EQ(sim().stream_begin_capture(0, s, CaptureMode::global), Result::illegal_state)
      << "already capturing";
  ASSERT_EQ(sim().stream_end_capture(0, s), Result::success);
  EXPECT_EQ(status(s), CaptureStatus::none);
  EXPECT_EQ(sim().stream_end_capture(0, s), Result::illegal_state) << "not capturing";
  ASSERT_EQ(sim().stream_begin_capture(0, s, CaptureMode::relaxed), Result::success);
  std::uint64_t second = 0;
  EXPECT_EQ(status(s, &second), CaptureStatus::active);
  EXPECT_NE(second, first);
  ASSERT_EQ(sim().stream_end_capture(0, s), Result::success);
}

TEST_F(SimCapture, TheLegacyStreamCannotBeCapturedAndBadModesAreRefused) {
  EXPECT_EQ(sim().stream_begin_capture(0, nullptr, CaptureMode::global),
            Result::stream_capture_unsupported);
  EXPECT_EQ(sim().stream_begin_capture(0, stream(0), static_cast<CaptureMode>(7)),
            Result::invalid_value);
  EXPECT_EQ(sim().stream_begin_capture(1, stream(0), CaptureMode::global), Result::invalid_handle)
      << "a stream of device 0 named as device 1's";
}

TEST_F(SimCapture, WorkOnACapturingStreamIsCapturedNotRun) {
  sim().enable_backing(true);
  DevicePtr r = reserve(g_);
  map(r, 0, g_, {{0, Access::read_write}});
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().stream_begin_capture(0, s, CaptureMode::relaxed), Result::success);
  EXPECT_EQ(sim().memset_d8_async(0, r, 0x7f, 4096, s), Result::success);
  EXPECT_EQ(sim().enqueue_access(0, s, r, 4096, AccessKind::write), Result::success);
  EXPECT_EQ(sim().memcpy_async(0, r + 8192, r, 4096, s), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 0u) << "captured work runs when the graph is launched";
  ASSERT_EQ(sim().stream_end_capture(0, s), Result::success);
  unsigned char byte = 1;
  ASSERT_EQ(sim().memcpy_dtoh(0, &byte, r, 1), Result::success);
  EXPECT_EQ(byte, 0) << "the captured memset did not run";
}

TEST_F(SimCapture, GlobalModeForbidsUnsafeCallsOnEveryThreadAndTheCaptureFails) {
  vmm::EventHandle e = recorded_event();
  vmm::StreamHandle s = stream(0);
  Worker capturer;
  ASSERT_EQ(capturer.run([&] { return sim().stream_begin_capture(0, s, CaptureMode::global); }),
            Result::success);
  EXPECT_EQ(sim().event_query(e), Result::stream_capture_unsupported)
      << "another thread's global capture forbids it here too";
  EXPECT_EQ(status(s), CaptureStatus::invalidated);
  EXPECT_EQ(sim().memset_d8_async(0, 0, 0, 16, s), Result::stream_capture_invalidated)
      << "work on a failed capture";
  EXPECT_EQ(capturer.run([&] { return sim().stream_end_capture(0, s); }),
            Result::stream_capture_invalidated);
  EXPECT_EQ(status(s), CaptureStatus::none);
  EXPECT_EQ(sim().event_query(e), Result::not_ready) << "no capture: as usual";
}

TEST_F(SimCapture, EndingAGlobalCaptureOnAnotherThreadEndsItAllTheSame) {
  // The H200 answered the wrong thread's end with WRONG_THREAD, and the
  // beginning thread's end after it with ILLEGAL_STATE: the capture was over.
  vmm::StreamHandle s = stream(0);
  Worker capturer;
  ASSERT_EQ(capturer.run([&] { return sim().stream_begin_capture(0, s, CaptureMode::global); }),
            Result::success);
  EXPECT_EQ(sim().stream_end_capture(0, s), Result::stream_capture_wrong_thread);
  EXPECT_EQ(status(s), CaptureStatus::none);
  EXPECT_EQ(capturer.run([&] { return sim().stream_end_capture(0, s); }), Result::illegal_state);
  EXPECT_EQ(sim().stream_begin_capture(0, s, CaptureMode::global), Result::success)
      << "the stream can capture again";
  EXPECT_EQ(sim().stream_end_capture(0, s), Result::success);
}

TEST_F(SimCapture, ThreadLocalModeForbidsUnsafeCallsOnlyOnTheCapturingThread) {
  vmm::EventHandle e = recorded_event();
  vmm::StreamHandle s = stream(0);
  Worker capturer;
  ASSERT_EQ(
      capturer.run([&] { return sim().stream_begin_capture(0, s, CaptureMode::local_thread); }),
      Result::success);
  EXPECT_EQ(sim().event_query(e), Result::not_ready) << "another thread is not concerned";
  DevicePtr p = 0;
  EXPECT_EQ(sim().mem_alloc(0, 4096, &p), Result::success);
  EXPECT_EQ(status(s), CaptureStatus::active);
  EXPECT_EQ(capturer.run([&] { return sim().event_query(e); }), Result::stream_capture_unsupported);
  EXPECT_EQ(status(s), CaptureStatus::invalidated);
  EXPECT_EQ(capturer.run([&] { return sim().stream_end_capture(0, s); }),
            Result::stream_capture_invalidated);
}

TEST_F(SimCapture, RelaxedModeForbidsOnlyWhatConflictsWithTheCapture) {
  vmm::EventHandle outside = recorded_event();
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().stream_begin_capture(0, s, CaptureMode::relaxed), Result::success);
  EXPECT_EQ(sim().event_query(outside), Result::not_ready) << "unsafe calls are let through";
  DevicePtr p = 0;
  EXPECT_EQ(sim().mem_alloc(0, 4096, &p), Result::success);
  EXPECT_EQ(sim().stream_synchronize(0, stream(0)), Result::success) << "a stream not capturing";
  EXPECT_EQ(status(s), CaptureStatus::active);
  EXPECT_EQ(sim().stream_synchronize(0, s), Result::stream_capture_unsupported);
  EXPECT_EQ(status(s), CaptureStatus::invalidated);
  EXPECT_EQ(sim().stream_end_capture(0, s), Result::stream_capture_invalidated);
}

TEST_F(SimCapture, AWaitForAnEventRecordedInsideTheCaptureFailsItInEveryMode) {
  // Measured: CUDA_ERROR_CAPTURED_EVENT, and the capture is invalidated, in
  // every mode and on every thread (the old guess let the capture live).
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::local_thread, CaptureMode::relaxed}) {
    for (bool query : {true, false}) {
      SCOPED_TRACE(std::string(vmm::capture_mode_name(mode)) + (query ? " query" : " synchronize"));
      vmm::StreamHandle s = stream(0);
      vmm::EventHandle inside = event(0);
      Worker capturer;
      ASSERT_EQ(capturer.run([&] { return sim().stream_begin_capture(0, s, mode); }),
                Result::success);
      ASSERT_EQ(sim().event_record(0, inside, s), Result::success);
      EXPECT_EQ(query ? sim().event_query(inside) : sim().event_synchronize(inside),
                Result::captured_event);
      EXPECT_EQ(status(s), CaptureStatus::invalidated);
      EXPECT_EQ(capturer.run([&] { return sim().stream_end_capture(0, s); }),
                Result::stream_capture_invalidated);
      EXPECT_EQ(sim().event_query(inside), Result::success) << "after the capture";
    }
  }
}

TEST_F(SimCapture, TheIdOfTheCapturingStreamFailsTheCaptureInEveryMode) {
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::local_thread, CaptureMode::relaxed}) {
    SCOPED_TRACE(vmm::capture_mode_name(mode));
    vmm::StreamHandle s = stream(0), other = stream(0);
    ASSERT_EQ(sim().stream_begin_capture(0, s, mode), Result::success);
    std::uint64_t id = 0;
    EXPECT_EQ(sim().stream_get_id(0, nullptr, &id), Result::success) << "the legacy stream";
    EXPECT_EQ(sim().stream_get_id(0, other, &id), Result::success) << "a stream not capturing";
    EXPECT_EQ(status(s), CaptureStatus::active);
    EXPECT_EQ(sim().stream_get_id(0, s, &id), Result::stream_capture_unsupported);
    EXPECT_EQ(status(s), CaptureStatus::invalidated);
    EXPECT_EQ(sim().stream_end_capture(0, s), Result::stream_capture_invalidated);
    EXPECT_EQ(sim().stream_get_id(0, s, &id), Result::success) << "after the capture";
  }
}

TEST_F(SimCapture, ContextSynchronizeOfTheCapturingDeviceFailsTheCaptureInAnyMode) {
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().stream_begin_capture(0, s, CaptureMode::relaxed), Result::success);
  EXPECT_EQ(sim().ctx_synchronize(1), Result::success) << "another device";
  EXPECT_EQ(sim().ctx_synchronize(0), Result::stream_capture_unsupported);
  EXPECT_EQ(sim().stream_end_capture(0, s), Result::stream_capture_invalidated);
}

TEST_F(SimCapture, WaitingForAnEventFromOutsideTheCaptureIsAnIsolationError) {
  vmm::EventHandle outside = recorded_event();
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().stream_begin_capture(0, s, CaptureMode::global), Result::success);
  vmm::EventHandle never = event(0);
  EXPECT_EQ(sim().stream_wait_event(0, s, never), Result::success)
      << "an event never recorded orders nothing";
  EXPECT_EQ(sim().stream_wait_event(0, s, outside), Result::stream_capture_isolation);
  EXPECT_EQ(sim().stream_end_capture(0, s), Result::stream_capture_invalidated);
}

TEST_F(SimCapture, WaitingForACapturedEventJoinsTheOtherStreamIntoTheCapture) {
  vmm::StreamHandle s = stream(0), t = stream(0);
  vmm::EventHandle fork = event(0);
  ASSERT_EQ(sim().stream_begin_capture(0, s, CaptureMode::global), Result::success);
  ASSERT_EQ(sim().event_record(0, fork, s), Result::success);
  ASSERT_EQ(sim().stream_wait_event(0, t, fork), Result::success);
  std::uint64_t id_s = 0, id_t = 0;
  EXPECT_EQ(status(s, &id_s), CaptureStatus::active);
  EXPECT_EQ(status(t, &id_t), CaptureStatus::active);
  EXPECT_EQ(id_s, id_t);
  EXPECT_EQ(sim().stream_end_capture(0, t), Result::stream_capture_unmatched)
      << "a capture ends on the stream it began on";
  EXPECT_EQ(sim().stream_end_capture(0, s), Result::success);
  EXPECT_EQ(status(t), CaptureStatus::none);
}

TEST_F(SimCapture, VmmCallsMemGetInfoAndHostCopiesAreAllowedInEveryMode) {
  // Measured: none of them touches the capture, in any mode, on any thread
  // (the old guess refused them all as unsafe).
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::local_thread, CaptureMode::relaxed}) {
    SCOPED_TRACE(vmm::capture_mode_name(mode));
    vmm::StreamHandle s = stream(0);
    ASSERT_EQ(sim().stream_begin_capture(0, s, mode), Result::success);
    DevicePtr r = 0;
    ASSERT_EQ(sim().address_reserve(2 * g_, 0, &r), Result::success);
    PhysHandle h = 0;
    ASSERT_EQ(sim().mem_create(0, g_, vmm::ShareableHandleType::none, &h), Result::success);
    ASSERT_EQ(sim().mem_map(r, g_, h), Result::success);
    const vmm::AccessDesc rw{0, Access::read_write};
    EXPECT_EQ(sim().mem_set_access(r, g_, &rw, 1), Result::success);
    const unsigned char bytes[16] = {1, 2, 3};
    EXPECT_EQ(sim().memcpy_htod(0, r, bytes, sizeof bytes), Result::success);
    std::size_t free_bytes = 0, total = 0;
    EXPECT_EQ(sim().mem_get_info(0, &free_bytes, &total), Result::success);
    EXPECT_EQ(sim().mem_unmap(r, g_), Result::success);
    EXPECT_EQ(sim().mem_release(h), Result::success);
    EXPECT_EQ(sim().address_free(r, 2 * g_), Result::success);
    EXPECT_EQ(status(s), CaptureStatus::active);
    EXPECT_EQ(sim().stream_end_capture(0, s), Result::success);
  }
  EXPECT_EQ(sim().live_mappings(), 0u);
  EXPECT_EQ(sim().live_reservations(), 0u);
}

TEST_F(SimCapture, ClassicAllocationIsRefusedAsUnsafeAndChangesNothing) {
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().stream_begin_capture(0, s, CaptureMode::global), Result::success);
  DevicePtr p = 0;
  EXPECT_EQ(sim().mem_alloc(0, 4096, &p), Result::stream_capture_unsupported);
  EXPECT_EQ(sim().live_classic_allocations(), 0u) << "a refused call changes nothing";
  ASSERT_EQ(sim().stream_end_capture(0, s), Result::stream_capture_invalidated);
  EXPECT_EQ(sim().mem_alloc(0, 4096, &p), Result::success) << "after the capture, as usual";
  EXPECT_EQ(sim().mem_free(0, p), Result::success);
}

}  // namespace
}  // namespace gvm::test
