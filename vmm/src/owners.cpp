#include "gvm/vmm/owners.hpp"

#include <cstdio>
#include <string>

namespace gvm::vmm {
namespace {

// A driver that is shutting down (process exit after the runtime tore down)
// has already freed everything; destructors must not treat that as an error.
Result tolerate_shutdown(Result r) noexcept {
  return r == Result::deinitialized ? Result::success : r;
}

std::string describe(const char* call, std::size_t size, DevicePtr addr, int device) {
  std::string s = call;
  s += "(";
  if (device >= 0) s += "device " + std::to_string(device) + ", ";
  if (addr != 0) s += "address 0x" + [&] {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(addr));
    return std::string(buf);
  }() + ", ";
  s += std::to_string(size) + " bytes)";
  return s;
}

}  // namespace

ReservedRange::ReservedRange(Driver& driver, std::size_t size, std::size_t alignment) {
  DevicePtr base = 0;
  Result r = driver.address_reserve(size, alignment, &base);
  if (r != Result::success) throw DriverError(r, describe("cuMemAddressReserve", size, 0, -1));
  driver_ = &driver;
  base_ = base;
  size_ = size;
}

Result ReservedRange::reset() noexcept {
  Result r = Result::success;
  if (driver_ != nullptr && size_ != 0) r = tolerate_shutdown(driver_->address_free(base_, size_));
  // On failure the owner keeps the handle, so that the caller can retry and
  // nothing is lost track of.
  if (r != Result::success) return r;
  driver_ = nullptr;
  base_ = 0;
  size_ = 0;
  return r;
}

PhysicalChunk::PhysicalChunk(Driver& driver, int device, std::size_t size,
                             ShareableHandleType exportable) {
  PhysHandle h = 0;
  Result r = driver.mem_create(device, size, exportable, &h);
  if (r != Result::success) throw DriverError(r, describe("cuMemCreate", size, 0, device));
  driver_ = &driver;
  handle_ = h;
  device_ = device;
  size_ = size;
}

Result PhysicalChunk::reset() noexcept {
  Result r = Result::success;
  if (driver_ != nullptr && size_ != 0) r = tolerate_shutdown(driver_->mem_release(handle_));
  // On failure the owner keeps the handle, so that the caller can retry and
  // nothing is lost track of.
  if (r != Result::success) return r;
  driver_ = nullptr;
  handle_ = 0;
  size_ = 0;
  return r;
}

Mapping::Mapping(Driver& driver, DevicePtr addr, const PhysicalChunk& chunk) {
  Result r = driver.mem_map(addr, chunk.size(), chunk.get());
  if (r != Result::success) throw DriverError(r, describe("cuMemMap", chunk.size(), addr, chunk.device()));
  driver_ = &driver;
  addr_ = addr;
  size_ = chunk.size();
}

Result Mapping::reset() noexcept {
  Result r = Result::success;
  if (driver_ != nullptr && size_ != 0) r = tolerate_shutdown(driver_->mem_unmap(addr_, size_));
  // On failure the owner keeps the handle, so that the caller can retry and
  // nothing is lost track of.
  if (r != Result::success) return r;
  driver_ = nullptr;
  addr_ = 0;
  size_ = 0;
  return r;
}

Event::Event(Driver& driver, int device) {
  EventHandle e = nullptr;
  Result r = driver.event_create(device, &e);
  if (r != Result::success) throw DriverError(r, describe("cuEventCreate", 0, 0, device));
  driver_ = &driver;
  event_ = e;
  device_ = device;
}

Result Event::reset() noexcept {
  Result r = Result::success;
  if (driver_ != nullptr && event_ != nullptr) r = tolerate_shutdown(driver_->event_destroy(event_));
  // On failure the owner keeps the handle, so that the caller can retry and
  // nothing is lost track of.
  if (r != Result::success) return r;
  driver_ = nullptr;
  event_ = nullptr;
  device_ = -1;
  return r;
}

MappedChunk::MappedChunk(Driver& driver, int device, DevicePtr addr, std::size_t size,
                         const std::vector<AccessDesc>& access, ShareableHandleType exportable)
    : chunk_(driver, device, size, exportable), mapping_(driver, addr, chunk_) {
  // If the constructor of mapping_ throws, chunk_ is destroyed (released).
  Result r = driver.mem_set_access(addr, size, access.data(), access.size());
  if (r != Result::success) {
    reset();  // unmap, then release
    throw DriverError(r, describe("cuMemSetAccess", size, addr, device));
  }
}

MappedChunk::MappedChunk(Driver& driver, DevicePtr addr, PhysicalChunk&& chunk,
                         const std::vector<AccessDesc>& access)
    : chunk_(std::move(chunk)), mapping_(driver, addr, chunk_) {
  // If the constructor of mapping_ throws, chunk_ is destroyed (released).
  Result r = driver.mem_set_access(addr, chunk_.size(), access.data(), access.size());
  if (r != Result::success) {
    const std::size_t size = chunk_.size();
    const int device = chunk_.device();
    reset();  // unmap, then release
    throw DriverError(r, describe("cuMemSetAccess", size, addr, device));
  }
}

Result MappedChunk::unmap_keep(PhysicalChunk* out) noexcept {
  Result r = mapping_.reset();
  if (r != Result::success) return r;
  *out = std::move(chunk_);
  return r;
}

Result MappedChunk::reset() noexcept {
  // Never release a handle that is still mapped: if the unmap fails, keep both.
  Result r = mapping_.reset();
  if (r != Result::success) return r;
  return chunk_.reset();
}

}  // namespace gvm::vmm
