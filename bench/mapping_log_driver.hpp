// MappingLogDriver: another TestDriver seen through a log of what is mapped.
//
// Every call goes to the inner driver unchanged (generated from the call
// tables, gvm/vmm/driver_calls.hpp); a cuMemMap (or, without VMM, a
// cuMemAlloc) that succeeds adds its range to the log and a cuMemUnmap (or
// cuMemFree) that succeeds removes it. The log is the allocator's chunks (one
// mapping per cuMemCreate handle), which Allocator::memory_map merges into
// segments: gvm-excess needs them to tell a hole inside a chunk that holds
// live blocks from a chunk that is wholly free.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <tuple>

#include "gvm/vmm/test_driver.hpp"

namespace gvm::bench {

class MappingLogDriver final : public vmm::TestDriver {
 public:
  explicit MappingLogDriver(vmm::TestDriver& inner) : inner_(inner) {}

  // Mapped ranges: start address -> bytes.
  const std::map<vmm::DevicePtr, std::size_t>& mapped() const noexcept { return mapped_; }

  const char* name() const noexcept override { return inner_.name(); }

  using Result = vmm::Result;

 private:
  // What a successful call changes in the log, chosen by the call's
  // arguments (every other call changes nothing).
  template <class T>
  void logged(vmm::Call, const T&) {}
  void logged(vmm::Call c, const std::tuple<vmm::DevicePtr, std::size_t, vmm::PhysHandle>& a) {
    if (c == vmm::Call::mem_map) mapped_[std::get<0>(a)] = std::get<1>(a);
  }
  void logged(vmm::Call c, const std::tuple<vmm::DevicePtr, std::size_t>& a) {
    if (c == vmm::Call::mem_unmap) mapped_.erase(std::get<0>(a));
  }
  void logged(vmm::Call c, const std::tuple<int, std::size_t, vmm::DevicePtr*>& a) {
    if (c == vmm::Call::mem_alloc) mapped_[*std::get<2>(a)] = std::get<1>(a);
  }
  void logged(vmm::Call c, const std::tuple<int, vmm::DevicePtr>& a) {
    if (c == vmm::Call::mem_free) mapped_.erase(std::get<1>(a));
  }

 public:
#define GVM_LOG_FORWARD(name, cu_name, params, args)                       \
  Result name params override {                                            \
    const Result r = inner_.name args;                                     \
    if (r == Result::success) logged(vmm::Call::name, std::make_tuple args); \
    return r;                                                              \
  }
  // The tables name types without their namespace.
  using DeviceAttribute = vmm::DeviceAttribute;
  using GranularityKind = vmm::GranularityKind;
  using DevicePtr = vmm::DevicePtr;
  using PhysHandle = vmm::PhysHandle;
  using ShareableHandleType = vmm::ShareableHandleType;
  using AccessDesc = vmm::AccessDesc;
  using Access = vmm::Access;
  using StreamHandle = vmm::StreamHandle;
  using EventHandle = vmm::EventHandle;
  using ModuleHandle = vmm::ModuleHandle;
  using FunctionHandle = vmm::FunctionHandle;
  using CaptureStatus = vmm::CaptureStatus;
  using CaptureMode = vmm::CaptureMode;
  GVM_VMM_DRIVER_CALLS(GVM_LOG_FORWARD)
  GVM_VMM_TEST_CALLS(GVM_LOG_FORWARD)
#undef GVM_LOG_FORWARD

 private:
  vmm::TestDriver& inner_;
  std::map<vmm::DevicePtr, std::size_t> mapped_;
};

}  // namespace gvm::bench
