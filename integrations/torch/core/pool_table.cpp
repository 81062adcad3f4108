#include "pool_table.hpp"

#include <stdexcept>
#include <string>

namespace gvm::torch_backend {

namespace {
std::string name(MempoolKey k) {
  return "(" + std::to_string(k.first) + ", " + std::to_string(k.second) + ")";
}
}  // namespace

PoolTable::Entry& PoolTable::incref_locked(MempoolKey key, const std::shared_ptr<void>& custom,
                                           const MakePool& make) {
  if (key.is_default()) {
    throw std::invalid_argument("pool (0, 0) is the default pool, not a private pool");
  }
  auto it = pools_.find(key);
  if (it != pools_.end()) {
    if (custom && it->second.custom != custom) {
      throw std::invalid_argument("pool " + name(key) + " already exists with another allocator");
    }
    ++it->second.use_count;
    return it->second;
  }
  Entry e;
  e.custom = custom;
  if (!custom) e.pool = make();  // may throw: then nothing was added
  e.use_count = 1;
  return pools_.emplace(key, std::move(e)).first->second;
}

Target PoolTable::target_of(MempoolKey key, const Entry& e, bool capture) {
  Target t;
  t.pool = e.pool;
  t.key = key;
  t.custom = e.custom;
  t.capture = capture;
  return t;
}

void PoolTable::create_or_incref(MempoolKey key, std::shared_ptr<void> custom,
                                 const MakePool& make) {
  std::lock_guard lock(mutex_);
  incref_locked(key, custom, make);
}

Target PoolTable::begin(MempoolKey key, Filter filter, bool capture, const MakePool& make) {
  std::lock_guard lock(mutex_);
  routes_.reserve(routes_.size() + 1);  // so that the push below cannot throw
  Entry& e = incref_locked(key, nullptr, make);
  routes_.push_back(Route{key, std::move(filter), capture});
  open_routes_.fetch_add(1, std::memory_order_release);
  if (capture) open_captures_.fetch_add(1, std::memory_order_release);
  return target_of(key, e, capture);
}

std::optional<Target> PoolTable::end(MempoolKey key) {
  std::lock_guard lock(mutex_);
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    if (it->key != key) continue;
    const bool capture = it->capture;
    routes_.erase(std::next(it).base());
    open_routes_.fetch_sub(1, std::memory_order_release);
    if (capture) open_captures_.fetch_sub(1, std::memory_order_release);
    auto p = pools_.find(key);
    if (p == pools_.end()) return Target{0, key, nullptr, capture};
    return target_of(key, p->second, capture);
  }
  return std::nullopt;
}

std::optional<PoolId> PoolTable::release(MempoolKey key) {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(key);
  if (it == pools_.end()) return std::nullopt;
  if (--it->second.use_count > 0) return std::nullopt;
  for (const Route& r : routes_) {
    // A route still open holds its own reference, so this cannot happen
    // unless releasePool was called more often than the pool was taken.
    if (r.key == key) {
      ++it->second.use_count;
      throw std::logic_error("pool " + name(key) + " released while allocation into it is open");
    }
  }
  const PoolId pool = it->second.pool;
  const bool custom = static_cast<bool>(it->second.custom);
  pools_.erase(it);
  if (custom) return std::nullopt;
  return pool;
}

int PoolTable::use_count(MempoolKey key) const {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(key);
  return it == pools_.end() ? 0 : it->second.use_count;
}

void PoolTable::set_use_on_oom(MempoolKey key, bool use) {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(key);
  if (it == pools_.end()) {
    if (!use) return;  // MemPool's destructor clears it on a pool that may be gone
    throw std::invalid_argument("use_on_oom: no pool " + name(key) + " on this device");
  }
  it->second.use_on_oom = use;
}

void PoolTable::set_no_split(MempoolKey key) {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(key);
  if (it == pools_.end())
    throw std::invalid_argument("no_split: no pool " + name(key) + " on this device");
  it->second.no_split = true;
}

bool PoolTable::no_split(MempoolKey key) const {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(key);
  return it != pools_.end() && it->second.no_split;
}

Target PoolTable::route(void* stream) const {
  if (!any_routes()) return Target{};
  std::lock_guard lock(mutex_);
  for (const Route& r : routes_) {
    if (!r.filter(stream)) continue;
    auto it = pools_.find(r.key);
    if (it == pools_.end()) break;  // cannot happen: a route holds a reference
    return target_of(r.key, it->second, r.capture);
  }
  return Target{};
}

std::vector<Target> PoolTable::use_on_oom_targets() const {
  std::lock_guard lock(mutex_);
  std::vector<Target> out;
  for (const auto& [key, e] : pools_) {
    if (e.use_on_oom) out.push_back(target_of(key, e, false));
  }
  return out;
}

std::optional<Target> PoolTable::find(MempoolKey key) const {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(key);
  if (it == pools_.end()) return std::nullopt;
  return target_of(key, it->second, false);
}

std::optional<MempoolKey> PoolTable::key_of(PoolId pool) const {
  if (pool == 0) return MempoolKey{};
  std::lock_guard lock(mutex_);
  for (const auto& [key, e] : pools_) {
    if (!e.custom && e.pool == pool) return key;
  }
  return std::nullopt;
}

std::vector<MempoolKey> PoolTable::keys() const {
  std::lock_guard lock(mutex_);
  std::vector<MempoolKey> out;
  out.reserve(pools_.size());
  for (const auto& [key, e] : pools_) out.push_back(key);
  return out;
}

}  // namespace gvm::torch_backend
