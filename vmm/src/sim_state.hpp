// The state behind SimDriver, shared by its source files (sim_*.cpp).
//
// Address layout of the fake device address space:
//
//   0x2000'0000'0000 .. 0x7f00'0000'0000   classic allocations (cuMemAlloc)
//   0x7f00'0000'0000 .. +1 PiB             reservations (cuMemAddressReserve)
//
// Both regions are handed out next-fit from a moving cursor, so a freed range
// is not handed out again until the cursor wraps: a stale pointer in a test
// hits nothing instead of someone else's memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gvm/vmm/sim_driver.hpp"

namespace gvm::vmm::sim {

inline constexpr DevicePtr kClassicBase = 0x2000'0000'0000;
inline constexpr DevicePtr kClassicEnd = 0x7f00'0000'0000;
inline constexpr DevicePtr kVmmBase = 0x7f00'0000'0000;
inline constexpr DevicePtr kVmmEnd = kVmmBase + (DevicePtr{1} << 50);
// Classic allocations start on a 2 MiB boundary, like cudaMalloc's large
// allocations, which leaves a gap after small ones.
inline constexpr std::size_t kClassicAlignment = std::size_t{2} << 20;
// cudaMalloc hands out 512-byte aligned blocks: the unit charged to the budget.
inline constexpr std::size_t kClassicCharge = 512;

// Host pages behind one physical allocation, when backing is on. Pages are
// allocated on first write; a page never written reads as zeros.
class Storage {
 public:
  static constexpr std::size_t kPage = std::size_t{64} << 10;
  void read(std::size_t offset, void* dst, std::size_t n) const;
  void write(std::size_t offset, const void* src, std::size_t n);
  void fill(std::size_t offset, unsigned char value, std::size_t n);
  std::size_t pages() const noexcept { return pages_.size(); }

 private:
  unsigned char* page(std::size_t index);
  std::unordered_map<std::size_t, std::unique_ptr<unsigned char[]>> pages_;
};

struct Device {
  DeviceProfile profile;
  std::size_t budget = 0;
  std::size_t used = 0;
  std::vector<bool> can_peer;      // cuDeviceCanAccessPeer(this, p)
  std::vector<bool> peer_enabled;  // cuCtxEnablePeerAccess(this -> p) is on
  std::uint64_t legacy_stream = 0;
};

struct Reservation {
  std::size_t size = 0;
};

struct Phys {
  int device = -1;
  std::size_t size = 0;
  ShareableHandleType exportable = ShareableHandleType::none;
  int refs = 1;      // create + imports, minus releases
  int mappings = 0;  // the allocation lives while refs or mappings remain
  Storage storage;
};

struct MappingRec {
  std::size_t size = 0;
  PhysHandle handle = 0;
  std::vector<Access> access;  // per device
};

struct Classic {
  int device = -1;
  std::size_t size = 0;
  std::size_t charged = 0;
  Storage storage;
};

// Stream id -> the last sequence number of that stream's work that is ordered
// before (waited for by) the owner of the clock.
using VectorClock = std::map<std::uint64_t, std::uint64_t>;

struct Pending {
  std::uint64_t id = 0;   // one id per operation (a copy has a read and a write)
  std::uint64_t seq = 0;  // position in its stream
  int accessor = -1;      // the device whose engines touch the memory
  int owner = -1;         // the device the memory lives on
  DevicePtr lo = 0, hi = 0;
  AccessKind kind = AccessKind::read;
  const char* what = "";
};

struct Stream {
  std::uint64_t id = 0;  // what cuStreamGetId answers: never reused
  int device = -1;
  StreamHandle handle = nullptr;
  bool legacy = false;
  bool destroyed = false;  // kept until its pending work completes
  std::uint64_t capture = 0;  // the capture it takes part in, 0 for none
  std::uint64_t seq = 0;
  VectorClock clock;
  std::deque<Pending> pending;  // in seq order
};

struct Event {
  int device = -1;
  bool recorded = false;
  std::uint64_t capture = 0;  // last recorded inside this capture (0: outside)
  VectorClock clock;
};

// A stream capture (cuStreamBeginCapture .. cuStreamEndCapture). Work on its
// streams is captured into the graph, not run: it leaves nothing pending.
struct Capture {
  std::uint64_t id = 0;
  int device = -1;
  std::uint64_t origin = 0;  // the stream it began on, where it must end
  CaptureMode mode = CaptureMode::global;
  std::thread::id thread;  // that began it
  bool invalidated = false;
};

// A handle given back by cuStreamDestroy and not handed out again yet.
struct DeadStream {
  int device = -1;
  std::uint64_t id = 0;  // of the stream that had it
};

// Part of an address range that lies in one mapping or classic allocation.
struct Segment {
  DevicePtr lo = 0, hi = 0;
  int owner = -1;
  int accessor = -1;
  Storage* storage = nullptr;
  std::size_t offset = 0;  // of lo inside the storage
};

// Races past this many are counted but not described (a broken replay could
// otherwise fill memory with reports).
inline constexpr std::size_t kMaxRaceReports = 1000;

// Misuse reports past this many are counted but not described.
inline constexpr std::size_t kMaxMisuseReports = 100;

struct ScheduledFault {
  int remaining = 0;
  Result result = Result::success;
};

}  // namespace gvm::vmm::sim

namespace gvm::vmm {

struct SimDriver::State {
  mutable std::mutex mu;
  std::vector<sim::Device> devices;
  bool backing = false;
  bool auto_complete = false;
  Result sticky = Result::success;

  std::map<DevicePtr, sim::Reservation> reservations;
  DevicePtr va_cursor = sim::kVmmBase;
  std::map<PhysHandle, sim::Phys> phys;
  PhysHandle next_handle = 0x1000;
  std::map<DevicePtr, sim::MappingRec> mappings;
  std::map<DevicePtr, sim::Classic> classic;
  DevicePtr classic_cursor = sim::kClassicBase;
  std::map<int, PhysHandle> fds;
  int next_fd = 1 << 20;  // far above any descriptor the process really has

  std::map<std::uint64_t, sim::Stream> streams;  // by id, legacy ones included
  std::map<StreamHandle, std::uint64_t> stream_ids;  // live handles
  std::vector<StreamHandle> free_stream_handles;     // destroyed; reused last in, first out
  std::map<StreamHandle, sim::DeadStream> dead_streams;  // the same handles
  std::uintptr_t next_stream_handle = 0;
  std::map<EventHandle, sim::Event> events;
  std::map<std::uint64_t, sim::Capture> captures;  // under way, by id
  std::uint64_t next_object = 1;
  std::uint64_t next_access = 1;
  std::uint64_t next_capture = 1;
  std::vector<std::string> races;  // the first kMaxRaceReports
  std::size_t race_total = 0;
  std::vector<std::string> misuse;  // the first kMaxMisuseReports
  std::size_t misuse_total = 0;

  std::array<std::uint64_t, kAllCallCount> calls{};
  std::array<std::vector<sim::ScheduledFault>, kAllCallCount> faults;
  std::array<Result, kAllCallCount> every_fault{};
  std::array<std::uint64_t, kAllCallCount> simulated_ns{};  // sim_costs.hpp
  std::uint64_t emulated_peer_toggles = 0;

  // Counts the call, then answers an injected fault or the sticky error.
  Result enter(Call c);
  // Kills the context: sticky from now on, pending work dropped.
  Result die(Result r);
  bool valid_device(int d) const noexcept { return d >= 0 && d < static_cast<int>(devices.size()); }
  std::size_t granularity() const noexcept;

  // Which memory the driver stages through its owner when the accessor
  // cannot reach it: none (a kernel), classic memory only (cuMemcpyAsync:
  // VMM memory must be granted to the stream's device), or any (cuMemcpyPeer-
  // Async, the synchronous copies).
  enum class Staging { none, classic, any };
  enum class Reach {
    ok,
    unreachable,  // mapped or allocated, but the accessor may not touch it
    unmapped,     // some byte lies in no mapping and no classic allocation
  };
  // Splits [lo, lo + n) into segments and checks that `accessor` may touch
  // each with `kind`, or that its owner may where `staging` lets the driver
  // stage it through the owner.
  Reach resolve(DevicePtr lo, std::size_t n, int accessor, AccessKind kind, Staging staging,
                std::vector<sim::Segment>* out);
  void read(const std::vector<sim::Segment>& segs, std::size_t offset, void* dst, std::size_t n);
  void write(const std::vector<sim::Segment>& segs, std::size_t offset, const void* src,
             std::size_t n);

  // Streams: nullptr (and CU_STREAM_LEGACY / CU_STREAM_PER_THREAD) is the
  // legacy stream of `device`. Sets *out and answers success; invalid_handle
  // for a handle never handed out (invalid_device for a legacy stream of no
  // device); for a destroyed handle not handed out again, records a misuse
  // report and kills the context with context_is_destroyed: the real
  // driver's behaviour is undefined there, and it has crashed.
  Result find_stream(Call c, int device, StreamHandle h, sim::Stream** out);
  sim::Event* find_event(EventHandle e);
  std::uint64_t add_stream(int device, bool legacy);
  void report_misuse(std::string what);

  // Stream capture (sim_capture.cpp). Answers what kCaptureRules say `c`
  // answers under the captures under way (success when none forbids it),
  // invalidating the captures the rule names.
  struct CaptureArgs {
    int device = -1;
    const sim::Stream* stream = nullptr;
    const sim::Event* event = nullptr;
  };
  Result capture_check(Call c, const CaptureArgs& args);
  // Work enqueued on `s`: success when it runs as usual; when `s` takes part
  // in a capture, *captured is set (the work goes into the graph and must not
  // run) and the result is stream_capture_invalidated once the capture failed.
  Result capture_work(const sim::Stream& s, bool* captured);
  sim::Capture* capture_of(const sim::Stream& s);

  // Hazards (sim_hazards.cpp).
  struct Touch {
    sim::Segment seg;
    AccessKind kind;
  };
  // One operation on stream `s`: records races with unordered pending work of
  // other streams, then leaves the accesses pending.
  void enqueue(sim::Stream& s, const std::vector<Touch>& touches, const char* what);
  // Completes, on every stream, the work the clock covers.
  void complete(const sim::VectorClock& upto);
  bool is_complete(const sim::VectorClock& upto) const;
  void complete_device(int device);
  void prune_streams();
  bool any_pending(DevicePtr lo, DevicePtr hi, int accessor) const;  // accessor -1: any
  std::string describe_stream(std::uint64_t id) const;
};

}  // namespace gvm::vmm

// The first line of every SimDriver entry point: take the lock, count the
// call, answer an injected fault or the sticky error.
#define GVM_SIM_ENTER(call)     \
  std::lock_guard lock(s_->mu); \
  if (Result entered = s_->enter(Call::call); entered != Result::success) return entered

// After an entry point has validated its arguments: what the captures under
// way make of the call (sim_capture_rules.hpp).
#define GVM_SIM_CAPTURE(call, ...)                                                           \
  if (!s_->captures.empty()) {                                                               \
    if (Result refused = s_->capture_check(Call::call, __VA_ARGS__); refused != Result::success) \
      return refused;                                                                        \
  }

// The stream argument, found or answered for (see find_stream).
#define GVM_SIM_STREAM(call, var, device, handle)                                          \
  sim::Stream* var = nullptr;                                                              \
  if (Result found = s_->find_stream(Call::call, device, handle, &var); found != Result::success) \
    return found
