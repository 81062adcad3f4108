// Device profiles of the simulator, and the host pages behind backed memory.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "sim_state.hpp"

namespace gvm::vmm {
namespace {

constexpr std::size_t kGiB = std::size_t{1} << 30;

DeviceProfile make(const char* name, int major, int minor, std::size_t gib, int sms) {
  DeviceProfile p;
  p.name = name;
  p.cc_major = major;
  p.cc_minor = minor;
  p.memory_bytes = gib * kGiB;
  p.multiprocessor_count = sms;
  // Generic compression arrived with Ampere (sm_80).
  p.compression = major >= 8;
  return p;
}

}  // namespace

// Names, compute capabilities, memory sizes and SM counts are the vendor's
// published figures for each board (the SXM variants where there are several).
DeviceProfile profile(Profile p) {
  switch (p) {
    case Profile::p40: return make("Tesla P40", 6, 1, 24, 30);
    case Profile::v100: return make("Tesla V100-SXM2-32GB", 7, 0, 32, 80);
    case Profile::t4: return make("Tesla T4", 7, 5, 16, 40);
    case Profile::a100: return make("NVIDIA A100-SXM4-80GB", 8, 0, 80, 108);
    case Profile::l4: return make("NVIDIA L4", 8, 9, 24, 58);
    case Profile::h100: {
      DeviceProfile d = make("NVIDIA H100 80GB HBM3", 9, 0, 80, 132);
      d.fabric_handles = true;
      return d;
    }
    case Profile::h200: {
      DeviceProfile d = make("NVIDIA H200", 9, 0, 141, 132);
      d.fabric_handles = true;
      return d;
    }
    case Profile::b200: {
      DeviceProfile d = make("NVIDIA B200", 10, 0, 180, 148);
      d.fabric_handles = true;
      return d;
    }
  }
  throw std::invalid_argument("unknown device profile " + std::to_string(static_cast<int>(p)));
}

const char* profile_name(Profile p) noexcept {
  switch (p) {
    case Profile::p40: return "p40";
    case Profile::v100: return "v100";
    case Profile::t4: return "t4";
    case Profile::a100: return "a100";
    case Profile::l4: return "l4";
    case Profile::h100: return "h100";
    case Profile::h200: return "h200";
    case Profile::b200: return "b200";
  }
  return "?";
}

Profile parse_profile(std::string_view name) {
  for (Profile p : kAllProfiles) {
    if (name == profile_name(p)) return p;
  }
  std::string known;
  for (Profile p : kAllProfiles) known += std::string(known.empty() ? "" : ", ") + profile_name(p);
  throw std::invalid_argument("unknown device profile '" + std::string(name) +
                              "' (known: " + known + ")");
}

namespace sim {

unsigned char* Storage::page(std::size_t index) {
  auto& slot = pages_[index];
  if (!slot) slot = std::make_unique<unsigned char[]>(kPage);  // value-initialized: zeros
  return slot.get();
}

void Storage::read(std::size_t offset, void* dst, std::size_t n) const {
  auto* out = static_cast<unsigned char*>(dst);
  while (n > 0) {
    std::size_t in_page = offset % kPage;
    std::size_t len = std::min(n, kPage - in_page);
    auto it = pages_.find(offset / kPage);
    if (it == pages_.end()) {
      std::memset(out, 0, len);
    } else {
      std::memcpy(out, it->second.get() + in_page, len);
    }
    out += len;
    offset += len;
    n -= len;
  }
}

void Storage::write(std::size_t offset, const void* src, std::size_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  while (n > 0) {
    std::size_t in_page = offset % kPage;
    std::size_t len = std::min(n, kPage - in_page);
    std::memcpy(page(offset / kPage) + in_page, in, len);
    in += len;
    offset += len;
    n -= len;
  }
}

void Storage::fill(std::size_t offset, unsigned char value, std::size_t n) {
  while (n > 0) {
    std::size_t in_page = offset % kPage;
    std::size_t len = std::min(n, kPage - in_page);
    // A zero fill of a page never written changes nothing: keep it unallocated,
    // so clearing a large range costs no host memory.
    if (value != 0 || pages_.count(offset / kPage) != 0) {
      std::memset(page(offset / kPage) + in_page, value, len);
    }
    offset += len;
    n -= len;
  }
}

}  // namespace sim
}  // namespace gvm::vmm
