#include "stream_registry.hpp"

#include <algorithm>

namespace gvm::detail {

std::atomic<std::uint64_t> StreamRegistry::next_id_{1};

StreamState& StreamRegistry::get(vmm::StreamHandle handle) {
  std::lock_guard<std::mutex> guard(mu_);
  auto it = live_.find(handle);
  if (it != live_.end()) return *it->second;
  all_.push_back(std::make_unique<StreamState>(next_id_.fetch_add(1), device_, handle));
  StreamState* s = all_.back().get();
  live_.emplace(handle, s);
  return *s;
}

std::vector<StreamState*> StreamRegistry::live() const {
  std::lock_guard<std::mutex> guard(mu_);
  std::vector<StreamState*> out;
  out.reserve(live_.size());
  for (const auto& [handle, s] : live_) out.push_back(s);
  return out;
}

bool StreamRegistry::retire(vmm::StreamHandle handle) {
  std::lock_guard<std::mutex> guard(mu_);
  auto it = live_.find(handle);
  if (it == live_.end()) return false;
  StreamState* s = it->second;
  live_.erase(it);
  const std::uint64_t n = retires_.fetch_add(1, std::memory_order_acq_rel) + 1;
  s->retire();
  pending_.emplace_back(s, n);
  return true;
}

void StreamRegistry::device_synced(std::uint64_t retired_before) {
  std::lock_guard<std::mutex> guard(mu_);
  auto done = [&](const std::pair<StreamState*, std::uint64_t>& p) { return p.second <= retired_before; };
  for (auto& p : pending_) {
    if (!done(p)) continue;
    p.first->mark_complete();
    std::lock_guard<std::mutex> state_guard(p.first->lock());
    p.first->reset_records();
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
}

std::size_t StreamRegistry::retired_pending() const {
  std::lock_guard<std::mutex> guard(mu_);
  return pending_.size();
}

}  // namespace gvm::detail
