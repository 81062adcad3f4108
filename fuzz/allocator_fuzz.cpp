// libFuzzer target: the input bytes are a program of allocator operations
// over a SimDriver of 2-3 devices. After every step the allocator's
// invariants hold, the simulated context is alive (a sticky error means a
// fence failed to drain work before an unmap or an access change: a real
// bug) and no race was recorded (every access the fuzzer makes is ordered
// the way a correct caller orders it, so a race is the allocator's).
//
// Tiny config (256 MiB per device, 2 MiB chunks, or 8 MiB by a config bit)
// so that out-of-memory, the OOM retry and release paths run on short inputs.
//
// Driver faults: one op makes a driver call (cuMemCreate, cuMemMap,
// cuMemUnmap, cuMemRelease, an event's record or synchronize, a stream
// wait, ...) fail inside the next operation's call into the allocator. That operation may fail with
// the driver's error (or out of memory), but loses nothing: the invariants hold, the device holds
// exactly what the allocator counts as reserved (checked after every operation), and the blocks
// live before it can still be used and freed.
//
// Built two ways (fuzz/CMakeLists.txt): with clang -fsanitize=fuzzer as
// gvm-allocator-fuzz, and with GVM_FUZZ_STANDALONE as a plain program that
// replays files or directories (the committed corpus, as a CTest) without
// libFuzzer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace {

using gvm::vmm::AccessKind;
using gvm::vmm::Call;
using gvm::vmm::Result;
using gvm::vmm::SimDriver;
using gvm::vmm::StreamHandle;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kBudget = 256 * kMiB;
constexpr int kStreams = 3;  // per device: two created, the legacy one

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "allocator_fuzz: %s\n", why.c_str());
  std::abort();
}

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ == end_; }
  std::uint8_t byte() { return p_ == end_ ? 0 : *p_++; }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | byte();
    return v;
  }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

struct Block {
  void* ptr;
  std::size_t bytes;
  int device;
  int stream;  // the stream its work is ordered on now
  bool scratch;
};

class Run {
 public:
  explicit Run(Input& in) : in_(in) {
    const std::uint8_t head = in_.byte();
    static constexpr gvm::vmm::Profile kProfiles[] = {
        gvm::vmm::Profile::h200, gvm::vmm::Profile::a100, gvm::vmm::Profile::p40,
        gvm::vmm::Profile::v100, gvm::vmm::Profile::l4,   gvm::vmm::Profile::b200};
    devices_ = 2 + (head >> 7);
    sim_ = SimDriver::uniform(kProfiles[(head & 0x7f) % 6], devices_);
    for (int d = 0; d < devices_; ++d) {
      sim_->set_physical_budget(d, kBudget);
      for (int i = 0; i < kStreams - 1; ++i) {
        StreamHandle s = nullptr;
        if (sim_->stream_create(d, &s) != Result::success) fail("stream_create");
        streams_.push_back(s);
      }
      streams_.push_back(nullptr);  // the legacy default stream
    }
    const std::uint8_t flags = in_.byte();
    gvm::Config c;
    c.max_chunk_bytes = 2 * kMiB;
    c.scratch_chunk_bytes = 2 * kMiB;
    c.force_no_vmm = (flags & 1) != 0;
    if (flags & 2) c.release_threshold_bytes = 8 * kMiB;
    if (flags & 4) c.reserve_slack = -1;
    c.scratch_fence_tracked = (flags & 8) != 0;
    if (flags & 16) c.max_reserved_bytes = 96 * kMiB;
    // Chunks of several granules: a growth is cut into more than one chunk
    // only where a run is longer than a chunk, and only then does a block's
    // shared last granule get a chunk of its own (plan_chunks).
    if (flags & 32) c.max_chunk_bytes = 8 * kMiB;
    alloc_ = std::make_unique<gvm::Allocator>(*sim_, c);
  }

  ~Run() {
    alloc_.reset();
    for (int d = 0; d < devices_; ++d)
      for (int i = 0; i < kStreams - 1; ++i) (void)sim_->stream_destroy(d, stream(d, i));
  }

  void go() {
    for (int step = 0; !in_.done() && step < 4096; ++step) {
      if (faulty_) {
        // The operation a fault was injected for: it may fail with the
        // driver's error, nothing else, and must lose nothing.
        try {
          this->step();
        } catch (const gvm::vmm::DriverError&) {
        } catch (const gvm::out_of_memory&) {
        }
        sim_->clear_faults();
        faulty_ = false;
        check("after an operation with a driver fault");
        check_accounts("after an operation with a driver fault");
        continue;
      }
      this->step();
      check("after an operation");
      check_accounts("after an operation");
    }
    // Everything goes back (with no fault left waiting for an operation).
    sim_->clear_faults();
    for (const Block& b : blocks_) alloc_->deallocate(b.ptr, b.bytes, b.device, stream(b));
    blocks_.clear();
    check("after freeing everything");
    alloc_->trim();
    for (int d = 0; d < devices_; ++d)
      if (sim_->physical_used(d) != 0 || alloc_->device_stats(d).reserved_bytes != 0)
        fail("memory left after the last free and a trim on device " + std::to_string(d));
    alloc_.reset();
    if (sim_->live_reservations() != 0 || sim_->live_events() != 0 || sim_->live_mappings() != 0)
      fail("driver objects left after the allocator was destroyed");
  }

 private:
  StreamHandle stream(int device, int i) const {
    return streams_[static_cast<std::size_t>(device * kStreams + i)];
  }
  StreamHandle stream(const Block& b) const { return stream(b.device, b.stream); }

  // What the device holds is what the allocator counts as reserved.
  void check_accounts(const char* when) {
    for (int d = 0; d < devices_; ++d) {
      const std::size_t held = sim_->physical_used(d),
                        reserved = alloc_->device_stats(d).reserved_bytes;
      if (held != reserved)
        fail(std::string("device ") + std::to_string(d) + " holds " + std::to_string(held) +
             " bytes, the allocator reserves " + std::to_string(reserved) + " " + when);
    }
  }

  // The next operation's call into the allocator meets a failing driver
  // call (the first to fourth of its kind). Armed only around that call
  // (FaultScope): this program's own event and stream calls before and after
  // it must work.
  void inject_fault() {
    static constexpr Call kCalls[] = {
        Call::mem_create,   Call::mem_map,           Call::mem_set_access,
        Call::mem_unmap,    Call::mem_release,       Call::address_reserve,
        Call::address_free, Call::mem_alloc,         Call::mem_free,
        Call::event_query,  Call::event_synchronize, Call::enable_peer_access,
        Call::event_create, Call::event_record,      Call::stream_wait_event,
        Call::event_destroy};
    fault_call_ = kCalls[in_.byte() % (sizeof kCalls / sizeof kCalls[0])];
    fault_nth_ = 1 + in_.byte() % 4;
    fault_result_ = in_.byte() & 1 ? Result::out_of_memory : Result::unknown;
    faulty_ = true;
  }

  // Arms the pending fault for the allocator call made in its lifetime.
  class FaultScope {
   public:
    explicit FaultScope(Run& r) : r_(r) {
      if (r_.faulty_) r_.sim_->fail_call(r_.fault_call_, r_.fault_nth_, r_.fault_result_);
    }
    ~FaultScope() { r_.sim_->clear_faults(); }
    FaultScope(const FaultScope&) = delete;
    FaultScope& operator=(const FaultScope&) = delete;

   private:
    Run& r_;
  };

  void check(const char* when) {
    std::string why;
    if (!alloc_->check_invariants(&why)) fail(std::string("invariant broken ") + when + ": " + why);
    if (sim_->sticky_error() != Result::success)
      fail(std::string("sticky error ") + when + ": " +
           gvm::vmm::result_name(sim_->sticky_error()));
    if (sim_->race_count() != 0) fail(std::string("race ") + when + ": " + sim_->races().front());
  }

  std::size_t size() {
    const std::uint8_t k = in_.byte();
    const std::uint32_t r = in_.u32();
    switch (k % 4) {
      case 0: return 1 + r % 4096;           // tiny
      case 1: return 1 + r % (1 * kMiB);     // small classes
      case 2: return 1 + r % (16 * kMiB);    // large
      default: return 1 + r % (160 * kMiB);  // near the budget
    }
  }

  Block* pick() {
    if (blocks_.empty()) return nullptr;
    return &blocks_[in_.byte() % blocks_.size()];
  }

  void access(const Block& b, AccessKind kind) {
    const Result r = sim_->enqueue_access(
        b.device, stream(b), reinterpret_cast<gvm::vmm::DevicePtr>(b.ptr), b.bytes, kind);
    if (r != Result::success) fail("access to a live block: " + gvm::vmm::result_name(r));
  }

  // What a correct caller does before moving a block's work to stream `to`.
  void order(int device, StreamHandle from, StreamHandle to) {
    gvm::vmm::EventHandle e = nullptr;
    if (sim_->event_create(device, &e) != Result::success ||
        sim_->event_record(device, e, from) != Result::success ||
        sim_->stream_wait_event(device, to, e) != Result::success ||
        sim_->event_destroy(e) != Result::success)
      fail("user event");
  }

  template <class F>
  void expect_usage_error(const char* what, F&& f) {
    try {
      f();
    } catch (const gvm::usage_error&) {
      return;
    }
    fail(std::string(what) + " was accepted");
  }

  void allocate(bool scratch) {
    const std::size_t n = size();
    const int d = in_.byte() % devices_;
    const int s = in_.byte() % kStreams;
    try {
      void* p = nullptr;
      {
        FaultScope armed(*this);
        p = scratch ? alloc_->scratch_allocate(n, d, stream(d, s))
                    : alloc_->allocate(n, d, stream(d, s));
      }
      blocks_.push_back({p, n, d, s, scratch});
      if (in_.byte() & 1) access(blocks_.back(), AccessKind::write);
    } catch (const gvm::out_of_memory& e) {
      if (std::string(e.what()).empty()) fail("out_of_memory without a message");
    }
  }

  void free_block() {
    if (blocks_.empty()) return;
    const std::size_t i = in_.byte() % blocks_.size();
    const Block b = blocks_[i];
    const std::uint8_t how = in_.byte();
    if (how % 4 == 0) {
      // A size no class of this block can match: refused, nothing changes.
      expect_usage_error("a free with the wrong size", [&] {
        alloc_->deallocate(b.ptr, b.bytes + 2 * kMiB, b.device, stream(b));
      });
      check("after a refused free");
    }
    {
      FaultScope armed(*this);
      alloc_->deallocate(b.ptr, how % 8 == 1 ? gvm::kUnknownSize : b.bytes, b.device, stream(b));
    }
    blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
    if (how % 4 == 2)
      expect_usage_error("a double free",
                         [&] { alloc_->deallocate(b.ptr, b.bytes, b.device, stream(b)); });
  }

  void record_stream() {
    Block* b = pick();
    if (b == nullptr) return;
    const int to = in_.byte() % kStreams;
    if (to == b->stream) return;
    order(b->device, stream(*b), stream(b->device, to));
    {
      FaultScope armed(*this);
      alloc_->record_stream(b->ptr, stream(b->device, to));
    }
    b->stream = to;  // its work now goes on `to`, ordered after the old stream
    access(*b, AccessKind::write);
  }

  void peer_copy() {
    // From a scratch block to a block of another device, on the latter's
    // stream; the caller then waits for the copy (a peer's work must be
    // finished before the source is freed).
    Block* src = pick();
    Block* dst = pick();
    if (src == nullptr || dst == nullptr || !src->scratch || src->device == dst->device) return;
    const std::size_t n = std::min(src->bytes, dst->bytes);
    if (sim_->stream_synchronize(src->device, stream(*src)) != Result::success)
      fail("stream_synchronize");
    {
      FaultScope armed(*this);
      alloc_->record_stream(src->ptr, stream(*dst), dst->device);
      alloc_->peer_copy(dst->ptr, dst->device, src->ptr, src->device, n, stream(*dst));
    }
    if (sim_->stream_synchronize(dst->device, stream(*dst)) != Result::success)
      fail("stream_synchronize");
  }

  void step() {
    const std::uint8_t op = in_.byte();
    switch (op % 13) {
      case 0:
      case 1: allocate(false); break;
      case 2: free_block(); break;
      case 3: record_stream(); break;
      case 4: {
        const int d = static_cast<int>(in_.byte() % (devices_ + 1)) - 1;
        FaultScope armed(*this);
        alloc_->trim(d);
        break;
      }
      case 5: allocate(true); break;
      case 6: {
        static constexpr gvm::PeerPolicy kPolicies[] = {
            gvm::PeerPolicy::automatic, gvm::PeerPolicy::per_allocation, gvm::PeerPolicy::global,
            gvm::PeerPolicy::none};
        const gvm::PeerPolicy policy = kPolicies[in_.byte() % 4];
        FaultScope armed(*this);
        alloc_->set_peer_policy(policy);
        break;
      }
      case 7:
        if (Block* b = pick()) access(*b, in_.byte() & 1 ? AccessKind::write : AccessKind::read);
        break;
      case 8: {
        const int d = in_.byte() % devices_;
        if (sim_->stream_synchronize(d, stream(d, in_.byte() % kStreams)) != Result::success)
          fail("stream_synchronize");
        break;
      }
      case 9: sim_->complete_all(); break;
      case 10: peer_copy(); break;
      case 12: inject_fault(); break;  // 12, not 11: the seeds' ops 0-11 keep their meaning
      default: {
        // Bad input that must change nothing.
        int local = 0;
        expect_usage_error("a foreign pointer", [&] { alloc_->deallocate(&local, 4, 0, nullptr); });
        expect_usage_error("size 0", [&] { (void)alloc_->allocate(0, 0, nullptr); });
        expect_usage_error("no such device",
                           [&] { (void)alloc_->allocate(64, devices_, nullptr); });
        if (Block* b = pick(); b != nullptr && b->bytes > 512)
          expect_usage_error("an interior pointer", [&] {
            alloc_->deallocate(static_cast<char*>(b->ptr) + 512, gvm::kUnknownSize, b->device,
                               stream(*b));
          });
        break;
      }
    }
  }

  Input& in_;
  int devices_ = 2;
  std::unique_ptr<SimDriver> sim_;
  std::vector<StreamHandle> streams_;
  std::unique_ptr<gvm::Allocator> alloc_;
  std::vector<Block> blocks_;
  // A driver fault waiting for the next operation's call into the allocator.
  bool faulty_ = false;
  Call fault_call_ = Call::mem_create;
  int fault_nth_ = 1;
  Result fault_result_ = Result::unknown;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  try {
    Run run(in);
    run.go();
  } catch (const std::exception& e) {
    // Driver errors happen only where a fault was injected (Run::go);
    // usage errors only where the program asks for them.
    fail(std::string("unexpected exception: ") + e.what());
  }
  return 0;
}

#ifdef GVM_FUZZ_STANDALONE
// Replays files, or every file of directories, without libFuzzer.
#include <filesystem>
#include <fstream>
#include <iterator>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.emplace_back(argv[i]);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s <file or directory>...\n", argv[0]);
    return 2;
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("allocator_fuzz: replayed %zu inputs\n", files.size());
  return 0;
}
#endif
