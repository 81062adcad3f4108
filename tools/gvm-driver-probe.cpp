// gvm-driver-probe: asks the real driver, through CudaDriver, the questions
// the simulated driver's rules rest on, and prints the answers as tables:
//   1. what a call costs (ns, median of batches): cuStreamGetId,
//      cuEventRecord, cuStreamWaitEvent, cuEventQuery, cuStreamGetCaptureInfo
//   2. what each call answers while a stream capture is under way, in each
//      capture mode, the capture begun on this thread or on another one, and
//      whether the capture survives it (vmm/src/sim_capture_rules.hpp is set
//      from this table)
//   3. whether cuStreamCreate hands a destroyed stream's handle out again
//
//   gvm-driver-probe [--device N] [--sim] [--skip TEXT]...
//
// One GPU, well under a minute. With --sim it asks the simulated driver (an
// H200 pair) instead: the same tables, to set beside the real driver's, and
// a CPU test that the probe itself runs. Exit 0 when every part ran, 1
// without a driver (one line says why), 2 when the driver got stuck (a
// watchdog names the step) or the context died. Every row is flushed as it
// is printed, so a run that got stuck keeps what it found; --skip leaves out
// the rows of part 2 whose call contains TEXT (the one that got stuck).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace {

using gvm::vmm::Access;
using gvm::vmm::AccessDesc;
using gvm::vmm::CaptureMode;
using gvm::vmm::CaptureStatus;
using gvm::vmm::DevicePtr;
using gvm::vmm::EventHandle;
using gvm::vmm::PhysHandle;
using gvm::vmm::Result;
using gvm::vmm::ShareableHandleType;
using gvm::vmm::StreamHandle;
using gvm::vmm::TestDriver;

// --- watchdog: a driver call that never returns is an answer too ------------------

std::atomic<std::uint64_t> g_progress{0};
std::mutex g_step_mu;
std::string g_step;

void step(const std::string& what) {
  std::lock_guard lock(g_step_mu);
  g_step = what;
  g_progress.fetch_add(1);
}

void start_watchdog(int seconds) {
  std::thread([seconds] {
    std::uint64_t seen = g_progress.load();
    int still = 0;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const std::uint64_t now = g_progress.load();
      still = now == seen ? still + 1 : 0;
      seen = now;
      if (still >= seconds) {
        std::lock_guard lock(g_step_mu);
        std::printf("\nSTUCK: no progress for %d s at: %s\n", seconds, g_step.c_str());
        std::fflush(stdout);
        std::_Exit(2);
      }
    }
  }).detach();
}

std::vector<std::string> g_skip;

std::string name(Result r) {
  return r == Result::success ? "ok" : gvm::vmm::result_name(r);
}

// --- a thread that runs calls one at a time (a capture begun on it must end on it) -

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

// --- part 1: costs -----------------------------------------------------------------

constexpr int kBatches = 201;
constexpr int kPerBatch = 100;

template <class F>
double median_ns(TestDriver& d, int dev, StreamHandle a, StreamHandle b, F&& call) {
  std::vector<double> per_call;
  per_call.reserve(kBatches);
  for (int i = 0; i < kBatches + 1; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < kPerBatch; ++k) call();
    const auto t1 = std::chrono::steady_clock::now();
    // Work queued by the calls (waits, records) drains outside the timing.
    (void)d.stream_synchronize(dev, a);
    (void)d.stream_synchronize(dev, b);
    if (i == 0) continue;  // warm-up
    per_call.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kPerBatch);
  }
  std::nth_element(per_call.begin(), per_call.begin() + kBatches / 2, per_call.end());
  return per_call[kBatches / 2];
}

bool costs(TestDriver& d, int dev) {
  std::printf("## 1. Cost of one call through CudaDriver (ns; median of %d batches of %d)\n\n",
              kBatches, kPerBatch);
  std::printf(
      "Through CudaDriver, which adds a cuCtxGetCurrent per call (and a switch when "
      "another context is current): what the allocator pays. (With --sim: the "
      "simulator's own cost, meaningless for the GPU.)\n\n");
  std::printf("| call | ns | result |\n|---|---|---|\n");
  StreamHandle a = nullptr, b = nullptr;
  EventHandle e = nullptr;
  if (d.stream_create(dev, &a) != Result::success || d.stream_create(dev, &b) != Result::success ||
      d.event_create(dev, &e) != Result::success) {
    std::printf("setup failed\n");
    return false;
  }
  Result last = Result::success;
  auto row = [&](const char* what, double ns) {
    std::printf("| %s | %.1f | %s |\n", what, ns, name(last).c_str());
  };
  std::uint64_t id = 0;
  CaptureStatus st{};
  step("cost: cuStreamGetId");
  row("cuStreamGetId (a created stream)",
      median_ns(d, dev, a, b, [&] { last = d.stream_get_id(dev, a, &id); }));
  row("cuStreamGetId (the legacy stream)",
      median_ns(d, dev, a, b, [&] { last = d.stream_get_id(dev, nullptr, &id); }));
  step("cost: cuEventRecord");
  row("cuEventRecord", median_ns(d, dev, a, b, [&] { last = d.event_record(dev, e, a); }));
  step("cost: cuStreamWaitEvent");
  row("cuStreamWaitEvent (event of another stream)",
      median_ns(d, dev, a, b, [&] { last = d.stream_wait_event(dev, b, e); }));
  step("cost: cuEventQuery");
  row("cuEventQuery (complete)", median_ns(d, dev, a, b, [&] { last = d.event_query(e); }));
  step("cost: cuStreamGetCaptureInfo");
  row("cuStreamGetCaptureInfo (not capturing)",
      median_ns(d, dev, a, b, [&] { last = d.stream_capture_status(dev, a, &st, nullptr); }));
  std::printf("\n");
  std::fflush(stdout);
  (void)d.event_destroy(e);
  (void)d.stream_destroy(dev, a);
  (void)d.stream_destroy(dev, b);
  return true;
}

// --- part 2: calls during a capture --------------------------------------------------

struct Probe {
  TestDriver& d;
  int dev;
  std::size_t gran;
  StreamHandle a = nullptr;      // captured
  StreamHandle b = nullptr;      // not captured
  EventHandle before = nullptr;  // recorded on b before the capture
  EventHandle inside = nullptr;  // recorded on a inside the capture (by the op)
  EventHandle join = nullptr;
  // Resources an op sets up and cleans up.
  DevicePtr va = 0;
  PhysHandle handle = 0;
  DevicePtr classic = 0;
  StreamHandle extra = nullptr;
  bool done = false;  // the op's own call succeeded
};

struct Op {
  const char* call;
  // Before the capture begins (on the main thread).
  std::function<void(Probe&)> setup;
  // The call under test, made on the thread the row names, with the capture
  // under way.
  std::function<Result(Probe&)> run;
  // After the capture ended.
  std::function<void(Probe&)> cleanup;
};

void nothing(Probe&) {}

std::vector<Op> ops() {
  std::vector<Op> v;
  v.push_back({"cuMemAddressReserve", nothing,
               [](Probe& p) { return p.d.address_reserve(p.gran, 0, &p.va); },
               [](Probe& p) {
                 if (p.done) (void)p.d.address_free(p.va, p.gran);
               }});
  v.push_back({"cuMemAddressFree", [](Probe& p) { (void)p.d.address_reserve(p.gran, 0, &p.va); },
               [](Probe& p) { return p.d.address_free(p.va, p.gran); },
               [](Probe& p) {
                 if (!p.done) (void)p.d.address_free(p.va, p.gran);
               }});
  v.push_back(
      {"cuMemCreate", nothing,
       [](Probe& p) { return p.d.mem_create(p.dev, p.gran, ShareableHandleType::none, &p.handle); },
       [](Probe& p) {
         if (p.done) (void)p.d.mem_release(p.handle);
       }});
  v.push_back(
      {"cuMemRelease",
       [](Probe& p) { (void)p.d.mem_create(p.dev, p.gran, ShareableHandleType::none, &p.handle); },
       [](Probe& p) { return p.d.mem_release(p.handle); },
       [](Probe& p) {
         if (!p.done) (void)p.d.mem_release(p.handle);
       }});
  auto reserve_create = [](Probe& p) {
    (void)p.d.address_reserve(p.gran, 0, &p.va);
    (void)p.d.mem_create(p.dev, p.gran, ShareableHandleType::none, &p.handle);
  };
  auto release_free = [](Probe& p) {
    (void)p.d.mem_release(p.handle);
    (void)p.d.address_free(p.va, p.gran);
  };
  v.push_back({"cuMemMap", reserve_create,
               [](Probe& p) { return p.d.mem_map(p.va, p.gran, p.handle); },
               [release_free](Probe& p) {
                 if (p.done) (void)p.d.mem_unmap(p.va, p.gran);
                 release_free(p);
               }});
  v.push_back({"cuMemSetAccess",
               [reserve_create](Probe& p) {
                 reserve_create(p);
                 (void)p.d.mem_map(p.va, p.gran, p.handle);
               },
               [](Probe& p) {
                 const AccessDesc rw{p.dev, Access::read_write};
                 return p.d.mem_set_access(p.va, p.gran, &rw, 1);
               },
               [release_free](Probe& p) {
                 (void)p.d.mem_unmap(p.va, p.gran);
                 release_free(p);
               }});
  v.push_back({"cuMemUnmap",
               [reserve_create](Probe& p) {
                 reserve_create(p);
                 (void)p.d.mem_map(p.va, p.gran, p.handle);
                 const AccessDesc rw{p.dev, Access::read_write};
                 (void)p.d.mem_set_access(p.va, p.gran, &rw, 1);
               },
               [](Probe& p) { return p.d.mem_unmap(p.va, p.gran); },
               [release_free](Probe& p) {
                 if (!p.done) (void)p.d.mem_unmap(p.va, p.gran);
                 release_free(p);
               }});
  v.push_back({"cuMemAlloc", nothing,
               [](Probe& p) { return p.d.mem_alloc(p.dev, std::size_t{1} << 20, &p.classic); },
               [](Probe& p) {
                 if (p.done) (void)p.d.mem_free(p.dev, p.classic);
               }});
  v.push_back({"cuMemFree",
               [](Probe& p) { (void)p.d.mem_alloc(p.dev, std::size_t{1} << 20, &p.classic); },
               [](Probe& p) { return p.d.mem_free(p.dev, p.classic); },
               [](Probe& p) {
                 if (!p.done) (void)p.d.mem_free(p.dev, p.classic);
               }});
  v.push_back({"cuMemGetInfo", nothing,
               [](Probe& p) {
                 std::size_t f = 0, t = 0;
                 return p.d.mem_get_info(p.dev, &f, &t);
               },
               nothing});
  v.push_back({"cuEventRecord (a stream not capturing)", nothing,
               [](Probe& p) { return p.d.event_record(p.dev, p.join, p.b); }, nothing});
  v.push_back({"cuEventRecord (the capturing stream)", nothing,
               [](Probe& p) { return p.d.event_record(p.dev, p.inside, p.a); }, nothing});
  v.push_back({"cuEventQuery (event recorded before the capture)", nothing,
               [](Probe& p) { return p.d.event_query(p.before); }, nothing});
  v.push_back({"cuEventQuery (event recorded inside the capture)", nothing,
               [](Probe& p) {
                 (void)p.d.event_record(p.dev, p.inside, p.a);
                 return p.d.event_query(p.inside);
               },
               nothing});
  v.push_back({"cuEventSynchronize (event recorded before the capture)", nothing,
               [](Probe& p) { return p.d.event_synchronize(p.before); }, nothing});
  v.push_back({"cuEventSynchronize (event recorded inside the capture)", nothing,
               [](Probe& p) {
                 (void)p.d.event_record(p.dev, p.inside, p.a);
                 return p.d.event_synchronize(p.inside);
               },
               nothing});
  v.push_back({"cuStreamWaitEvent (capturing stream, event recorded before the capture)", nothing,
               [](Probe& p) { return p.d.stream_wait_event(p.dev, p.a, p.before); }, nothing});
  v.push_back({"cuStreamWaitEvent (other stream, event recorded inside: a fork, joined back)",
               nothing,
               [](Probe& p) {
                 (void)p.d.event_record(p.dev, p.inside, p.a);
                 const Result r = p.d.stream_wait_event(p.dev, p.b, p.inside);
                 (void)p.d.event_record(p.dev, p.join, p.b);
                 (void)p.d.stream_wait_event(p.dev, p.a, p.join);
                 return r;
               },
               nothing});
  v.push_back({"cuStreamSynchronize (the capturing stream)", nothing,
               [](Probe& p) { return p.d.stream_synchronize(p.dev, p.a); }, nothing});
  v.push_back({"cuStreamSynchronize (a stream not capturing)", nothing,
               [](Probe& p) { return p.d.stream_synchronize(p.dev, p.b); }, nothing});
  v.push_back(
      {"cuCtxSynchronize", nothing, [](Probe& p) { return p.d.ctx_synchronize(p.dev); }, nothing});
  v.push_back({"cuStreamGetId (the capturing stream)", nothing,
               [](Probe& p) {
                 std::uint64_t id = 0;
                 return p.d.stream_get_id(p.dev, p.a, &id);
               },
               nothing});
  v.push_back({"cuStreamGetId (the legacy stream)", nothing,
               [](Probe& p) {
                 std::uint64_t id = 0;
                 return p.d.stream_get_id(p.dev, nullptr, &id);
               },
               nothing});
  v.push_back({"cuMemsetD8Async (the capturing stream)",
               [](Probe& p) { (void)p.d.mem_alloc(p.dev, 4096, &p.classic); },
               [](Probe& p) { return p.d.memset_d8_async(p.dev, p.classic, 1, 4096, p.a); },
               [](Probe& p) { (void)p.d.mem_free(p.dev, p.classic); }});
  v.push_back({"cuMemsetD8Async (a stream not capturing)",
               [](Probe& p) { (void)p.d.mem_alloc(p.dev, 4096, &p.classic); },
               [](Probe& p) { return p.d.memset_d8_async(p.dev, p.classic, 1, 4096, p.b); },
               [](Probe& p) {
                 (void)p.d.stream_synchronize(p.dev, p.b);
                 (void)p.d.mem_free(p.dev, p.classic);
               }});
  v.push_back({"cuMemcpyHtoD", [](Probe& p) { (void)p.d.mem_alloc(p.dev, 4096, &p.classic); },
               [](Probe& p) {
                 unsigned char host[64] = {};
                 return p.d.memcpy_htod(p.dev, p.classic, host, sizeof host);
               },
               [](Probe& p) { (void)p.d.mem_free(p.dev, p.classic); }});
  v.push_back({"cuStreamCreate", nothing,
               [](Probe& p) { return p.d.stream_create(p.dev, &p.extra); },
               [](Probe& p) {
                 if (p.done) (void)p.d.stream_destroy(p.dev, p.extra);
               }});
  v.push_back({"cuStreamDestroy (a stream not capturing)",
               [](Probe& p) { (void)p.d.stream_create(p.dev, &p.extra); },
               [](Probe& p) { return p.d.stream_destroy(p.dev, p.extra); },
               [](Probe& p) {
                 if (!p.done) (void)p.d.stream_destroy(p.dev, p.extra);
               }});
  return v;
}

// One row: the capture begun on `capturer` (the main thread when null), the
// op run on the main thread.
bool capture_row(TestDriver& d, int dev, std::size_t gran, const Op& op, CaptureMode mode,
                 Worker* capturer) {
  for (const std::string& skip : g_skip) {
    if (std::string(op.call).find(skip) != std::string::npos) {
      std::printf("| %s | %s | %s | skipped (--skip) | | |\n", op.call,
                  gvm::vmm::capture_mode_name(mode), capturer ? "another thread" : "this thread");
      return true;
    }
  }
  Probe p{d, dev, gran};
  step(std::string("capture setup: ") + op.call);
  if (d.stream_create(dev, &p.a) != Result::success ||
      d.stream_create(dev, &p.b) != Result::success ||
      d.event_create(dev, &p.before) != Result::success ||
      d.event_create(dev, &p.inside) != Result::success ||
      d.event_create(dev, &p.join) != Result::success) {
    std::printf("| %s | setup failed |\n", op.call);
    return false;
  }
  // The event "before" follows real work on b, so a query of it has
  // something to ask about.
  if (d.mem_alloc(dev, 1 << 20, &p.classic) == Result::success) {
    (void)d.memset_d8_async(dev, p.classic, 0, 1 << 20, p.b);
    (void)d.event_record(dev, p.before, p.b);
    (void)d.stream_synchronize(dev, p.b);
    (void)d.mem_free(dev, p.classic);
    p.classic = 0;
  }
  op.setup(p);
  auto on_capturer = [&](std::function<Result()> f) {
    return capturer != nullptr ? capturer->run(std::move(f)) : f();
  };
  step(std::string("begin capture: ") + op.call);
  const Result begun = on_capturer([&] { return d.stream_begin_capture(dev, p.a, mode); });
  Result got = Result::unknown;
  CaptureStatus after = CaptureStatus::none;
  Result status_r = Result::unknown, ended = Result::unknown;
  if (begun == Result::success) {
    step(std::string("during capture: ") + op.call);
    got = op.run(p);
    p.done = got == Result::success;
    status_r = d.stream_capture_status(dev, p.a, &after, nullptr);
    step(std::string("end capture: ") + op.call);
    ended = on_capturer([&] { return d.stream_end_capture(dev, p.a); });
  }
  step(std::string("cleanup: ") + op.call);
  op.cleanup(p);
  const Result health = d.ctx_synchronize(dev);
  std::printf(
      "| %s | %s | %s | %s | %s | %s |\n", op.call, gvm::vmm::capture_mode_name(mode),
      capturer != nullptr ? "another thread" : "this thread",
      begun == Result::success ? name(got).c_str() : ("begin: " + name(begun)).c_str(),
      status_r == Result::success ? gvm::vmm::capture_status_name(after) : name(status_r).c_str(),
      name(ended).c_str());
  std::fflush(stdout);
  (void)d.event_destroy(p.before);
  (void)d.event_destroy(p.inside);
  (void)d.event_destroy(p.join);
  (void)d.stream_destroy(dev, p.a);
  (void)d.stream_destroy(dev, p.b);
  if (health != Result::success) {
    std::printf("\nthe context died after this row (cuCtxSynchronize: %s): stopping\n",
                name(health).c_str());
    return false;
  }
  return true;
}

bool captures(TestDriver& d, int dev, std::size_t gran) {
  std::printf(
      "## 2. Calls made while stream A captures (the rows of "
      "vmm/src/sim_capture_rules.hpp)\n\n");
  std::printf(
      "Each row: a fresh capture of stream A in <mode>, begun (and ended) on <capture "
      "on>; the call made on the main thread; A's status after it "
      "(cuStreamGetCaptureInfo); what cuStreamEndCapture answered.\n\n");
  std::printf("| call | mode | capture on | result | status after | end |\n");
  std::printf("|---|---|---|---|---|---|\n");
  {
    step("begin capture of the legacy stream");
    const Result r = d.stream_begin_capture(dev, nullptr, CaptureMode::global);
    std::printf("| cuStreamBeginCapture (the legacy stream) | global | this thread | %s | | |\n",
                name(r).c_str());
    if (r == Result::success) (void)d.stream_end_capture(dev, nullptr);
  }
  Worker other;
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::local_thread, CaptureMode::relaxed}) {
    for (bool elsewhere : {false, true}) {
      for (const Op& op : ops()) {
        if (!capture_row(d, dev, gran, op, mode, elsewhere ? &other : nullptr)) return false;
      }
    }
  }
  {
    // Ending a global capture on another thread than the one that began it.
    StreamHandle a = nullptr;
    (void)d.stream_create(dev, &a);
    step("end capture on the wrong thread");
    Result begun = d.stream_begin_capture(dev, a, CaptureMode::global);
    Result wrong = other.run([&] { return d.stream_end_capture(dev, a); });
    Result right = d.stream_end_capture(dev, a);
    std::printf(
        "| cuStreamEndCapture from another thread (global) | global | this thread | "
        "begin %s, end there %s | | end here %s |\n",
        name(begun).c_str(), name(wrong).c_str(), name(right).c_str());
    (void)d.stream_destroy(dev, a);
  }
  std::printf("\n");
  return true;
}

// --- part 3: stream handles after destroy ---------------------------------------------

bool recycling(TestDriver& d, int dev) {
  std::printf("## 3. Stream handles after cuStreamDestroy\n\n");
  std::printf("| try | destroyed handle | next cuStreamCreate | same handle | ids |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int t = 1; t <= 5; ++t) {
    step("recycling try " + std::to_string(t));
    StreamHandle s = nullptr, n = nullptr;
    std::uint64_t id_s = 0, id_n = 0;
    if (d.stream_create(dev, &s) != Result::success) return false;
    (void)d.stream_get_id(dev, s, &id_s);
    (void)d.stream_destroy(dev, s);
    if (d.stream_create(dev, &n) != Result::success) return false;
    (void)d.stream_get_id(dev, n, &id_n);
    std::printf("| %d | %p | %p | %s | %llu -> %llu |\n", t, s, n, s == n ? "yes" : "no",
                static_cast<unsigned long long>(id_s), static_cast<unsigned long long>(id_n));
    (void)d.stream_destroy(dev, n);
  }
  // Order: three destroyed in order a, b, c, then three created.
  step("recycling order");
  StreamHandle made[3] = {}, again[3] = {};
  for (auto& s : made) (void)d.stream_create(dev, &s);
  for (auto& s : made) (void)d.stream_destroy(dev, s);
  for (auto& s : again) (void)d.stream_create(dev, &s);
  auto which = [&](StreamHandle h) -> std::string {
    for (int i = 0; i < 3; ++i)
      if (made[i] == h) return std::string(1, static_cast<char>('a' + i));
    return "new";
  };
  std::printf("\ndestroyed a, b, c in that order; the next three creates got: %s, %s, %s\n\n",
              which(again[0]).c_str(), which(again[1]).c_str(), which(again[2]).c_str());
  for (auto& s : again) (void)d.stream_destroy(dev, s);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int dev = 0;
  bool sim = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      dev = std::atoi(argv[++i]);
    } else if (a == "--sim") {
      sim = true;
    } else if (a == "--skip" && i + 1 < argc) {
      g_skip.emplace_back(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: gvm-driver-probe [--device N] [--sim] [--skip TEXT]...\n");
      return 64;
    }
  }
  std::string why;
  std::unique_ptr<TestDriver> d;
  if (sim) {
    d = gvm::vmm::SimDriver::uniform(gvm::vmm::Profile::h200, 2);
  } else {
    d = gvm::vmm::try_load_cuda_test_driver(&why);
  }
  if (!d) {
    std::printf("gvm-driver-probe: %s\n", why.c_str());
    return 1;
  }
  int count = 0;
  std::string device_name;
  std::size_t gran = 0;
  if (d->device_count(&count) != Result::success || dev < 0 || dev >= count ||
      d->device_name(dev, &device_name) != Result::success ||
      d->allocation_granularity(dev, gvm::vmm::GranularityKind::minimum, &gran) !=
          Result::success) {
    std::printf("gvm-driver-probe: no device %d (the driver shows %d)\n", dev, count);
    return 1;
  }
  start_watchdog(20);
  std::printf("# gvm-driver-probe: device %d, %s, %s driver %d\n\n", dev, device_name.c_str(),
              d->name(), gvm::vmm::cuda_driver_version(*d));
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = costs(*d, dev) && captures(*d, dev, gran) && recycling(*d, dev);
  std::printf("done in %.1f s%s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              ok ? "" : " (stopped early)");
  return ok ? 0 : 2;
}
