// A test-and-test-and-set spin lock for the per-stream caches: their critical
// sections are a few dozen instructions, where a futex-based mutex costs more
// than the work it guards.
#pragma once

#include <atomic>
#include <thread>

namespace gvm::detail {

class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0;; ++spins) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace gvm::detail
