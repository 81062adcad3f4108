#include "history.hpp"

#include <c10/cuda/CUDAFunctions.h>

#include <stack>
#include <stdexcept>

namespace gvm::torch_backend {

namespace {

using Action = cda::TraceEntry::Action;

// Per thread, as in PyTorch: the torch.compile region being run (its
// "Torch-Compiled Region" record_function) and the metadata set with
// torch.cuda.memory._set_memory_metadata.
thread_local std::stack<std::string> t_compile_context;
thread_local std::string t_user_metadata;

std::string compile_context() {
  return t_compile_context.empty() ? std::string("N/A") : t_compile_context.top();
}

bool valid_device(int device) {
  return device >= 0 && device < History::kMaxDevices;
}

}  // namespace

void History::configure(bool enabled, cda::CreateContextFn recorder, std::size_t max_entries,
                        cda::RecordContext when, bool clear,
                        const std::vector<std::string>& skip_actions) {
  if (when != cda::RecordContext::NEVER && recorder == nullptr) {
    throw std::invalid_argument("recording stacks needs a context recorder");
  }
  std::array<bool, 16> skip{};
  for (const std::string& a : skip_actions) {
    skip[static_cast<std::size_t>(cda::parseTraceEntryAction(a))] =
        true;  // throws for unknown names
  }
  std::lock_guard lock(mutex_);
  max_entries_ = std::max<std::size_t>(max_entries, 1);
  skip_ = skip;
  for (auto& r : rings_) {
    if (!r) continue;
    if (!enabled || clear) r->clear();
    r->set_capacity(max_entries_);
  }
  if (!enabled || clear) annotations_.clear();
  annotations_.set_capacity(max_entries_);
  recorder_.store(enabled ? recorder : nullptr, std::memory_order_relaxed);
  when_.store(static_cast<int>(enabled ? when : cda::RecordContext::NEVER),
              std::memory_order_relaxed);
  enabled_.store(enabled, std::memory_order_relaxed);
  recording_.store(enabled || !trackers_.empty(), std::memory_order_relaxed);
}

std::shared_ptr<c10::GatheredContext> History::context_for_alloc() const {
  if (when_.load(std::memory_order_relaxed) < static_cast<int>(cda::RecordContext::STATE))
    return nullptr;
  cda::CreateContextFn f = recorder_.load(std::memory_order_relaxed);
  return f != nullptr ? f() : nullptr;
}

std::shared_ptr<c10::GatheredContext> History::context_for_free() const {
  if (when_.load(std::memory_order_relaxed) < static_cast<int>(cda::RecordContext::ALL))
    return nullptr;
  cda::CreateContextFn f = recorder_.load(std::memory_order_relaxed);
  return f != nullptr ? f() : nullptr;
}

TraceRing<cda::TraceEntry>& History::ring_locked(int device) {
  auto& r = rings_[static_cast<std::size_t>(device)];
  if (!r) r = std::make_unique<TraceRing<cda::TraceEntry>>(max_entries_);
  return *r;
}

void History::record_locked(Action action, int device, std::uintptr_t addr, std::size_t size,
                            void* stream, MempoolKey pool,
                            std::shared_ptr<c10::GatheredContext> context) {
  if (!valid_device(device)) return;
  cda::TraceEntry e(action, static_cast<c10::DeviceIndex>(device), static_cast<std::size_t>(addr),
                    size, stream, c10::MempoolId_t{pool.first, pool.second},
                    c10::getApproximateTime(), std::move(context), compile_context(),
                    t_user_metadata);
  for (const auto& tracker : trackers_) tracker(e);
  if (!enabled_.load(std::memory_order_relaxed) || skip_[static_cast<std::size_t>(action)]) return;
  ring_locked(device).push(std::move(e));
}

void History::on_alloc(int device, std::uintptr_t addr, std::size_t size, void* stream,
                       MempoolKey pool, std::shared_ptr<c10::GatheredContext> context) {
  std::lock_guard lock(mutex_);
  if (context && valid_device(device))
    block_contexts_[static_cast<std::size_t>(device)][addr] = context;
  const bool trace_context =
      when_.load(std::memory_order_relaxed) >= static_cast<int>(cda::RecordContext::ALLOC);
  record_locked(Action::ALLOC, device, addr, size, stream, pool,
                trace_context ? std::move(context) : nullptr);
}

void History::on_free(int device, std::uintptr_t addr, std::size_t size, void* stream,
                      std::shared_ptr<c10::GatheredContext> context) {
  std::lock_guard lock(mutex_);
  if (valid_device(device)) block_contexts_[static_cast<std::size_t>(device)].erase(addr);
  // gvmalloc takes the block back at once; a later reuse by another stream
  // waits inside the allocator for the streams recorded on it. So the free
  // is requested and completed here, in one step.
  record_locked(Action::FREE_REQUESTED, device, addr, size, stream, {}, context);
  record_locked(Action::FREE_COMPLETED, device, addr, size, stream, {}, std::move(context));
}

void History::on_oom(int device, std::size_t device_free, std::size_t size, void* stream,
                     MempoolKey pool) {
  std::lock_guard lock(mutex_);
  record_locked(Action::OOM, device, device_free, size, stream, pool, nullptr);
}

void History::on_snapshot(int device) {
  std::lock_guard lock(mutex_);
  record_locked(Action::SNAPSHOT, device, 0, 0, nullptr, {}, nullptr);
}

std::shared_ptr<c10::GatheredContext> History::block_context(int device,
                                                             std::uintptr_t addr) const {
  if (!valid_device(device)) return nullptr;
  std::lock_guard lock(mutex_);
  const auto& m = block_contexts_[static_cast<std::size_t>(device)];
  auto it = m.find(addr);
  return it == m.end() ? nullptr : it->second;
}

void History::annotate(const std::vector<std::pair<std::string, std::string>>& md) {
  if (!enabled()) return;
  c10::DeviceIndex device = 0;
  if (c10::cuda::GetDevice(&device) != cudaSuccess) device = 0;
  cda::AnnotationEntry e(device, c10::getApproximateTime());
  for (const auto& [k, v] : md) e.recordUserMetadata(k, v);
  std::lock_guard lock(mutex_);
  annotations_.push(std::move(e));
}

void History::push_compile_context(const std::string& name) {
  t_compile_context.push(name);
}

void History::pop_compile_context() {
  if (!t_compile_context.empty()) t_compile_context.pop();
}

void History::set_user_metadata(const std::string& md) {
  t_user_metadata = md;
}
std::string History::user_metadata() {
  return t_user_metadata;
}

void History::attach_tracker(cda::AllocatorTraceTracker tracker) {
  std::lock_guard lock(mutex_);
  trackers_.push_back(std::move(tracker));
  recording_.store(true, std::memory_order_relaxed);
}

std::vector<std::vector<cda::TraceEntry>> History::traces(int device_count) const {
  std::lock_guard lock(mutex_);
  auto to_unix = clock_.makeConverter();
  std::vector<std::vector<cda::TraceEntry>> out(
      static_cast<std::size_t>(std::max(device_count, 0)));
  for (std::size_t d = 0; d < out.size() && d < rings_.size(); ++d) {
    if (!rings_[d]) continue;
    out[d] = rings_[d]->ordered();
    for (auto& e : out[d]) e.time_.t_ = to_unix(e.time_.approx_t_);
  }
  return out;
}

std::vector<cda::AnnotationEntry> History::annotations() const {
  std::lock_guard lock(mutex_);
  auto to_unix = clock_.makeConverter();
  std::vector<cda::AnnotationEntry> out = annotations_.ordered();
  for (auto& e : out) e.time_.t_ = to_unix(e.time_.approx_t_);
  return out;
}

}  // namespace gvm::torch_backend
