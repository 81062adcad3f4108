#include "fence.hpp"

#include <string>

namespace gvm::detail {

Fence::Fence(vmm::Driver& driver, int device_count, bool enabled)
    : driver_(driver), enabled_(enabled), events_(static_cast<std::size_t>(device_count)) {}

vmm::Event& Fence::event_for(int device) {
  auto& e = events_.at(static_cast<std::size_t>(device));
  if (e.empty()) e = vmm::Event(driver_, device);
  return e;
}

void Fence::wait(const std::vector<StreamRef>& streams) {
  if (!enabled_ || streams.empty()) return;
  std::lock_guard<std::mutex> guard(lock_);
  ++count_;
  for (const StreamRef& s : streams) {
    vmm::Event& e = event_for(s.device);
    // The message names the call that failed (the one to look up).
    const char* call = "cuEventRecord";
    vmm::Result r = e.record(s.stream);
    if (r == vmm::Result::success) call = "cuEventSynchronize", r = e.synchronize();
    if (r == vmm::Result::invalid_handle || r == vmm::Result::invalid_value ||
        r == vmm::Result::invalid_context) {
      // The stream is gone, or is not a stream of this device (a peer's
      // stream recorded on a block): which device its work runs on is
      // unknown, so wait for every device, which covers whatever it queued.
      r = vmm::Result::success;
      call = "cuCtxSynchronize";
      for (std::size_t d = 0; d < events_.size() && r == vmm::Result::success; ++d)
        r = driver_.ctx_synchronize(static_cast<int>(d));
    }
    if (r != vmm::Result::success)
      throw vmm::DriverError(r, std::string(call) + " in the fence on device " +
                                    std::to_string(s.device));
  }
}

void Fence::wait_devices(const std::vector<int>& devices) {
  if (!enabled_ || devices.empty()) return;
  std::lock_guard<std::mutex> guard(lock_);
  ++count_;
  for (int d : devices) {
    vmm::Result r = driver_.ctx_synchronize(d);
    if (r != vmm::Result::success)
      throw vmm::DriverError(r, "cuCtxSynchronize(device " + std::to_string(d) + ") in fence");
  }
}

std::uint64_t Fence::count() const noexcept {
  std::lock_guard<std::mutex> guard(lock_);
  return count_;
}

}  // namespace gvm::detail
