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


// Two threads on one stream, blocks that straddle granules (a growing block
// shares its edge granules with its neighbours), a third trimming: a chunk
// mapped by one block's growth lies under a neighbour still on its way to
// its own growth. Its count of blocks must not read zero to a release then
// (it did: the chunk was unmapped under the live neighbour, which a GPU
// faults on). The outcome is checked after every round.
TEST(ThreadStress, GrowingNeighboursOnOneStreamWithATrim) {
  auto sim = vmm::SimDriver::uniform(vmm::Profile::h200, 1);
  StreamHandle s = nullptr;
  ASSERT_EQ(sim->stream_create(0, &s), Result::success);
  Config c;
  c.max_chunk_bytes = 2 * kMiB;
  c.release_threshold_bytes = 0;  // every free above nothing gives back
  auto alloc = std::make_unique<Allocator>(*sim, c);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    while (!stop.load(std::memory_order_relaxed)) {
      // 1-3 MiB and an odd tail: neither end on a granule boundary.
      const std::size_t n = kMiB + rng() % (2 * kMiB) + 4096 * (1 + rng() % 100);
      try {
        void* p = alloc->allocate(n, 0, s);
        // The GPU writes it: all of it must be mapped now.
        const Result r = sim->enqueue_access(0, s, reinterpret_cast<vmm::DevicePtr>(p), n,
                                             vmm::AccessKind::write);
        if (r != Result::success) {
          if (failures++ == 0) ADD_FAILURE() << "a kernel on a fresh block: " << vmm::result_name(r);
          return;
        }
        alloc->deallocate(p, n, 0, s);
      } catch (const std::exception& e) {
        if (failures++ == 0) ADD_FAILURE() << e.what();
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 2; ++t) threads.emplace_back(worker, 17u + t);
  std::thread trimmer([&] {
    for (int i = 0; i < 4000 && failures.load() == 0; ++i) alloc->trim();
    stop = true;
  });
  trimmer.join();
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::string why;
  EXPECT_TRUE(alloc->check_invariants(&why)) << why;
  EXPECT_EQ(sim->race_count(), 0u);
  alloc->trim();
  EXPECT_EQ(sim->physical_used(0), 0u);
  alloc.reset();
  (void)sim->stream_destroy(0, s);
}

}  // namespace
}  // namespace gvm::test
