// SimDriver: construction, configuration, fault injection, counters, devices,
// contexts, virtual memory, classic allocation and shareable handles.
// Streams, events and copies are in sim_streams.cpp; the hazard model in
// sim_hazards.cpp.
#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "sim_costs.hpp"
#include "sim_state.hpp"

namespace gvm::vmm {
namespace {

bool is_pow2(std::size_t x) noexcept {
  return x != 0 && (x & (x - 1)) == 0;
}

// Next-fit placement of `size` bytes aligned to `align` in [base, end),
// clear of every entry of `m` (a map from start address to something with a
// `size`). Moves the cursor past the result.
template <class Map>
std::optional<DevicePtr> place(const Map& m, DevicePtr* cursor, DevicePtr base, DevicePtr end,
                               std::size_t size, std::size_t align) {
  if (size == 0 || align == 0 || size > end - base || align > end - base) return std::nullopt;
  auto up = [align](DevicePtr x) { return (x + align - 1) / align * align; };
  for (int pass = 0; pass < 2; ++pass) {
    DevicePtr cand = up(pass == 0 ? std::max(*cursor, base) : base);
    while (cand <= end && end - cand >= size) {
      auto it = m.upper_bound(cand);
      if (it != m.begin()) {
        auto prev = std::prev(it);
        DevicePtr prev_end = prev->first + prev->second.size;
        if (prev_end > cand) {
          cand = up(prev_end);
          continue;
        }
      }
      if (it != m.end() && it->first < cand + size) {
        cand = up(it->first + it->second.size);
        continue;
      }
      *cursor = cand + size;
      return cand;
    }
  }
  return std::nullopt;
}

// What a fabric handle looks like to the simulator: a tag, then the handle.
constexpr char kFabricTag[16] = "gvm-sim-fabric";
constexpr std::size_t kFabricHandleBytes = 64;  // sizeof(CUmemFabricHandle)

bool valid_access(Access a) noexcept {
  return a == Access::none || a == Access::read || a == Access::read_write;
}

bool allows(Access a, AccessKind k) noexcept {
  return k == AccessKind::read ? (a == Access::read || a == Access::read_write)
                               : a == Access::read_write;
}

}  // namespace

// --- construction and configuration -----------------------------------------

SimDriver::SimDriver(std::vector<DeviceProfile> devices) : s_(std::make_unique<State>()) {
  const int n = static_cast<int>(devices.size());
  for (int i = 0; i < n; ++i) {
    DeviceProfile& p = devices[static_cast<std::size_t>(i)];
    std::string who = "SimDriver: device " + std::to_string(i) + " (" + p.name + ")";
    if (p.memory_bytes == 0) throw std::invalid_argument(who + " has no memory");
    if (!is_pow2(p.granularity) || !is_pow2(p.recommended_granularity) ||
        p.recommended_granularity < p.granularity) {
      throw std::invalid_argument(who +
                                  ": granularities must be powers of two, recommended >= minimum");
    }
    sim::Device d;
    d.profile = std::move(p);
    d.budget = d.profile.memory_bytes;
    d.can_peer.assign(static_cast<std::size_t>(n), true);
    d.can_peer[static_cast<std::size_t>(i)] = false;
    d.peer_enabled.assign(static_cast<std::size_t>(n), false);
    s_->devices.push_back(std::move(d));
  }
  for (int i = 0; i < n; ++i) {
    s_->devices[static_cast<std::size_t>(i)].legacy_stream = s_->add_stream(i, true);
  }
}

std::unique_ptr<SimDriver> SimDriver::uniform(Profile p, int count) {
  if (count < 0) throw std::invalid_argument("SimDriver::uniform: negative device count");
  return std::make_unique<SimDriver>(
      std::vector<DeviceProfile>(static_cast<std::size_t>(count), profile(p)));
}

SimDriver::~SimDriver() = default;

namespace {
void require_device(const SimDriver::State& s, int d, const char* what) {
  if (!s.valid_device(d)) {
    throw std::invalid_argument(std::string("SimDriver::") + what + ": no device " +
                                std::to_string(d));
  }
}
}  // namespace

void SimDriver::set_peer(int a, int b, bool can) {
  std::lock_guard lock(s_->mu);
  require_device(*s_, a, "set_peer");
  require_device(*s_, b, "set_peer");
  if (a == b) throw std::invalid_argument("SimDriver::set_peer: a device is not its own peer");
  s_->devices[static_cast<std::size_t>(a)].can_peer[static_cast<std::size_t>(b)] = can;
}

void SimDriver::set_physical_budget(int device, std::size_t bytes) {
  std::lock_guard lock(s_->mu);
  require_device(*s_, device, "set_physical_budget");
  s_->devices[static_cast<std::size_t>(device)].budget = bytes;
}

void SimDriver::enable_backing(bool on) {
  std::lock_guard lock(s_->mu);
  s_->backing = on;
}

void SimDriver::set_auto_complete(bool on) {
  std::lock_guard lock(s_->mu);
  s_->auto_complete = on;
}

// --- fault injection -----------------------------------------------------------

namespace {
std::size_t call_index(Call c, const char* what) {
  int i = static_cast<int>(c);
  if (i < 0 || i >= kAllCallCount) {
    throw std::invalid_argument(std::string("SimDriver::") + what + ": no such call " +
                                std::to_string(i));
  }
  return static_cast<std::size_t>(i);
}
}  // namespace

void SimDriver::fail_call(Call call, int nth, Result result) {
  std::size_t i = call_index(call, "fail_call");
  if (nth < 1)
    throw std::invalid_argument("SimDriver::fail_call: nth must be >= 1 (1 = the next call)");
  if (result == Result::success)
    throw std::invalid_argument("SimDriver::fail_call: a fault cannot be success");
  std::lock_guard lock(s_->mu);
  s_->faults[i].push_back({nth, result});
}

void SimDriver::fail_every_call(Call call, Result result) {
  std::size_t i = call_index(call, "fail_every_call");
  if (result == Result::success)
    throw std::invalid_argument("SimDriver::fail_every_call: a fault cannot be success");
  std::lock_guard lock(s_->mu);
  s_->every_fault[i] = result;
}

void SimDriver::clear_faults() {
  std::lock_guard lock(s_->mu);
  for (auto& f : s_->faults) f.clear();
  s_->every_fault.fill(Result::success);
}

Result SimDriver::State::enter(Call c) {
  auto i = static_cast<std::size_t>(c);
  ++calls[i];
  simulated_ns[i] += sim::call_cost_ns(c);
  Result fired = every_fault[i];
  auto& scheduled = faults[i];
  for (auto it = scheduled.begin(); it != scheduled.end();) {
    if (--it->remaining == 0) {
      if (fired == Result::success) fired = it->result;
      it = scheduled.erase(it);
    } else {
      ++it;
    }
  }
  if (fired != Result::success) return fired;
  return sticky;
}

Result SimDriver::State::die(Result r) {
  sticky = r;
  for (auto& [id, s] : streams) s.pending.clear();
  prune_streams();
  return r;
}

std::size_t SimDriver::State::granularity() const noexcept {
  // A reservation must suit every device that may map into it.
  std::size_t g = std::size_t{2} << 20;
  for (const auto& d : devices) g = std::max(g, d.profile.granularity);
  return g;
}

// --- hazard queries and counters -------------------------------------------------

Result SimDriver::sticky_error() const {
  std::lock_guard lock(s_->mu);
  return s_->sticky;
}

void SimDriver::clear_sticky() {
  std::lock_guard lock(s_->mu);
  s_->sticky = Result::success;
}

void SimDriver::complete_all() {
  std::lock_guard lock(s_->mu);
  for (auto& [id, s] : s_->streams) s.pending.clear();
  s_->prune_streams();
}

std::size_t SimDriver::pending_accesses() const {
  std::lock_guard lock(s_->mu);
  std::size_t n = 0;
  for (const auto& [id, s] : s_->streams) n += s.pending.size();
  return n;
}

std::vector<std::string> SimDriver::races() const {
  std::lock_guard lock(s_->mu);
  return s_->races;
}

std::size_t SimDriver::race_count() const {
  std::lock_guard lock(s_->mu);
  return s_->race_total;
}

void SimDriver::clear_races() {
  std::lock_guard lock(s_->mu);
  s_->races.clear();
  s_->race_total = 0;
}

std::vector<std::string> SimDriver::misuse() const {
  std::lock_guard lock(s_->mu);
  return s_->misuse;
}

std::size_t SimDriver::misuse_count() const {
  std::lock_guard lock(s_->mu);
  return s_->misuse_total;
}

void SimDriver::clear_misuse() {
  std::lock_guard lock(s_->mu);
  s_->misuse.clear();
  s_->misuse_total = 0;
}

std::uint64_t SimDriver::simulated_ns(Call call) const {
  std::size_t i = call_index(call, "simulated_ns");
  std::lock_guard lock(s_->mu);
  return s_->simulated_ns[i];
}

std::uint64_t SimDriver::simulated_ns_total() const {
  std::lock_guard lock(s_->mu);
  std::uint64_t t = 0;
  for (std::uint64_t ns : s_->simulated_ns) t += ns;
  return t;
}

std::uint64_t SimDriver::emulated_peer_toggles() const {
  std::lock_guard lock(s_->mu);
  return s_->emulated_peer_toggles;
}

std::size_t SimDriver::live_reservations() const {
  std::lock_guard lock(s_->mu);
  return s_->reservations.size();
}

std::size_t SimDriver::live_handles() const {
  std::lock_guard lock(s_->mu);
  return s_->phys.size();
}

std::size_t SimDriver::live_mappings() const {
  std::lock_guard lock(s_->mu);
  return s_->mappings.size();
}

std::size_t SimDriver::live_events() const {
  std::lock_guard lock(s_->mu);
  return s_->events.size();
}

std::size_t SimDriver::live_streams() const {
  std::lock_guard lock(s_->mu);
  return static_cast<std::size_t>(
      std::count_if(s_->streams.begin(), s_->streams.end(),
                    [](const auto& kv) { return !kv.second.legacy && !kv.second.destroyed; }));
}

std::size_t SimDriver::live_classic_allocations() const {
  std::lock_guard lock(s_->mu);
  return s_->classic.size();
}

std::size_t SimDriver::physical_used(int device) const {
  std::lock_guard lock(s_->mu);
  require_device(*s_, device, "physical_used");
  return s_->devices[static_cast<std::size_t>(device)].used;
}

std::uint64_t SimDriver::call_count(Call call) const {
  std::size_t i = call_index(call, "call_count");
  std::lock_guard lock(s_->mu);
  return s_->calls[i];
}

const DeviceProfile& SimDriver::device_profile(int device) const {
  std::lock_guard lock(s_->mu);
  require_device(*s_, device, "device_profile");
  return s_->devices[static_cast<std::size_t>(device)].profile;  // never reallocated
}

// --- devices -----------------------------------------------------------------------

Result SimDriver::device_count(int* count) {
  GVM_SIM_ENTER(device_count);
  if (count == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(device_count, {-1, nullptr, nullptr});
  *count = static_cast<int>(s_->devices.size());
  return Result::success;
}

Result SimDriver::device_name(int device, std::string* name) {
  GVM_SIM_ENTER(device_name);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (name == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(device_name, {device, nullptr, nullptr});
  *name = s_->devices[static_cast<std::size_t>(device)].profile.name;
  return Result::success;
}

Result SimDriver::device_attribute(int device, DeviceAttribute attr, int* value) {
  GVM_SIM_ENTER(device_attribute);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (value == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(device_attribute, {device, nullptr, nullptr});
  const DeviceProfile& p = s_->devices[static_cast<std::size_t>(device)].profile;
  switch (attr) {
    case DeviceAttribute::compute_capability_major: *value = p.cc_major; return Result::success;
    case DeviceAttribute::compute_capability_minor: *value = p.cc_minor; return Result::success;
    case DeviceAttribute::vmm_supported: *value = p.vmm ? 1 : 0; return Result::success;
    case DeviceAttribute::posix_fd_handle_supported:
      *value = p.posix_fd_handles ? 1 : 0;
      return Result::success;
    case DeviceAttribute::fabric_handle_supported:
      *value = p.fabric_handles ? 1 : 0;
      return Result::success;
    case DeviceAttribute::generic_compression_supported:
      *value = p.compression ? 1 : 0;
      return Result::success;
    case DeviceAttribute::unified_addressing: *value = 1; return Result::success;
    case DeviceAttribute::multiprocessor_count:
      *value = p.multiprocessor_count;
      return Result::success;
  }
  return Result::invalid_value;
}

Result SimDriver::device_total_memory(int device, std::size_t* bytes) {
  GVM_SIM_ENTER(device_total_memory);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (bytes == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(device_total_memory, {device, nullptr, nullptr});
  *bytes = s_->devices[static_cast<std::size_t>(device)].profile.memory_bytes;
  return Result::success;
}

Result SimDriver::mem_get_info(int device, std::size_t* free_bytes, std::size_t* total_bytes) {
  GVM_SIM_ENTER(mem_get_info);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (free_bytes == nullptr || total_bytes == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(mem_get_info, {device, nullptr, nullptr});
  const sim::Device& d = s_->devices[static_cast<std::size_t>(device)];
  *free_bytes = d.budget > d.used ? d.budget - d.used : 0;
  *total_bytes = d.profile.memory_bytes;
  return Result::success;
}

Result SimDriver::allocation_granularity(int device, GranularityKind kind, std::size_t* bytes) {
  GVM_SIM_ENTER(allocation_granularity);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (bytes == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(allocation_granularity, {device, nullptr, nullptr});
  const DeviceProfile& p = s_->devices[static_cast<std::size_t>(device)].profile;
  if (!p.vmm) return Result::not_supported;
  switch (kind) {
    case GranularityKind::minimum: *bytes = p.granularity; return Result::success;
    case GranularityKind::recommended: *bytes = p.recommended_granularity; return Result::success;
  }
  return Result::invalid_value;
}

Result SimDriver::can_access_peer(int device, int peer, bool* can) {
  GVM_SIM_ENTER(can_access_peer);
  if (!s_->valid_device(device) || !s_->valid_device(peer)) return Result::invalid_device;
  if (can == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(can_access_peer, {device, nullptr, nullptr});
  *can = s_->devices[static_cast<std::size_t>(device)].can_peer[static_cast<std::size_t>(peer)];
  return Result::success;
}

// --- contexts ------------------------------------------------------------------------

Result SimDriver::ctx_synchronize(int device) {
  GVM_SIM_ENTER(ctx_synchronize);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_CAPTURE(ctx_synchronize, {device, nullptr, nullptr});
  s_->complete_device(device);
  return Result::success;
}

Result SimDriver::enable_peer_access(int device, int peer) {
  GVM_SIM_ENTER(enable_peer_access);
  if (!s_->valid_device(device) || !s_->valid_device(peer) || device == peer) {
    return Result::invalid_device;
  }
  GVM_SIM_CAPTURE(enable_peer_access, {device, nullptr, nullptr});
  sim::Device& d = s_->devices[static_cast<std::size_t>(device)];
  // The real driver says CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (217), which the
  // project does not name; invalid_device is the nearest code it has.
  if (!d.can_peer[static_cast<std::size_t>(peer)]) return Result::invalid_device;
  if (d.peer_enabled[static_cast<std::size_t>(peer)]) return Result::peer_access_already_enabled;
  d.peer_enabled[static_cast<std::size_t>(peer)] = true;
  return Result::success;
}

Result SimDriver::disable_peer_access(int device, int peer) {
  GVM_SIM_ENTER(disable_peer_access);
  if (!s_->valid_device(device) || !s_->valid_device(peer) || device == peer) {
    return Result::invalid_device;
  }
  GVM_SIM_CAPTURE(disable_peer_access, {device, nullptr, nullptr});
  sim::Device& d = s_->devices[static_cast<std::size_t>(device)];
  if (!d.peer_enabled[static_cast<std::size_t>(peer)]) return Result::peer_access_not_enabled;
  d.peer_enabled[static_cast<std::size_t>(peer)] = false;
  // docs/measurements.md: a disable while a peer copy is queued fails 20/20 with
  // "unspecified launch failure" and kills the context.
  for (const auto& [id, s] : s_->streams) {
    for (const sim::Pending& p : s.pending) {
      if (p.accessor == device && p.owner == peer) return s_->die(Result::launch_failed);
    }
  }
  return Result::success;
}

// --- virtual memory ----------------------------------------------------------------

Result SimDriver::address_reserve(std::size_t size, std::size_t alignment, DevicePtr* addr) {
  GVM_SIM_ENTER(address_reserve);
  if (addr == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(address_reserve, {-1, nullptr, nullptr});
  if (std::none_of(s_->devices.begin(), s_->devices.end(),
                   [](const sim::Device& d) { return d.profile.vmm; })) {
    return Result::not_supported;
  }
  const std::size_t g = s_->granularity();
  if (alignment == 0) alignment = g;
  if (size == 0 || size % g != 0 || alignment % g != 0) return Result::invalid_value;
  auto at = place(s_->reservations, &s_->va_cursor, sim::kVmmBase, sim::kVmmEnd, size, alignment);
  if (!at) return Result::out_of_memory;
  s_->reservations.emplace(*at, sim::Reservation{size});
  *addr = *at;
  return Result::success;
}

Result SimDriver::address_free(DevicePtr addr, std::size_t size) {
  GVM_SIM_ENTER(address_free);
  GVM_SIM_CAPTURE(address_free, {-1, nullptr, nullptr});
  auto it = s_->reservations.find(addr);
  if (it == s_->reservations.end() || it->second.size != size) return Result::invalid_value;
  // The driver requires every mapping inside to be unmapped first.
  auto m = s_->mappings.lower_bound(addr);
  if (m != s_->mappings.end() && m->first < addr + size) return Result::invalid_value;
  s_->reservations.erase(it);
  return Result::success;
}

namespace {
void destroy_phys(SimDriver::State& s, std::map<PhysHandle, sim::Phys>::iterator it) {
  s.devices[static_cast<std::size_t>(it->second.device)].used -= it->second.size;
  for (auto fd = s.fds.begin(); fd != s.fds.end();) {
    fd = fd->second == it->first ? s.fds.erase(fd) : std::next(fd);
  }
  s.phys.erase(it);
}
}  // namespace

Result SimDriver::mem_create(int device, std::size_t size, ShareableHandleType exportable,
                             PhysHandle* handle) {
  GVM_SIM_ENTER(mem_create);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (handle == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(mem_create, {device, nullptr, nullptr});
  sim::Device& d = s_->devices[static_cast<std::size_t>(device)];
  if (!d.profile.vmm) return Result::not_supported;
  switch (exportable) {
    case ShareableHandleType::none: break;
    case ShareableHandleType::posix_fd:
      if (!d.profile.posix_fd_handles) return Result::not_supported;
      break;
    case ShareableHandleType::fabric:
      if (!d.profile.fabric_handles) return Result::not_supported;
      break;
    default: return Result::invalid_value;
  }
  if (size == 0 || size % d.profile.granularity != 0) return Result::invalid_value;
  if (d.used > d.budget || size > d.budget - d.used) return Result::out_of_memory;
  PhysHandle h = s_->next_handle++;
  sim::Phys& p = s_->phys[h];
  p.device = device;
  p.size = size;
  p.exportable = exportable;
  d.used += size;
  *handle = h;
  return Result::success;
}

Result SimDriver::mem_release(PhysHandle handle) {
  GVM_SIM_ENTER(mem_release);
  GVM_SIM_CAPTURE(mem_release, {-1, nullptr, nullptr});
  auto it = s_->phys.find(handle);
  if (it == s_->phys.end() || it->second.refs == 0) return Result::invalid_value;
  // A mapped allocation outlives its handle until the last unmap, as in the driver.
  if (--it->second.refs == 0 && it->second.mappings == 0) destroy_phys(*s_, it);
  return Result::success;
}

Result SimDriver::mem_map(DevicePtr addr, std::size_t size, PhysHandle handle) {
  GVM_SIM_ENTER(mem_map);
  GVM_SIM_CAPTURE(mem_map, {-1, nullptr, nullptr});
  auto ph = s_->phys.find(handle);
  if (ph == s_->phys.end() || ph->second.refs == 0) return Result::invalid_value;
  sim::Phys& p = ph->second;
  const std::size_t g = s_->devices[static_cast<std::size_t>(p.device)].profile.granularity;
  if (size == 0 || size != p.size || addr % g != 0) return Result::invalid_value;
  // Inside one reservation.
  auto r = s_->reservations.upper_bound(addr);
  if (r == s_->reservations.begin()) return Result::invalid_value;
  --r;
  if (addr - r->first > r->second.size || size > r->second.size - (addr - r->first)) {
    return Result::invalid_value;
  }
  // Not over another mapping.
  auto m = s_->mappings.upper_bound(addr);
  if (m != s_->mappings.end() && m->first < addr + size) return Result::invalid_value;
  if (m != s_->mappings.begin()) {
    auto prev = std::prev(m);
    if (prev->first + prev->second.size > addr) return Result::invalid_value;
  }
  sim::MappingRec rec;
  rec.size = size;
  rec.handle = handle;
  rec.access.assign(s_->devices.size(),
                    Access::none);  // mapped is not accessible, even for the owner
  s_->mappings.emplace(addr, std::move(rec));
  ++p.mappings;
  return Result::success;
}

namespace {
// The mappings that exactly tile [addr, addr + size), or false.
bool whole_mappings(SimDriver::State& s, DevicePtr addr, std::size_t size,
                    std::vector<std::map<DevicePtr, sim::MappingRec>::iterator>* out) {
  out->clear();
  if (size == 0 || addr > ~DevicePtr{0} - size) return false;
  const DevicePtr end = addr + size;
  auto it = s.mappings.find(addr);
  DevicePtr cur = addr;
  while (cur < end) {
    if (it == s.mappings.end() || it->first != cur) return false;
    out->push_back(it);
    cur += it->second.size;
    ++it;
  }
  return cur == end;
}
}  // namespace

Result SimDriver::mem_unmap(DevicePtr addr, std::size_t size) {
  GVM_SIM_ENTER(mem_unmap);
  GVM_SIM_CAPTURE(mem_unmap, {-1, nullptr, nullptr});
  std::vector<std::map<DevicePtr, sim::MappingRec>::iterator> ms;
  if (!whole_mappings(*s_, addr, size, &ms)) return Result::invalid_value;
  // Unmapping under pending work: the work faults on a missing page, the
  // same failure as a revoke under a reading kernel.
  const bool hazard = s_->any_pending(addr, addr + size, -1);
  for (auto m : ms) {
    auto ph = s_->phys.find(m->second.handle);
    s_->mappings.erase(m);
    if (--ph->second.mappings == 0 && ph->second.refs == 0) destroy_phys(*s_, ph);
  }
  return hazard ? s_->die(Result::illegal_address) : Result::success;
}

Result SimDriver::mem_set_access(DevicePtr addr, std::size_t size, const AccessDesc* descs,
                                 std::size_t count) {
  GVM_SIM_ENTER(mem_set_access);
  if (descs == nullptr || count == 0) return Result::invalid_value;
  GVM_SIM_CAPTURE(mem_set_access, {-1, nullptr, nullptr});
  std::vector<std::map<DevicePtr, sim::MappingRec>::iterator> ms;
  if (!whole_mappings(*s_, addr, size, &ms)) return Result::invalid_value;
  for (std::size_t i = 0; i < count; ++i) {
    const AccessDesc& d = descs[i];
    if (!s_->valid_device(d.device)) return Result::invalid_device;
    if (!valid_access(d.access)) return Result::invalid_value;
    if (!s_->devices[static_cast<std::size_t>(d.device)].profile.vmm) return Result::not_supported;
    for (auto m : ms) {
      int owner = s_->phys.at(m->second.handle).device;
      if (d.device != owner && d.access != Access::none &&
          !s_->devices[static_cast<std::size_t>(d.device)]
               .can_peer[static_cast<std::size_t>(owner)]) {
        return Result::invalid_device;
      }
    }
  }
  // Validated. What changes for whom: a peer's change is a grant (from none)
  // or a revoke or lowering; on a pre-Ampere pair each changed (peer, owner)
  // pair is an emulated global toggle.
  bool grants = false, revokes = false;
  std::vector<std::pair<int, int>> toggles;  // (peer, owner)
  for (std::size_t i = 0; i < count; ++i) {
    const AccessDesc& d = descs[i];
    for (auto m : ms) {
      const int owner = s_->phys.at(m->second.handle).device;
      const Access before = m->second.access[static_cast<std::size_t>(d.device)];
      if (d.device == owner || before == d.access) continue;
      (before == Access::none ? grants : revokes) = true;
      auto cc = [&](int dev) {
        return s_->devices[static_cast<std::size_t>(dev)].profile.cc_major;
      };
      const bool emulated =
          sim::emulates_peer_access(cc(d.device)) || sim::emulates_peer_access(cc(owner));
      if (emulated &&
          std::find(toggles.begin(), toggles.end(), std::pair{d.device, owner}) == toggles.end()) {
        toggles.emplace_back(d.device, owner);
      }
    }
  }
  std::uint64_t& cost = s_->simulated_ns[static_cast<std::size_t>(Call::mem_set_access)];
  if (!toggles.empty()) {
    cost += sim::kPeerToggleNs * toggles.size();
    s_->emulated_peer_toggles += toggles.size();
  } else {
    cost += grants ? sim::kPeerGrantNs : revokes ? sim::kPeerRevokeNs : sim::kOwnerAccessNs;
  }
  // Apply, then look for pending work the change pulls the rug from.
  bool hazard = false;
  for (std::size_t i = 0; i < count; ++i) {
    const AccessDesc& d = descs[i];
    for (auto m : ms) {
      m->second.access[static_cast<std::size_t>(d.device)] = d.access;
      for (const auto& [id, s] : s_->streams) {
        for (const sim::Pending& p : s.pending) {
          if (p.accessor == d.device && p.lo < m->first + m->second.size && m->first < p.hi &&
              !allows(d.access, p.kind)) {
            hazard = true;
          }
        }
      }
    }
  }
  // An emulated toggle under in-flight peer work between the pair, on any
  // memory of the owner: what a real cuCtxDisablePeerAccess under a queued
  // peer copy does (docs/measurements.md "Hazards").
  for (const auto& [peer, owner] : toggles) {
    for (const auto& [id, st] : s_->streams) {
      for (const sim::Pending& p : st.pending) {
        if (p.accessor == peer && p.owner == owner) return s_->die(Result::launch_failed);
      }
    }
  }
  // docs/measurements.md: a PROT_NONE revoke under a reading peer kernel gives
  // "an illegal memory access was encountered", sticky.
  return hazard ? s_->die(Result::illegal_address) : Result::success;
}

Result SimDriver::mem_get_access(DevicePtr addr, int device, Access* access) {
  GVM_SIM_ENTER(mem_get_access);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (access == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(mem_get_access, {device, nullptr, nullptr});
  auto m = s_->mappings.upper_bound(addr);
  if (m == s_->mappings.begin()) return Result::invalid_value;
  --m;
  if (addr - m->first >= m->second.size) return Result::invalid_value;
  *access = m->second.access[static_cast<std::size_t>(device)];
  return Result::success;
}

Result SimDriver::export_shareable_handle(PhysHandle handle, ShareableHandleType type, void* out) {
  GVM_SIM_ENTER(export_shareable_handle);
  if (out == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(export_shareable_handle, {-1, nullptr, nullptr});
  auto it = s_->phys.find(handle);
  if (it == s_->phys.end() || it->second.refs == 0) return Result::invalid_value;
  const DeviceProfile& p = s_->devices[static_cast<std::size_t>(it->second.device)].profile;
  switch (type) {
    case ShareableHandleType::posix_fd:
      if (!p.posix_fd_handles) return Result::not_supported;
      break;
    case ShareableHandleType::fabric:
      if (!p.fabric_handles) return Result::not_supported;
      break;
    default: return Result::invalid_value;
  }
  // The handle must have been created exportable as this type.
  if (it->second.exportable != type) return Result::invalid_value;
  if (type == ShareableHandleType::posix_fd) {
    int fd = s_->next_fd++;
    s_->fds[fd] = handle;
    *static_cast<int*>(out) = fd;
  } else {
    unsigned char bytes[kFabricHandleBytes] = {};
    std::memcpy(bytes, kFabricTag, sizeof kFabricTag);
    std::memcpy(bytes + sizeof kFabricTag, &handle, sizeof handle);
    std::memcpy(out, bytes, sizeof bytes);
  }
  return Result::success;
}

Result SimDriver::import_shareable_handle(void* shareable, ShareableHandleType type,
                                          PhysHandle* handle) {
  GVM_SIM_ENTER(import_shareable_handle);
  if (handle == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(import_shareable_handle, {-1, nullptr, nullptr});
  PhysHandle h = 0;
  if (type == ShareableHandleType::posix_fd) {
    auto fd = static_cast<int>(reinterpret_cast<std::intptr_t>(shareable));
    auto it = s_->fds.find(fd);
    if (it == s_->fds.end()) return Result::invalid_value;
    h = it->second;
  } else if (type == ShareableHandleType::fabric) {
    if (shareable == nullptr) return Result::invalid_value;
    unsigned char bytes[kFabricHandleBytes];
    std::memcpy(bytes, shareable, sizeof bytes);
    if (std::memcmp(bytes, kFabricTag, sizeof kFabricTag) != 0) return Result::invalid_value;
    std::memcpy(&h, bytes + sizeof kFabricTag, sizeof h);
    auto ph = s_->phys.find(h);
    if (ph == s_->phys.end() ||
        !s_->devices[static_cast<std::size_t>(ph->second.device)].profile.fabric_handles) {
      return Result::invalid_value;
    }
  } else {
    return Result::invalid_value;
  }
  auto it = s_->phys.find(h);
  if (it == s_->phys.end() || it->second.refs == 0) return Result::invalid_value;
  ++it->second.refs;
  *handle = h;
  return Result::success;
}

// --- classic allocation -------------------------------------------------------

Result SimDriver::mem_alloc(int device, std::size_t size, DevicePtr* addr) {
  GVM_SIM_ENTER(mem_alloc);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (addr == nullptr || size == 0) return Result::invalid_value;
  GVM_SIM_CAPTURE(mem_alloc, {device, nullptr, nullptr});
  sim::Device& d = s_->devices[static_cast<std::size_t>(device)];
  if (size > ~std::size_t{0} - sim::kClassicCharge) return Result::out_of_memory;
  std::size_t charged =
      (size + sim::kClassicCharge - 1) / sim::kClassicCharge * sim::kClassicCharge;
  if (d.used > d.budget || charged > d.budget - d.used) return Result::out_of_memory;
  auto at = place(s_->classic, &s_->classic_cursor, sim::kClassicBase, sim::kClassicEnd, size,
                  sim::kClassicAlignment);
  if (!at) return Result::out_of_memory;
  sim::Classic& c = s_->classic[*at];
  c.device = device;
  c.size = size;
  c.charged = charged;
  d.used += charged;
  *addr = *at;
  return Result::success;
}

Result SimDriver::mem_free(int device, DevicePtr addr) {
  GVM_SIM_ENTER(mem_free);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_CAPTURE(mem_free, {device, nullptr, nullptr});
  auto it = s_->classic.find(addr);
  if (it == s_->classic.end() || it->second.device != device) return Result::invalid_value;
  // No implicit synchronization: the driver does not promise one, so work
  // of any stream of any device still queued on the range faults.
  const bool hazard = s_->any_pending(addr, addr + it->second.size, -1);
  s_->devices[static_cast<std::size_t>(device)].used -= it->second.charged;
  s_->classic.erase(it);
  return hazard ? s_->die(Result::illegal_address) : Result::success;
}

// --- test kernels: not simulated (tests call enqueue_access) -------------------

Result SimDriver::module_load_data(int, const char*, ModuleHandle*) {
  GVM_SIM_ENTER(module_load_data);
  GVM_SIM_CAPTURE(module_load_data, {-1, nullptr, nullptr});
  return Result::not_supported;
}

Result SimDriver::module_unload(int, ModuleHandle) {
  GVM_SIM_ENTER(module_unload);
  GVM_SIM_CAPTURE(module_unload, {-1, nullptr, nullptr});
  return Result::not_supported;
}

Result SimDriver::module_get_function(ModuleHandle, const char*, FunctionHandle*) {
  GVM_SIM_ENTER(module_get_function);
  GVM_SIM_CAPTURE(module_get_function, {-1, nullptr, nullptr});
  return Result::not_supported;
}

Result SimDriver::launch_kernel(int, FunctionHandle, unsigned, unsigned, StreamHandle, void**) {
  GVM_SIM_ENTER(launch_kernel);
  GVM_SIM_CAPTURE(launch_kernel, {-1, nullptr, nullptr});
  return Result::not_supported;
}

}  // namespace gvm::vmm
