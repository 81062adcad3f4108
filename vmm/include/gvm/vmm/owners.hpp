// Move-only owners of driver objects: one owner per handle, get() to look,
// release() to give up ownership, a moved-from owner is empty. reset() frees
// now and returns the driver's result; on failure the owner keeps the handle
// (so the caller can retry, and nothing is lost track of). Destructors are
// noexcept and treat a driver that is shutting down (deinitialized) as done.
//
//   ReservedRange   cuMemAddressReserve / cuMemAddressFree
//   PhysicalChunk   cuMemCreate / cuMemRelease
//   Mapping         cuMemMap / cuMemUnmap
//   Event           cuEventCreate / cuEventDestroy
//   MappedChunk     create + map + set access as one step; a failure part-way
//                   undoes what was done (unmap, release) before throwing.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gvm/vmm/driver.hpp"

namespace gvm::vmm {

class ReservedRange {
 public:
  ReservedRange() = default;
  // Throws DriverError.
  ReservedRange(Driver& driver, std::size_t size, std::size_t alignment);
  ReservedRange(ReservedRange&& o) noexcept { swap(o); }
  ReservedRange& operator=(ReservedRange&& o) noexcept {
    ReservedRange(std::move(o)).swap(*this);
    return *this;
  }
  ~ReservedRange() { reset(); }

  DevicePtr base() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  bool contains(DevicePtr p) const noexcept { return p >= base_ && p - base_ < size_; }
  // Frees the address range now; the result of cuMemAddressFree.
  Result reset() noexcept;
  void swap(ReservedRange& o) noexcept {
    std::swap(driver_, o.driver_);
    std::swap(base_, o.base_);
    std::swap(size_, o.size_);
  }

 private:
  Driver* driver_ = nullptr;
  DevicePtr base_ = 0;
  std::size_t size_ = 0;
};

class PhysicalChunk {
 public:
  PhysicalChunk() = default;
  // Throws DriverError (out_of_memory when the device is full).
  PhysicalChunk(Driver& driver, int device, std::size_t size,
                ShareableHandleType exportable = ShareableHandleType::none);
  PhysicalChunk(PhysicalChunk&& o) noexcept { swap(o); }
  PhysicalChunk& operator=(PhysicalChunk&& o) noexcept {
    PhysicalChunk(std::move(o)).swap(*this);
    return *this;
  }
  // A cuMemRelease the driver refuses is tried once more before the handle
  // is given up: a handle dropped with its plan, after a growth failed, has
  // no other owner to try again (found by the fuzzer's driver faults; a dead
  // context refuses both, docs/reliability.md).
  ~PhysicalChunk() {
    if (reset() != Result::success) (void)reset();
  }

  PhysHandle get() const noexcept { return handle_; }
  int device() const noexcept { return device_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  // Gives up ownership; the caller must release the handle.
  PhysHandle release() noexcept {
    PhysHandle h = handle_;
    driver_ = nullptr;
    handle_ = 0;
    size_ = 0;
    return h;
  }
  Result reset() noexcept;
  void swap(PhysicalChunk& o) noexcept {
    std::swap(driver_, o.driver_);
    std::swap(handle_, o.handle_);
    std::swap(device_, o.device_);
    std::swap(size_, o.size_);
  }

 private:
  Driver* driver_ = nullptr;
  PhysHandle handle_ = 0;
  int device_ = -1;
  std::size_t size_ = 0;
};

class Mapping {
 public:
  Mapping() = default;
  // Maps `chunk` (its whole size) at addr. Throws DriverError.
  Mapping(Driver& driver, DevicePtr addr, const PhysicalChunk& chunk);
  Mapping(Mapping&& o) noexcept { swap(o); }
  Mapping& operator=(Mapping&& o) noexcept {
    Mapping(std::move(o)).swap(*this);
    return *this;
  }
  ~Mapping() { reset(); }

  DevicePtr addr() const noexcept { return addr_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  // Unmaps now. The caller must have fenced every stream that may touch the range.
  Result reset() noexcept;
  void swap(Mapping& o) noexcept {
    std::swap(driver_, o.driver_);
    std::swap(addr_, o.addr_);
    std::swap(size_, o.size_);
  }

 private:
  Driver* driver_ = nullptr;
  DevicePtr addr_ = 0;
  std::size_t size_ = 0;
};

class Event {
 public:
  Event() = default;
  // Throws DriverError.
  Event(Driver& driver, int device);
  Event(Event&& o) noexcept { swap(o); }
  Event& operator=(Event&& o) noexcept {
    Event(std::move(o)).swap(*this);
    return *this;
  }
  ~Event() { reset(); }

  EventHandle get() const noexcept { return event_; }
  int device() const noexcept { return device_; }
  bool empty() const noexcept { return event_ == nullptr; }
  Result record(StreamHandle stream) noexcept { return driver_->event_record(device_, event_, stream); }
  Result wait_on(StreamHandle stream) noexcept {
    return driver_->stream_wait_event(device_, stream, event_);
  }
  Result synchronize() noexcept { return driver_->event_synchronize(event_); }
  Result query() noexcept { return driver_->event_query(event_); }
  Result reset() noexcept;
  void swap(Event& o) noexcept {
    std::swap(driver_, o.driver_);
    std::swap(event_, o.event_);
    std::swap(device_, o.device_);
  }

 private:
  Driver* driver_ = nullptr;
  EventHandle event_ = nullptr;
  int device_ = -1;
};

// A physical chunk mapped at an address with access set for a list of devices
// (the owner first). Built in one step; on failure the steps already done are
// undone in reverse and the DriverError names the call that failed.
// Destruction unmaps then releases: fence before it.
class MappedChunk {
 public:
  MappedChunk() = default;
  MappedChunk(Driver& driver, int device, DevicePtr addr, std::size_t size,
              const std::vector<AccessDesc>& access,
              ShareableHandleType exportable = ShareableHandleType::none);
  // A handle made before (one a release unmapped and kept, unmap_keep):
  // mapped whole at addr and granted to `access`. On failure the mapping is
  // undone and the handle released (it was handed over) before the throw.
  MappedChunk(Driver& driver, DevicePtr addr, PhysicalChunk&& chunk,
              const std::vector<AccessDesc>& access);
  MappedChunk(MappedChunk&&) noexcept = default;
  MappedChunk& operator=(MappedChunk&& o) noexcept {
    // Unmap before release: the members are destroyed in reverse order.
    mapping_ = std::move(o.mapping_);
    chunk_ = std::move(o.chunk_);
    return *this;
  }
  ~MappedChunk() { reset(); }

  DevicePtr addr() const noexcept { return mapping_.addr(); }
  std::size_t size() const noexcept { return mapping_.size(); }
  PhysHandle handle() const noexcept { return chunk_.get(); }
  int device() const noexcept { return chunk_.device(); }
  bool empty() const noexcept { return mapping_.empty(); }
  // Unmap then release. If the unmap fails, nothing is released and the
  // failure is returned (the chunk stays owned and mapped).
  Result reset() noexcept;
  // Unmap only: the physical handle moves to *out (empty before) and this
  // owner is empty. If the unmap fails, nothing changes and the failure is
  // returned. A cuMemCreate and a cuMemRelease fewer when the handle is
  // mapped again elsewhere (a release before a growth hands its chunks to
  // the growth, docs/design-notes.md).
  Result unmap_keep(PhysicalChunk* out) noexcept;
  // No driver call: the handle moves to *handle and the mapping, still
  // standing, to *mapping (both empty before); this owner is empty. For a
  // handle mapped a second time elsewhere before its old address is
  // unmapped, which the driver allows (docs/measurements.md, "Mapping part
  // of a handle"): the caller unmaps *mapping once nothing reads it.
  void detach(PhysicalChunk* handle, Mapping* mapping) noexcept {
    *handle = std::move(chunk_);
    *mapping = std::move(mapping_);
  }

 private:
  PhysicalChunk chunk_;  // declared first: destroyed after the mapping
  Mapping mapping_;
};

}  // namespace gvm::vmm
