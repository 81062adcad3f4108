// Threads allocating, freeing, recording streams and trimming on shared
// devices with several streams each: the test the TSan build runs
// (.ci/run). It also runs in the plain suite, where it checks the outcome:
// invariants, no race or sticky error in the simulator, everything back.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {
namespace {

using vmm::Result;
using vmm::StreamHandle;

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(ThreadStress, AllocateFreeRecordTrimOnSharedDevices) {
  constexpr int kDevices = 2;
  constexpr int kThreads = 6;
  constexpr int kStreamsPerDevice = 3;
  constexpr int kSteps = 3000;
  auto sim = vmm::SimDriver::uniform(vmm::Profile::h200, kDevices);
  for (int d = 0; d < kDevices; ++d) sim->set_physical_budget(d, 512 * kMiB);
  std::vector<StreamHandle> streams;
  for (int d = 0; d < kDevices; ++d)
    for (int i = 0; i < kStreamsPerDevice; ++i) {
      StreamHandle s = nullptr;
      ASSERT_EQ(sim->stream_create(d, &s), Result::success);
      streams.push_back(s);
    }
  Config c;
  c.max_chunk_bytes = 2 * kMiB;
  c.scratch_chunk_bytes = 2 * kMiB;
  c.release_threshold_bytes = 64 * kMiB;
  auto alloc = std::make_unique<Allocator>(*sim, c);
  std::atomic<int> failures{0};
  std::atomic<int> ooms{0};

  auto worker = [&](int t) {
    std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1u);
    struct Held {
      void* p;
      std::size_t n;
      int device;
      StreamHandle stream;
    };
    std::vector<Held> held;
    // Threads share devices and streams: thread t prefers device t % 2.
    for (int step = 0; step < kSteps; ++step) {
      const int d = static_cast<int>((t + (rng() % 4 == 0 ? 1 : 0)) % kDevices);
      StreamHandle s = streams[static_cast<std::size_t>(
          d * kStreamsPerDevice + static_cast<int>(rng() % kStreamsPerDevice))];
      const unsigned op = rng() % 16;
      try {
        if (op < 7 || held.empty()) {
          const std::size_t n = rng() % 4 == 0 ? 1 + rng() % (8 * kMiB) : 1 + rng() % 65536;
          void* p = rng() % 16 == 0 ? alloc->scratch_allocate(n, d, s) : alloc->allocate(n, d, s);
          held.push_back({p, n, d, s});
        } else if (op < 13) {
          const std::size_t i = rng() % held.size();
          alloc->deallocate(held[i].p, held[i].n, held[i].device, held[i].stream);
          held[i] = held.back();
          held.pop_back();
        } else if (op < 15) {
          const Held& h = held[rng() % held.size()];
          alloc->record_stream(
              h.p, streams[static_cast<std::size_t>(h.device * kStreamsPerDevice +
                                                    static_cast<int>(rng() % kStreamsPerDevice))]);
        } else {
          alloc->trim(rng() % 2 == 0 ? -1 : d);
          (void)alloc->stats();
        }
      } catch (const out_of_memory&) {
        ++ooms;
      } catch (const std::exception& e) {
        ++failures;
        ADD_FAILURE() << "thread " << t << ": " << e.what();
        return;
      }
    }
    for (const Held& h : held) alloc->deallocate(h.p, h.n, h.device, h.stream);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  EXPECT_EQ(failures.load(), 0);
  std::string why;
  EXPECT_TRUE(alloc->check_invariants(&why)) << why;
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(alloc->device_stats(d).live_bytes, 0u);
  alloc->trim();
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(sim->physical_used(d), 0u) << "device " << d;
  alloc.reset();
  EXPECT_EQ(sim->live_reservations(), 0u);
  EXPECT_EQ(sim->sticky_error(), Result::success);
  EXPECT_EQ(sim->race_count(), 0u);
  for (int d = 0; d < kDevices; ++d)
    for (int i = 0; i < kStreamsPerDevice; ++i)
      (void)sim->stream_destroy(d, streams[static_cast<std::size_t>(d * kStreamsPerDevice + i)]);
  std::printf("[ stress   ] %d threads x %d steps, %d out-of-memory answers\n", kThreads, kSteps,
              ooms.load());
}

}  // namespace
}  // namespace gvm::test
