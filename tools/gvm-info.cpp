// gvm-info: what gvmalloc sees on this machine.
//
//   gvm-info                           the real driver (libcuda.so.1)
//   gvm-info --sim h200 --devices 2    a simulated machine (SimDriver)
//
// Prints every device (name, compute capability, memory, VMM, shareable
// handle types, granularity, peers) and the peer policy each ordered device
// pair would get. Exit status: 0 printed, 1 no usable driver (the loader's
// message on stderr, with a hint to --sim), 2 bad arguments.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/device_caps.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace {

using gvm::PeerPolicy;
using gvm::vmm::DeviceCaps;

constexpr const char* kUsage =
    "usage: gvm-info [--sim <profile> [--devices <n>]]\n"
    "  --sim <profile>  simulate the machine instead of loading libcuda.so.1\n"
    "                   (p40, v100, t4, a100, l4, h100, h200, b200)\n"
    "  --devices <n>    number of simulated devices, 1 to 64 (default 1)\n";

std::string mib(std::size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

// "2 MiB", or "64 KiB" for a size that is not a whole number of MiB.
std::string granule_size(std::size_t bytes) {
  if (bytes % (std::size_t{1} << 20) == 0) return mib(bytes);
  return std::to_string(bytes >> 10) + " KiB";
}

bool parse_int(std::string_view text, int* out) {
  if (text.empty() || text.size() > 4) return false;
  int v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

int print_machine(gvm::vmm::Driver& driver, const std::string& label) {
  std::vector<DeviceCaps> caps;
  try {
    caps = gvm::vmm::read_all_device_caps(driver);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gvm-info: %s\n", e.what());
    return 1;
  }
  std::printf("%s, %zu device%s\n", label.c_str(), caps.size(), caps.size() == 1 ? "" : "s");
  for (const DeviceCaps& c : caps) {
    std::printf("device %d: %s\n", c.device, c.name.c_str());
    int sms = 0;
    std::string sm_text = "? SMs";
    if (driver.device_attribute(c.device, gvm::vmm::DeviceAttribute::multiprocessor_count, &sms) ==
        gvm::vmm::Result::success)
      sm_text = std::to_string(sms) + " SMs";
    std::printf("  compute capability %d.%d (sm_%d), %s\n", c.cc_major, c.cc_minor,
                c.compute_capability(), sm_text.c_str());
    std::size_t free_bytes = 0, total_bytes = 0;
    std::string free_text = "free unknown";
    if (driver.mem_get_info(c.device, &free_bytes, &total_bytes) == gvm::vmm::Result::success)
      free_text = mib(free_bytes) + " free";
    std::printf("  memory %s total, %s\n", mib(c.total_memory).c_str(), free_text.c_str());
    if (c.vmm) {
      std::printf("  VMM yes, granularity %s (recommended %s)\n",
                  granule_size(c.granularity).c_str(),
                  granule_size(c.recommended_granularity).c_str());
    } else {
      std::printf("  VMM no (chunks would come from cuMemAlloc)\n");
    }
    std::string handles;
    if (c.posix_fd_handles) handles += " posix_fd";
    if (c.fabric_handles) handles += " fabric";
    std::printf("  shareable handles:%s; compression %s\n",
                handles.empty() ? " none" : handles.c_str(), c.compression ? "yes" : "no");
    std::string peers;
    for (std::size_t p = 0; p < c.can_access_peer.size(); ++p) {
      if (!c.can_access_peer[p]) continue;
      // Two appends, not " " + to_string(p): g++ 12 warns -Wrestrict on that
      // temporary (a false positive, but the build stays warning-free).
      peers += ' ';
      peers += std::to_string(p);
    }
    std::printf("  peers (cuDeviceCanAccessPeer):%s\n", peers.empty() ? " none" : peers.c_str());
  }

  if (caps.size() < 2) return 0;
  // The policy is the allocator's own choice (docs/peer-access.md, "The policy"), with
  // GVM_CONF applied, so this shows what a program using gvmalloc would get.
  // Constructing an Allocator only reads DeviceCaps: no memory, no access
  // change. A second one with the default config names the automatic choice
  // when GVM_CONF overrides it.
  gvm::Config config;
  std::string config_note;
  try {
    config = gvm::config_from_env();
  } catch (const std::exception& e) {
    config_note = std::string(" (ignored: ") + e.what() + ")";  // "GVM_CONF: ..."
  }
  try {
    gvm::Allocator configured(driver, config);
    gvm::Allocator automatic(driver, gvm::Config{});
    std::printf("peer policy (device reading a peer's memory)%s:\n", config_note.c_str());
    for (const DeviceCaps& reader : caps) {
      for (const DeviceCaps& owner : caps) {
        if (reader.device == owner.device) continue;
        PeerPolicy chosen = configured.peer_policy(owner.device, reader.device);
        PeerPolicy automatic_choice = automatic.peer_policy(owner.device, reader.device);
        if (config.peer_policy == PeerPolicy::automatic) {
          std::printf("  %d -> %d: %s\n", reader.device, owner.device, gvm::to_string(chosen));
        } else {
          std::printf("  %d -> %d: %s (GVM_CONF peer_policy:%s; automatic would be %s)\n",
                      reader.device, owner.device, gvm::to_string(chosen),
                      gvm::to_string(config.peer_policy), gvm::to_string(automatic_choice));
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gvm-info: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sim;
  int devices = 1;
  bool devices_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if ((arg == "--sim" || arg == "--devices") && i + 1 >= argc) {
      std::fprintf(stderr, "gvm-info: %s needs a value\n%s", argv[i], kUsage);
      return 2;
    }
    if (arg == "--sim") {
      sim = argv[++i];
    } else if (arg == "--devices") {
      if (!parse_int(argv[++i], &devices) || devices < 1 || devices > 64) {
        std::fprintf(stderr, "gvm-info: --devices wants a number from 1 to 64, not '%s'\n",
                     argv[i]);
        return 2;
      }
      devices_given = true;
    } else {
      std::fprintf(stderr, "gvm-info: unknown argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
  }
  if (devices_given && sim.empty()) {
    std::fprintf(stderr, "gvm-info: --devices only applies with --sim\n%s", kUsage);
    return 2;
  }

  if (!sim.empty()) {
    std::unique_ptr<gvm::vmm::SimDriver> driver;
    try {
      driver = gvm::vmm::SimDriver::uniform(gvm::vmm::parse_profile(sim), devices);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gvm-info: %s\n", e.what());
      return 2;
    }
    return print_machine(*driver, "simulated driver (profile " + sim + ")");
  }

  std::string why;
  std::unique_ptr<gvm::vmm::Driver> driver = gvm::vmm::try_load_cuda_driver(&why);
  if (!driver) {
    std::fprintf(stderr,
                 "gvm-info: %s (to see what gvmalloc would do on a GPU, simulate one: "
                 "gvm-info --sim h200 --devices 2)\n",
                 why.c_str());
    return 1;
  }
  const int v = gvm::vmm::cuda_driver_version(*driver);
  return print_machine(
      *driver, "CUDA driver " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10));
}
