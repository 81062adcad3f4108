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
  std::uint64_t id = 0;
  int device = -1;
  StreamHandle handle = nullptr;
  bool legacy = false;
  bool destroyed = false;  // kept until its pending work completes
  std::uint64_t seq = 0;
  VectorClock clock;
  std::deque<Pending> pending;  // in seq order
};

struct Event {
  int device = -1;
  bool recorded = false;
  VectorClock clock;
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
  std::map<StreamHandle, std::uint64_t> stream_ids;
  std::map<EventHandle, sim::Event> events;
  std::uint64_t next_object = 1;
  std::uint64_t next_access = 1;
  std::vector<std::string> races;  // the first kMaxRaceReports
  std::size_t race_total = 0;

  std::array<std::uint64_t, kCallCount> calls{};
  std::array<std::vector<sim::ScheduledFault>, kCallCount> faults;
  std::array<Result, kCallCount> every_fault{};

  // Counts the call, then answers an injected fault or the sticky error.
  Result enter(Call c);
  // Kills the context: sticky from now on, pending work dropped.
  Result die(Result r);
  bool valid_device(int d) const noexcept { return d >= 0 && d < static_cast<int>(devices.size()); }
  std::size_t granularity() const noexcept;

  // Splits [lo, lo + n) into segments and checks that `accessor` may touch
  // each with `kind`; with `staged`, a segment the accessor cannot reach is
  // accepted if its owner can (the driver stages the copy through the owner).
  // False when some byte is not reachable.
  bool resolve(DevicePtr lo, std::size_t n, int accessor, AccessKind kind, bool staged,
               std::vector<sim::Segment>* out);
  void read(const std::vector<sim::Segment>& segs, std::size_t offset, void* dst, std::size_t n);
  void write(const std::vector<sim::Segment>& segs, std::size_t offset, const void* src,
             std::size_t n);

  // Streams: nullptr (and CU_STREAM_LEGACY / CU_STREAM_PER_THREAD) is the
  // legacy stream of `device`. Null when unknown or destroyed.
  sim::Stream* find_stream(int device, StreamHandle h);
  sim::Event* find_event(EventHandle e);
  std::uint64_t add_stream(int device, bool legacy);

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
