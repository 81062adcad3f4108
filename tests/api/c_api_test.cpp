// The C ABI (gvm.h) over the simulated driver: round trips, and every bad
// input returns the right status, says why, and changes nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "c_api_errors.hpp"
#include "gvm/errors.hpp"
#include "gvm/gvm.h"
#include "gvm/process_allocator.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "json_check.hpp"

extern "C" int gvm_c_round_trip(void);  // c_header_check.c

// At global scope, where the argument type lives, so std::vector's == finds it.
static bool operator==(const gvm_device_stats_t& a, const gvm_device_stats_t& b) {
#define GVM_STATS_EQ(type, name, doc) a.name == b.name&&
  return GVM_DEVICE_STATS_FIELDS(GVM_STATS_EQ) true;
#undef GVM_STATS_EQ
}

namespace gvm {
namespace {

using test::Json;
using test::JsonReader;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Sets GVM_CONF for one test (nullptr: unset) and restores it afterwards.
class ScopedConfEnv {
 public:
  explicit ScopedConfEnv(const char* value) {
    if (const char* v = std::getenv("GVM_CONF")) saved_ = v, had_ = true;
    if (value != nullptr) {
      setenv("GVM_CONF", value, 1);
    } else {
      unsetenv("GVM_CONF");
    }
  }
  ~ScopedConfEnv() {
    if (had_) {
      setenv("GVM_CONF", saved_.c_str(), 1);
    } else {
      unsetenv("GVM_CONF");
    }
  }

 private:
  std::string saved_;
  bool had_ = false;
};

// The stats JSON, without touching the thread's last failure (a size query
// would record one).
std::string stats_json() {
  std::string buf(std::size_t{1} << 20, '\0');
  std::size_t needed = 0;
  EXPECT_EQ(gvm_stats_json(buf.data(), buf.size(), &needed), GVM_OK) << gvm_last_error();
  buf.resize(needed == 0 ? 0 : needed - 1);
  return buf;
}

// What a failed call must leave as it was: every device's counters, and the
// driver calls made so far (a refused call makes none).
struct Snapshot {
  std::vector<gvm_device_stats_t> devices;
  std::string driver_calls;  // {"cuMemCreate":n,...}, counts only (times vary)

  bool operator==(const Snapshot& o) const {
    return devices == o.devices && driver_calls == o.driver_calls;
  }
};

Snapshot snapshot(int device_count) {
  Snapshot s;
  for (int d = 0; d < device_count; ++d) {
    gvm_device_stats_t one{};
    EXPECT_EQ(gvm_device_stats(d, &one), GVM_OK) << gvm_last_error();
    s.devices.push_back(one);
  }
  Json j;
  std::string why;
  const std::string text = stats_json();
  EXPECT_TRUE(JsonReader::parse(text, &j, &why)) << why;
  if (const Json* calls = j.find("driver_calls")) {
    for (const auto& [name, entry] : calls->members) {
      if (const Json* n = entry.find("calls")) s.driver_calls += name + ":" + n->text + ",";
    }
  }
  return s;
}

std::string describe(const Snapshot& s) {
  std::string out;
  for (const auto& d : s.devices) {
    out += "device " + std::to_string(d.device) + ": live " + std::to_string(d.live_bytes) +
           " reserved " + std::to_string(d.reserved_bytes) + " allocs " +
           std::to_string(d.allocations) + " frees " + std::to_string(d.frees) + "\n";
  }
  return out + "driver calls: " + s.driver_calls;
}

// Expects the last call to have failed with `status` and a message that
// mentions `fragment`; then forgets it.
#define EXPECT_FAILED_WITH(status, fragment)                                   \
  do {                                                                         \
    EXPECT_EQ(gvm_last_status(), (status))                                     \
        << gvm_status_name(gvm_last_status()) << ": " << gvm_last_error();     \
    EXPECT_NE(std::string(gvm_last_error()).find(fragment), std::string::npos) \
        << "message: " << gvm_last_error();                                    \
    gvm_clear_last_error();                                                    \
  } while (0)

class CApi : public ::testing::Test {
 protected:
  static constexpr int kDevices = 2;

  void SetUp() override {
    if (gvm_is_initialized()) (void)gvm_shutdown();
    gvm_clear_last_error();
  }
  void TearDown() override {
    if (gvm_is_initialized()) (void)gvm_shutdown();
    gvm_clear_last_error();
  }
  void start(const char* conf = nullptr) {
    ASSERT_EQ(gvm_init_simulated("h200", kDevices, conf), GVM_OK) << gvm_last_error();
  }

  ScopedConfEnv env_{nullptr};
};

TEST_F(CApi, StatusNames) {
  EXPECT_STREQ(gvm_status_name(GVM_OK), "GVM_OK");
  EXPECT_STREQ(gvm_status_name(GVM_ERROR_OUT_OF_MEMORY), "GVM_ERROR_OUT_OF_MEMORY");
  EXPECT_STREQ(gvm_status_name(GVM_ERROR_INTERNAL), "GVM_ERROR_INTERNAL");
  EXPECT_STREQ(gvm_status_name(static_cast<gvm_status>(15)), "GVM_ERROR_UNKNOWN_STATUS");
  EXPECT_EQ(gvm_last_status(), GVM_OK);
  EXPECT_STREQ(gvm_last_error(), "");
}

TEST_F(CApi, EveryCallBeforeInitSaysNotInitialized) {
  ASSERT_EQ(gvm_is_initialized(), 0);
  int local = 0;
  EXPECT_EQ(gvm_malloc(1024, 0, nullptr), nullptr);
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "gvm_malloc: gvmalloc is not initialized");
  EXPECT_EQ(gvm_free(&local, 4, 0, nullptr), GVM_ERROR_NOT_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "gvm_free:");
  EXPECT_EQ(gvm_record_stream(&local, nullptr), GVM_ERROR_NOT_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "gvm_record_stream:");
  EXPECT_EQ(gvm_trim(-1), GVM_ERROR_NOT_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "gvm_trim:");
  std::size_t needed = 7;
  EXPECT_EQ(gvm_stats_json(nullptr, 0, &needed), GVM_ERROR_NOT_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "gvm_stats_json:");
  gvm_device_stats_t s{};
  EXPECT_EQ(gvm_device_stats(0, &s), GVM_ERROR_NOT_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "gvm_device_stats:");
  EXPECT_EQ(gvm_shutdown(), GVM_ERROR_NOT_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "gvm_shutdown:");
  // A free never starts the allocator: with none running, the pointer is not ours.
  testing::internal::CaptureStderr();
  gvm_torch_free(&local, 4, 0, nullptr);
  gvm_cupy_free(0, reinterpret_cast<intptr_t>(&local), 0);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(gvm_is_initialized(), 0);
  EXPECT_NE(err.find("gvmalloc: gvm_torch_free: gvmalloc is not initialized"), std::string::npos)
      << err;
  EXPECT_NE(err.find("gvmalloc: gvm_cupy_free: gvmalloc is not initialized"), std::string::npos)
      << err;
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "gvm_cupy_free");
}

TEST_F(CApi, InitTwiceIsRefusedAndChangesNothing) {
  start();
  void* p = gvm_malloc(4096, 1, nullptr);
  ASSERT_NE(p, nullptr) << gvm_last_error();
  const Snapshot before = snapshot(kDevices);
  EXPECT_EQ(gvm_init_simulated("h200", kDevices, nullptr), GVM_ERROR_ALREADY_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_ALREADY_INITIALIZED, "already initialized");
  EXPECT_EQ(gvm_init_simulated("a100", 4, "fence:false"), GVM_ERROR_ALREADY_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_ALREADY_INITIALIZED, "gvm_init_simulated: ");
  EXPECT_EQ(gvm_init(nullptr), GVM_ERROR_ALREADY_INITIALIZED);
  EXPECT_FAILED_WITH(GVM_ERROR_ALREADY_INITIALIZED, "gvm_init: ");
  EXPECT_EQ(gvm_is_initialized(), 1);
  const Snapshot after = snapshot(kDevices);
  EXPECT_TRUE(before == after) << describe(before) << "\n" << describe(after);
  EXPECT_EQ(gvm_free(p, 4096, 1, nullptr), GVM_OK) << gvm_last_error();
}

TEST_F(CApi, BadInitArgumentsAreRefusedAndStartNothing) {
  EXPECT_EQ(gvm_init_simulated(nullptr, 2, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "profile is NULL");
  EXPECT_EQ(gvm_init_simulated("h300", 2, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "h300");
  EXPECT_EQ(gvm_init_simulated("h200", 0, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "device_count 0");
  EXPECT_EQ(gvm_init_simulated("h200", -3, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "device_count -3");
  EXPECT_EQ(gvm_init_simulated("h200", 2, "chunk:2MiB"), GVM_ERROR_CONFIG);
  EXPECT_FAILED_WITH(GVM_ERROR_CONFIG, "gvm_init_simulated: conf: unknown key \"chunk\"");
  EXPECT_EQ(gvm_init_simulated("h200", 2, "max_chunk_size:3MiB"), GVM_ERROR_CONFIG);
  EXPECT_FAILED_WITH(GVM_ERROR_CONFIG, "for max_chunk_size");
  // A bad config is reported before the driver is looked for, GPU or not.
  EXPECT_EQ(gvm_init("max_reserved:12Q"), GVM_ERROR_CONFIG);
  EXPECT_FAILED_WITH(GVM_ERROR_CONFIG, "bad value \"12Q\" for max_reserved");
  {
    ScopedConfEnv bad("fence:maybe");
    EXPECT_EQ(gvm_init_simulated("h200", 2, nullptr), GVM_ERROR_CONFIG);
    EXPECT_FAILED_WITH(GVM_ERROR_CONFIG,
                       "gvm_init_simulated: GVM_CONF: bad value \"maybe\" for fence");
    // `conf` is parsed over GVM_CONF, so a bad GVM_CONF fails even with a good conf.
    EXPECT_EQ(gvm_init_simulated("h200", 2, "fence:true"), GVM_ERROR_CONFIG);
    EXPECT_FAILED_WITH(GVM_ERROR_CONFIG, "\"maybe\" for fence");
  }
  EXPECT_EQ(gvm_is_initialized(), 0);
}

TEST_F(CApi, ConfIsAppliedOverGvmConf) {
  ScopedConfEnv env("max_chunk_size:4MiB,small_max:4KiB");
  start("small_max:8KiB");
  Json j;
  std::string why;
  const std::string text = stats_json();
  ASSERT_TRUE(JsonReader::parse(text, &j, &why)) << why;
  const Json* config = j.find("config");
  ASSERT_NE(config, nullptr) << text;
  EXPECT_NE(config->text.find("max_chunk_size:4MiB,"), std::string::npos) << config->text;
  EXPECT_NE(config->text.find("small_max:8KiB,"), std::string::npos) << config->text;
}

TEST_F(CApi, InitOnTheRealDriverWorksOrSaysWhyNot) {
  const gvm_status st = gvm_init("small_max:4KiB");
  if (st == GVM_OK) {
    EXPECT_EQ(gvm_is_initialized(), 1);
    EXPECT_EQ(gvm_shutdown(), GVM_OK);
    GTEST_SKIP() << "a CUDA driver is present: the no-driver path is not reachable here";
  }
  EXPECT_EQ(st, GVM_ERROR_NO_DRIVER) << gvm_last_error();
  EXPECT_FAILED_WITH(GVM_ERROR_NO_DRIVER, "gvm_init: ");
  EXPECT_EQ(gvm_is_initialized(), 0);
}

TEST_F(CApi, MallocFreeRoundTrips) {
  start("small_max:64KiB");
  struct Block {
    void* p;
    std::size_t size;
    int device;
  };
  std::vector<Block> blocks;
  for (int device = 0; device < kDevices; ++device) {
    for (std::size_t size :
         {std::size_t{1}, std::size_t{512}, std::size_t{1000}, std::size_t{64} << 10,
          std::size_t{3} * kMiB, std::size_t{200} * kMiB}) {
      void* p = gvm_malloc(size, device, nullptr);
      ASSERT_NE(p, nullptr) << size << " on " << device << ": " << gvm_last_error();
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
      blocks.push_back({p, size, device});
    }
  }
  gvm_device_stats_t s0{};
  ASSERT_EQ(gvm_device_stats(0, &s0), GVM_OK);
  EXPECT_EQ(s0.device, 0);
  EXPECT_EQ(s0.allocations, 6u);
  EXPECT_GE(s0.live_bytes, 1 + 512 + 1000 + (64u << 10) + 3 * kMiB + 200 * kMiB);
  EXPECT_GE(s0.reserved_bytes, s0.live_bytes);
  // Half freed with their size, half with 0 ("unknown", as CuPy frees).
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    EXPECT_EQ(gvm_free(b.p, i % 2 == 0 ? b.size : 0, b.device, nullptr), GVM_OK)
        << gvm_last_error();
  }
  for (int device = 0; device < kDevices; ++device) {
    gvm_device_stats_t s{};
    ASSERT_EQ(gvm_device_stats(device, &s), GVM_OK);
    EXPECT_EQ(s.live_bytes, 0u);
    EXPECT_EQ(s.frees, 6u);
    EXPECT_GE(s.peak_live_bytes, 200 * kMiB);
  }
  // A freed block is reused: same size, same stream, no new memory.
  void* again = gvm_malloc(3 * kMiB, 0, nullptr);
  ASSERT_NE(again, nullptr);
  gvm_device_stats_t s1{};
  ASSERT_EQ(gvm_device_stats(0, &s1), GVM_OK);
  EXPECT_EQ(s1.reserved_bytes, s0.reserved_bytes);
  EXPECT_EQ(gvm_free(again, 3 * kMiB, 0, nullptr), GVM_OK);
  EXPECT_EQ(gvm_last_status(), GVM_OK) << gvm_last_error();
}

TEST_F(CApi, ProcessAllocatorIsTheOneTheCEntryPointsServe) {
  start();
  Allocator& a = process_allocator();
  EXPECT_EQ(a.device_count(), kDevices);
  // A block from the C ABI is a block of the C++ allocator, and back.
  void* p = gvm_malloc(5 * kMiB, 1, nullptr);
  ASSERT_NE(p, nullptr) << gvm_last_error();
  EXPECT_EQ(a.device_stats(1).allocations, 1u);
  void* q = a.allocate(3000, 1, nullptr);
  gvm_device_stats_t s{};
  ASSERT_EQ(gvm_device_stats(1, &s), GVM_OK);
  EXPECT_EQ(s.allocations, 2u);
  a.deallocate(p, 5 * kMiB, 1, nullptr);
  EXPECT_EQ(gvm_free(q, 3000, 1, nullptr), GVM_OK) << gvm_last_error();
  EXPECT_EQ(a.device_stats(1).live_bytes, 0u);
  EXPECT_EQ(&process_allocator(), &a);
}

TEST_F(CApi, ForgetStream) {
  EXPECT_EQ(gvm_forget_stream(reinterpret_cast<void*>(0x1234)), GVM_OK) << "nothing running";
  start();
  void* q = gvm_malloc(3 * kMiB, 0, nullptr);
  ASSERT_NE(q, nullptr) << gvm_last_error();
  EXPECT_EQ(gvm_free(q, 3 * kMiB, 0, nullptr), GVM_OK);
  EXPECT_EQ(gvm_forget_stream(reinterpret_cast<void*>(0x999)), GVM_OK) << "a stream never seen";
  // The legacy stream is forgotten too (a caller's mistake, not fatal): the
  // next use makes a new state and the block freed above is still reusable.
  EXPECT_EQ(gvm_forget_stream(nullptr), GVM_OK);
  void* r = gvm_malloc(3 * kMiB, 0, nullptr);
  ASSERT_NE(r, nullptr) << gvm_last_error();
  EXPECT_EQ(gvm_free(r, 3 * kMiB, 0, nullptr), GVM_OK);
  EXPECT_EQ(gvm_last_status(), GVM_OK) << gvm_last_error();
}

TEST_F(CApi, BadFreesAreRefusedAndChangeNothing) {
  start();
  void* p = gvm_malloc(10000, 0, nullptr);
  ASSERT_NE(p, nullptr) << gvm_last_error();
  void* q = gvm_malloc(4 * kMiB, 1, nullptr);
  ASSERT_NE(q, nullptr) << gvm_last_error();
  void* gone = gvm_malloc(2048, 0, nullptr);
  ASSERT_NE(gone, nullptr);
  ASSERT_EQ(gvm_free(gone, 2048, 0, nullptr), GVM_OK);
  int local = 0;
  auto* interior = static_cast<char*>(p) + 512;

  const Snapshot before = snapshot(kDevices);
  struct Case {
    const char* what;
    void* ptr;
    std::size_t size;
    int device;
    const char* fragment;
  };
  const Case cases[] = {
      {"NULL", nullptr, 100, 0, "gvm_free: ptr is NULL"},
      {"double free", gone, 2048, 0, "gvm_free: "},
      {"double free, size unknown", gone, 0, 0, "gvm_free: "},
      {"unknown pointer", &local, sizeof local, 0, "gvm_free: "},
      {"interior pointer", interior, 100, 0, "gvm_free: "},
      // Small blocks are checked by size class (their slots keep no size),
      // large blocks exactly.
      {"size of another class", p, 100, 0, "gvm_free: "},
      {"size of another class, larger", p, 20000, 0, "gvm_free: "},
      {"large block, size one short", q, 4 * kMiB - 1, 1, "gvm_free: "},
      {"large block, size one over", q, 4 * kMiB + 1, 1, "gvm_free: "},
      {"wrong device", p, 10000, 1, "gvm_free: "},
      {"device -1", p, 10000, -1, "no device -1"},
      {"device 99", p, 10000, 99, "no device 99"},
      {"other device's block, wrong device", q, 4 * kMiB, 0, "gvm_free: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(gvm_free(c.ptr, c.size, c.device, nullptr), GVM_ERROR_INVALID_ARGUMENT);
    EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, c.fragment);
    const Snapshot after = snapshot(kDevices);
    EXPECT_TRUE(before == after) << describe(before) << "\n" << describe(after);
  }
  // The blocks survived every bad call and free normally.
  EXPECT_EQ(gvm_free(p, 10000, 0, nullptr), GVM_OK) << gvm_last_error();
  EXPECT_EQ(gvm_free(q, 4 * kMiB, 1, nullptr), GVM_OK) << gvm_last_error();
}

TEST_F(CApi, BadMallocsAreRefusedAndChangeNothing) {
  start();
  void* keep = gvm_malloc(4096, 0, nullptr);
  ASSERT_NE(keep, nullptr);
  const Snapshot before = snapshot(kDevices);
  struct Case {
    const char* what;
    std::size_t size;
    int device;
    gvm_status status;
    const char* fragment;
  };
  const Case cases[] = {
      {"size 0", 0, 0, GVM_ERROR_INVALID_ARGUMENT, "gvm_malloc: size is 0"},
      {"SIZE_MAX", SIZE_MAX, 0, GVM_ERROR_INVALID_ARGUMENT, "gvm_malloc: "},
      {"SIZE_MAX - 511", SIZE_MAX - 511, 1, GVM_ERROR_INVALID_ARGUMENT, "gvm_malloc: "},
      {"device -1", 4096, -1, GVM_ERROR_INVALID_ARGUMENT, "no device -1"},
      {"device 99", 4096, 99, GVM_ERROR_INVALID_ARGUMENT, "no device 99"},
      {"device 2 of 2", 4096, 2, GVM_ERROR_INVALID_ARGUMENT, "no device 2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(gvm_malloc(c.size, c.device, nullptr), nullptr);
    EXPECT_FAILED_WITH(c.status, c.fragment);
    const Snapshot after = snapshot(kDevices);
    EXPECT_TRUE(before == after) << describe(before) << "\n" << describe(after);
  }
  EXPECT_EQ(gvm_free(keep, 4096, 0, nullptr), GVM_OK);
}

TEST_F(CApi, OutOfMemoryNamesTheRequest) {
  start("max_reserved:64MiB,max_chunk_size:32MiB");
  void* big = gvm_malloc(48 * kMiB, 0, nullptr);
  ASSERT_NE(big, nullptr) << gvm_last_error();
  const Snapshot before = snapshot(kDevices);
  EXPECT_EQ(gvm_malloc(32 * kMiB, 0, nullptr), nullptr);
  EXPECT_EQ(gvm_last_status(), GVM_ERROR_OUT_OF_MEMORY) << gvm_last_error();
  EXPECT_NE(std::string(gvm_last_error()).find("gvm_malloc: "), std::string::npos);
  gvm_clear_last_error();
  gvm_device_stats_t s{};
  ASSERT_EQ(gvm_device_stats(0, &s), GVM_OK);
  EXPECT_EQ(s.live_bytes, before.devices[0].live_bytes);
  EXPECT_LE(s.reserved_bytes, 64 * kMiB);
  // The other device has its own cap.
  void* other = gvm_malloc(32 * kMiB, 1, nullptr);
  EXPECT_NE(other, nullptr) << gvm_last_error();
  EXPECT_EQ(gvm_free(other, 32 * kMiB, 1, nullptr), GVM_OK);
  EXPECT_EQ(gvm_free(big, 48 * kMiB, 0, nullptr), GVM_OK);
}

TEST_F(CApi, TorchEntryPoints) {
  start();
  void* p = gvm_torch_malloc(1 << 20, 1, nullptr);
  ASSERT_NE(p, nullptr) << gvm_last_error();
  gvm_device_stats_t s{};
  ASSERT_EQ(gvm_device_stats(1, &s), GVM_OK);
  EXPECT_EQ(s.allocations, 1u);
  testing::internal::CaptureStderr();
  gvm_torch_free(p, 1 << 20, 1, nullptr);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(gvm_last_status(), GVM_OK) << gvm_last_error();
  ASSERT_EQ(gvm_device_stats(1, &s), GVM_OK);
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.frees, 1u);

  // Size 0: PyTorch's empty tensors get NULL, not an error, and free it quietly.
  EXPECT_EQ(gvm_torch_malloc(0, 0, nullptr), nullptr);
  EXPECT_EQ(gvm_last_status(), GVM_OK);
  testing::internal::CaptureStderr();
  gvm_torch_free(nullptr, 0, 0, nullptr);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(gvm_last_status(), GVM_OK);

  const Snapshot before = snapshot(kDevices);
  testing::internal::CaptureStderr();
  EXPECT_EQ(gvm_torch_malloc(-1, 0, nullptr), nullptr);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_torch_malloc: size -1 is negative");
  EXPECT_EQ(err, "gvmalloc: gvm_torch_malloc: size -1 is negative\n");

  testing::internal::CaptureStderr();
  EXPECT_EQ(gvm_torch_malloc(4096, 7, nullptr), nullptr);
  err = testing::internal::GetCapturedStderr();
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "no device 7");
  EXPECT_NE(err.find("gvmalloc: gvm_torch_malloc: no device 7"), std::string::npos) << err;

  // A failed free cannot return a code: the status is recorded and one line
  // goes to stderr.
  testing::internal::CaptureStderr();
  gvm_torch_free(p, 1 << 20, 1, nullptr);  // double free
  err = testing::internal::GetCapturedStderr();
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_torch_free: ");
  EXPECT_EQ(err.rfind("gvmalloc: gvm_torch_free: ", 0), 0u) << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "one line: " << err;

  testing::internal::CaptureStderr();
  gvm_torch_free(p, -5, 1, nullptr);
  err = testing::internal::GetCapturedStderr();
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "size -5 is negative");
  EXPECT_FALSE(err.empty());

  const Snapshot after = snapshot(kDevices);
  EXPECT_TRUE(before == after) << describe(before) << "\n" << describe(after);
}

TEST_F(CApi, TorchEntryPointsStartLazilyFromGvmConf) {
  {
    // A bad GVM_CONF: the lazy start fails with CONFIG, on any machine.
    ScopedConfEnv bad("max_chunk_size:1KiB");
    testing::internal::CaptureStderr();
    EXPECT_EQ(gvm_torch_malloc(4096, 0, nullptr), nullptr);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_FAILED_WITH(GVM_ERROR_CONFIG, "\"1KiB\" for max_chunk_size");
    EXPECT_NE(err.find("gvmalloc: gvm_torch_malloc: GVM_CONF: bad value"), std::string::npos)
        << err;
    EXPECT_EQ(gvm_is_initialized(), 0);
  }
  void* p = gvm_torch_malloc(4096, 0, nullptr);
  if (p == nullptr) {
    // No GPU here: the lazy start on the real driver says so.
    EXPECT_FAILED_WITH(GVM_ERROR_NO_DRIVER, "gvm_torch_malloc: ");
    EXPECT_EQ(gvm_is_initialized(), 0);
    return;
  }
  EXPECT_EQ(gvm_is_initialized(), 1);
  gvm_torch_free(p, 4096, 0, nullptr);
  EXPECT_EQ(gvm_last_status(), GVM_OK) << gvm_last_error();
}

TEST_F(CApi, CupyEntryPoints) {
  start();
  // param carries the stream; 0 is the legacy default stream.
  const intptr_t p = gvm_cupy_malloc(0, 3 * kMiB, 1);
  ASSERT_NE(p, 0) << gvm_last_error();
  EXPECT_EQ(gvm_cupy_malloc(0, 0, 1), 0);
  EXPECT_EQ(gvm_last_status(), GVM_OK);
  gvm_device_stats_t s{};
  ASSERT_EQ(gvm_device_stats(1, &s), GVM_OK);
  EXPECT_EQ(s.allocations, 1u);
  gvm_cupy_free(0, p, 1);  // no size: the check is skipped
  EXPECT_EQ(gvm_last_status(), GVM_OK) << gvm_last_error();
  ASSERT_EQ(gvm_device_stats(1, &s), GVM_OK);
  EXPECT_EQ(s.live_bytes, 0u);
  gvm_cupy_free(0, 0, 1);  // 0 is ignored
  EXPECT_EQ(gvm_last_status(), GVM_OK);

  const Snapshot before = snapshot(kDevices);
  testing::internal::CaptureStderr();
  gvm_cupy_free(0, p, 1);  // double free
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_cupy_free: ");
  EXPECT_EQ(err.rfind("gvmalloc: gvm_cupy_free: ", 0), 0u) << err;
  testing::internal::CaptureStderr();
  EXPECT_EQ(gvm_cupy_malloc(0, 4096, -1), 0);
  err = testing::internal::GetCapturedStderr();
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "no device -1");
  EXPECT_FALSE(err.empty());
  const Snapshot after = snapshot(kDevices);
  EXPECT_TRUE(before == after) << describe(before) << "\n" << describe(after);
}

TEST_F(CApi, RecordStream) {
  start();
  void* p = gvm_malloc(8192, 0, nullptr);
  ASSERT_NE(p, nullptr);
  const Snapshot before = snapshot(kDevices);
  EXPECT_EQ(gvm_record_stream(nullptr, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_record_stream: ptr is NULL");
  int local = 0;
  EXPECT_EQ(gvm_record_stream(&local, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_record_stream: ");
  const Snapshot after = snapshot(kDevices);
  EXPECT_TRUE(before == after) << describe(before) << "\n" << describe(after);
  EXPECT_EQ(gvm_record_stream(p, nullptr), GVM_OK) << gvm_last_error();
  EXPECT_EQ(gvm_free(p, 8192, 0, nullptr), GVM_OK) << gvm_last_error();
  EXPECT_EQ(gvm_record_stream(p, nullptr), GVM_ERROR_INVALID_ARGUMENT);  // freed
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_record_stream: ");
}

TEST_F(CApi, Trim) {
  start();
  void* p = gvm_malloc(64 * kMiB, 0, nullptr);
  void* q = gvm_malloc(64 * kMiB, 1, nullptr);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(gvm_free(p, 64 * kMiB, 0, nullptr), GVM_OK);
  ASSERT_EQ(gvm_free(q, 64 * kMiB, 1, nullptr), GVM_OK);
  const Snapshot before = snapshot(kDevices);
  for (int bad : {-2, 2, 99}) {
    EXPECT_EQ(gvm_trim(bad), GVM_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_trim: no device " + std::to_string(bad));
  }
  const Snapshot after = snapshot(kDevices);
  EXPECT_TRUE(before == after) << describe(before) << "\n" << describe(after);
  ASSERT_GT(before.devices[0].cached_bytes, 0u) << "nothing cached: the trim below proves nothing";

  EXPECT_EQ(gvm_trim(0), GVM_OK) << gvm_last_error();
  gvm_device_stats_t s0{}, s1{};
  ASSERT_EQ(gvm_device_stats(0, &s0), GVM_OK);
  ASSERT_EQ(gvm_device_stats(1, &s1), GVM_OK);
  EXPECT_EQ(s0.cached_bytes, 0u);
  EXPECT_EQ(s1.cached_bytes, before.devices[1].cached_bytes);  // device 1 untouched
  EXPECT_EQ(gvm_trim(-1), GVM_OK) << gvm_last_error();
  ASSERT_EQ(gvm_device_stats(1, &s1), GVM_OK);
  EXPECT_EQ(s1.cached_bytes, 0u);
}

TEST_F(CApi, StatsJson) {
  start();
  void* p = gvm_malloc(5 * kMiB, 1, nullptr);
  ASSERT_NE(p, nullptr);
  std::size_t needed = 0;
  EXPECT_EQ(gvm_stats_json(nullptr, 0, &needed), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "too small");
  ASSERT_GT(needed, 1u);
  // Too small by one (no room for the NUL): the buffer is left alone.
  std::string buf(needed - 1, '#');
  std::size_t needed2 = 0;
  EXPECT_EQ(gvm_stats_json(buf.data(), buf.size(), &needed2), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_stats_json: ");
  EXPECT_EQ(needed2, needed);
  EXPECT_EQ(buf, std::string(needed - 1, '#'));
  EXPECT_EQ(gvm_stats_json(nullptr, 10, &needed2), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "buf is NULL");

  buf.assign(needed, '#');
  ASSERT_EQ(gvm_stats_json(buf.data(), buf.size(), nullptr), GVM_OK) << gvm_last_error();
  EXPECT_EQ(buf.back(), '\0');
  buf.pop_back();
  Json j;
  std::string why;
  ASSERT_TRUE(JsonReader::parse(buf, &j, &why)) << why << "\n" << buf;
  const Json* devices = j.find("devices");
  ASSERT_NE(devices, nullptr) << buf;
  ASSERT_EQ(devices->items.size(), 2u);
  gvm_device_stats_t s{};
  ASSERT_EQ(gvm_device_stats(1, &s), GVM_OK);
  EXPECT_EQ(devices->items[1].find("live_bytes")->as_u64(), s.live_bytes);
  EXPECT_EQ(devices->items[1].find("allocations")->as_u64(), 1u);
  const Json* calls = j.find("driver_calls");
  ASSERT_NE(calls, nullptr);
  // Growing the arena took driver calls, and they are counted by name.
  EXPECT_NE(calls->find("cuMemMap"), nullptr) << buf;
  EXPECT_EQ(gvm_free(p, 5 * kMiB, 1, nullptr), GVM_OK);
}

TEST_F(CApi, DeviceStatsArguments) {
  start();
  gvm_device_stats_t s{};
  EXPECT_EQ(gvm_device_stats(0, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "out is NULL");
  s.device = 42;
  EXPECT_EQ(gvm_device_stats(2, &s), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "no device 2");
  EXPECT_EQ(s.device, 42);  // untouched
  EXPECT_EQ(gvm_device_stats(-1, &s), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "no device -1");
  ASSERT_EQ(gvm_device_stats(1, &s), GVM_OK);
  EXPECT_EQ(s.device, 1);
}

TEST_F(CApi, ShutdownReleasesEverythingAndAllowsARestart) {
  start();
  void* p = gvm_malloc(16 * kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(gvm_shutdown(), GVM_OK);  // with a block still live
  EXPECT_EQ(gvm_is_initialized(), 0);
  EXPECT_EQ(gvm_malloc(1, 0, nullptr), nullptr);
  EXPECT_FAILED_WITH(GVM_ERROR_NOT_INITIALIZED, "not initialized");
  EXPECT_EQ(gvm_init_simulated("p40", 1, "peer_policy:global"), GVM_OK) << gvm_last_error();
  gvm_device_stats_t s{};
  ASSERT_EQ(gvm_device_stats(0, &s), GVM_OK);
  EXPECT_EQ(s.allocations, 0u);                                    // a fresh allocator
  EXPECT_EQ(gvm_device_stats(1, &s), GVM_ERROR_INVALID_ARGUMENT);  // one device now
  gvm_clear_last_error();
}

TEST_F(CApi, LastErrorIsPerThread) {
  start();
  EXPECT_EQ(gvm_malloc(0, 0, nullptr), nullptr);
  ASSERT_EQ(gvm_last_status(), GVM_ERROR_INVALID_ARGUMENT);
  std::string other_message = "unset";
  gvm_status other_status = GVM_ERROR_INTERNAL;
  std::thread t([&] {
    other_status = gvm_last_status();
    other_message = gvm_last_error();
    (void)gvm_trim(5);  // fails on that thread only
  });
  t.join();
  EXPECT_EQ(other_status, GVM_OK);
  EXPECT_EQ(other_message, "");
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "gvm_malloc: size is 0");
  // A success leaves the last failure alone (like errno).
  void* p = gvm_malloc(0, 0, nullptr);
  EXPECT_EQ(p, nullptr);
  p = gvm_malloc(4096, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_FAILED_WITH(GVM_ERROR_INVALID_ARGUMENT, "size is 0");
  EXPECT_EQ(gvm_free(p, 4096, 0, nullptr), GVM_OK);
}

TEST_F(CApi, ManyThreadsAllocateAndFree) {
  start();
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < kRounds; ++i) {
        const std::size_t size = 512u << ((i + t) % 12);  // 512 B .. 1 MiB
        void* p = gvm_malloc(size, t % kDevices, nullptr);
        if (p == nullptr) {
          ++failures;
          continue;
        }
        live.emplace_back(p, size);
        if (i % 3 == 2) {
          for (auto& [q, n] : live) failures += gvm_free(q, n, t % kDevices, nullptr) != GVM_OK;
          live.clear();
        }
      }
      for (auto& [q, n] : live) failures += gvm_free(q, n, t % kDevices, nullptr) != GVM_OK;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int d = 0; d < kDevices; ++d) {
    gvm_device_stats_t s{};
    ASSERT_EQ(gvm_device_stats(d, &s), GVM_OK);
    EXPECT_EQ(s.live_bytes, 0u);
    EXPECT_EQ(s.allocations, s.frees);
    EXPECT_EQ(s.allocations, static_cast<std::uint64_t>(kRounds) * kThreads / kDevices);
  }
}

TEST_F(CApi, CallableFromC) {
  EXPECT_EQ(gvm_c_round_trip(), 0)
      << "c_header_check.c failed at the line above; " << gvm_last_error();
  EXPECT_EQ(gvm_is_initialized(), 0);
}

// The exception -> status mapping, one exception type at a time.
TEST(CApiErrors, EveryExceptionMapsToItsStatus) {
  auto status_of = [](auto&& thrower) {
    try {
      thrower();
    } catch (...) {
      return detail::record_current_exception("f");
    }
    return GVM_OK;
  };
  EXPECT_EQ(status_of([] { throw usage_error("double free of 0x1"); }), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(gvm_last_error(), "f: double free of 0x1");
  EXPECT_EQ(status_of([] { throw out_of_memory("device 0: 2 GiB"); }), GVM_ERROR_OUT_OF_MEMORY);
  EXPECT_STREQ(gvm_last_error(), "f: device 0: 2 GiB");
  EXPECT_EQ(status_of([] { throw std::bad_alloc(); }), GVM_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(status_of([] { throw config_error("GVM_CONF: x"); }), GVM_ERROR_CONFIG);
  EXPECT_EQ(status_of([] { throw driver_error(vmm::Result::invalid_value, "cuMemMap(...)"); }),
            GVM_ERROR_DRIVER);
  EXPECT_NE(std::string(gvm_last_error()).find("CUDA_ERROR_INVALID_VALUE"), std::string::npos);
  EXPECT_EQ(status_of([] { throw vmm::DriverUnavailable("no CUDA driver found: x"); }),
            GVM_ERROR_NO_DRIVER);
  EXPECT_EQ(status_of([] { throw std::invalid_argument("plain"); }), GVM_ERROR_INTERNAL);
  EXPECT_EQ(status_of([] { throw std::runtime_error("boom"); }), GVM_ERROR_INTERNAL);
  EXPECT_STREQ(gvm_last_error(), "f: boom");
  EXPECT_EQ(status_of([] { throw 42; }), GVM_ERROR_INTERNAL);
  EXPECT_STREQ(gvm_last_error(), "f: unknown exception");
  EXPECT_EQ(gvm_last_status(), GVM_ERROR_INTERNAL);
  gvm_clear_last_error();
}

}  // namespace
}  // namespace gvm
