// parse_config / to_string(Config) / config_from_env.
#include "gvm/config.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "gvm/errors.hpp"

namespace gvm {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

bool same(const Config& a, const Config& b) {
  return a.arena_bytes == b.arena_bytes && a.max_chunk_bytes == b.max_chunk_bytes &&
         a.reserve_slack == b.reserve_slack && a.max_reserved_bytes == b.max_reserved_bytes &&
         a.memory_fraction == b.memory_fraction &&
         a.release_threshold_bytes == b.release_threshold_bytes &&
         a.small_block_max_bytes == b.small_block_max_bytes && a.force_no_vmm == b.force_no_vmm &&
         a.peer_policy == b.peer_policy && a.scratch_chunk_bytes == b.scratch_chunk_bytes &&
         a.scratch_arena_bytes == b.scratch_arena_bytes && a.fence_enabled == b.fence_enabled &&
         a.scratch_fence_tracked == b.scratch_fence_tracked &&
         a.span_warmup_allocations == b.span_warmup_allocations &&
         a.span_max_bytes == b.span_max_bytes && a.shared_spans == b.shared_spans;
}

// The config_error message of parse_config(text), or "" when it did not throw.
std::string error_of(const std::string& text) {
  try {
    (void)parse_config(text);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, EmptyTextGivesTheBase) {
  EXPECT_TRUE(same(parse_config(""), Config{}));
  EXPECT_TRUE(same(parse_config("  ,, , "), Config{}));
  Config base;
  base.arena_bytes = 12 * kMiB;
  base.peer_policy = PeerPolicy::global;
  EXPECT_TRUE(same(parse_config("", base), base));
}

TEST(Config, EveryKeySetsItsField) {
  const Config c = parse_config(
      "arena_size:1TiB,max_chunk_size:512MiB,reserve_slack:0.25,max_reserved:80GiB,"
      "memory_fraction:0.75,release_threshold:3GiB,small_max:2MiB,no_vmm:true,"
      "peer_policy:global,scratch_chunk_size:128MiB,scratch_arena_size:16GiB,fence:false,"
      "scratch_fence:tracked");
  EXPECT_EQ(c.arena_bytes, std::size_t{1} << 40);
  EXPECT_EQ(c.max_chunk_bytes, 512 * kMiB);
  EXPECT_EQ(c.reserve_slack, 0.25);
  EXPECT_EQ(c.max_reserved_bytes, std::size_t{80} << 30);
  EXPECT_EQ(c.memory_fraction, 0.75);
  EXPECT_EQ(c.release_threshold_bytes, std::size_t{3} << 30);
  EXPECT_EQ(c.small_block_max_bytes, 2 * kMiB);
  EXPECT_TRUE(c.force_no_vmm);
  EXPECT_EQ(c.peer_policy, PeerPolicy::global);
  EXPECT_EQ(c.scratch_chunk_bytes, 128 * kMiB);
  EXPECT_EQ(c.scratch_arena_bytes, std::size_t{16} << 30);
  EXPECT_FALSE(c.fence_enabled);
  EXPECT_TRUE(c.scratch_fence_tracked);
}

TEST(Config, EveryUnitIsAPowerOf1024AnyCase) {
  struct Case {
    const char* text;
    std::size_t bytes;
  };
  const Case cases[] = {
      {"4096", 4096},
      {"4096B", 4096},
      {"4096b", 4096},
      {"3K", 3ull << 10},
      {"3KB", 3ull << 10},
      {"3KiB", 3ull << 10},
      {"3kib", 3ull << 10},
      {"3kB", 3ull << 10},
      {"5M", 5ull << 20},
      {"5MB", 5ull << 20},
      {"5MiB", 5ull << 20},
      {"5mib", 5ull << 20},
      {"7G", 7ull << 30},
      {"7GB", 7ull << 30},
      {"7GiB", 7ull << 30},
      {"7gIb", 7ull << 30},
      {"2T", 2ull << 40},
      {"2TB", 2ull << 40},
      {"2TiB", 2ull << 40},
      {"2tib", 2ull << 40},
      {"0", 0},
      {"12 MiB", 12ull << 20},
      {"18446744073709551615", SIZE_MAX},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(parse_config(std::string("arena_size:") + c.text).arena_bytes, c.bytes);
    EXPECT_EQ(parse_config(std::string("max_reserved:") + c.text).max_reserved_bytes, c.bytes);
  }
}

TEST(Config, WhitespaceEmptyItemsAndTheLastValueWins) {
  const Config c = parse_config("  arena_size : 1GiB ,, max_reserved:1G,\tarena_size:2GiB , ");
  EXPECT_EQ(c.arena_bytes, std::size_t{2} << 30);
  EXPECT_EQ(c.max_reserved_bytes, std::size_t{1} << 30);
}

TEST(Config, ParsesOverTheBase) {
  Config base;
  base.max_reserved_bytes = 123 * kMiB;
  base.fence_enabled = false;
  const Config c = parse_config("arena_size:4GiB", base);
  EXPECT_EQ(c.arena_bytes, std::size_t{4} << 30);
  EXPECT_EQ(c.max_reserved_bytes, 123 * kMiB);
  EXPECT_FALSE(c.fence_enabled);
}

TEST(Config, SpecialValues) {
  EXPECT_EQ(parse_config("release_threshold:1GiB,release_threshold:none").release_threshold_bytes,
            SIZE_MAX);
  EXPECT_EQ(parse_config("release_threshold:INF").release_threshold_bytes, SIZE_MAX);
  EXPECT_EQ(parse_config("release_threshold:0").release_threshold_bytes, 0u);
  EXPECT_EQ(parse_config("memory_fraction:0.5,memory_fraction:none").memory_fraction, 0.0);
  EXPECT_EQ(parse_config("memory_fraction:1").memory_fraction, 1.0);
  EXPECT_EQ(parse_config("reserve_slack:-1").reserve_slack, -1.0);
  EXPECT_EQ(parse_config("reserve_slack:0").reserve_slack, 0.0);
  EXPECT_EQ(parse_config("memory_fraction:1e-3").memory_fraction, 0.001);
  for (const char* t : {"true", "TRUE", "1"})
    EXPECT_TRUE(parse_config(std::string("no_vmm:") + t).force_no_vmm) << t;
  for (const char* t : {"false", "False", "0"})
    EXPECT_FALSE(parse_config(std::string("fence:") + t).fence_enabled) << t;
  EXPECT_EQ(parse_config("peer_policy:auto").peer_policy, PeerPolicy::automatic);
  EXPECT_EQ(parse_config("peer_policy:per_allocation").peer_policy, PeerPolicy::per_allocation);
  EXPECT_EQ(parse_config("peer_policy:none").peer_policy, PeerPolicy::none);
  EXPECT_TRUE(parse_config("scratch_fence:Tracked").scratch_fence_tracked);
  EXPECT_FALSE(parse_config("scratch_fence:tracked,scratch_fence:devices").scratch_fence_tracked);
  EXPECT_EQ(parse_config("small_max:512").small_block_max_bytes, 512u);
  EXPECT_EQ(parse_config("small_max:64MiB").small_block_max_bytes, 64 * kMiB);
  EXPECT_EQ(parse_config("span_max:1MiB").span_max_bytes, kMiB);
  EXPECT_EQ(parse_config("span_max:512").span_max_bytes, 512u);
  EXPECT_EQ(parse_config("max_chunk_size:2MiB").max_chunk_bytes, 2 * kMiB);
}

TEST(Config, EveryErrorNamesItsKeyAndValue) {
  struct Case {
    const char* key;
    const char* value;
  };
  const Case cases[] = {
      {"arena_size", "12Q"},
      {"arena_size", "-1"},
      {"arena_size", "1.5G"},
      {"arena_size", "G"},
      {"arena_size", "0x10"},
      {"arena_size", "18446744073709551616"},  // 2^64
      {"arena_size", "16777216TiB"},           // 2^64 again, by the unit
      {"arena_size", "1 2"},
      {"arena_size", ""},
      {"max_chunk_size", "0"},
      {"max_chunk_size", "3MiB"},
      {"max_chunk_size", "1KiB"},
      {"max_chunk_size", "lots"},
      {"max_reserved", "12Q"},
      {"max_reserved", "none"},
      {"memory_fraction", "0"},
      {"memory_fraction", "1.01"},
      {"memory_fraction", "-0.5"},
      {"memory_fraction", "nan"},
      {"memory_fraction", "inf"},
      {"memory_fraction", "half"},
      {"memory_fraction", "0.5x"},
      {"reserve_slack", "lots"},
      {"reserve_slack", "nan"},
      {"reserve_slack", "0.1%"},
      {"release_threshold", "never"},
      {"release_threshold", "-3"},
      {"small_max", "511"},
      {"small_max", "65MiB"},
      {"small_max", "0"},
      {"span_max", "511"},
      {"span_max", "65MiB"},
      {"span_max", "lots"},
      {"no_vmm", "yes"},
      {"no_vmm", "2"},
      {"peer_policy", "sometimes"},
      {"peer_policy", "per-allocation"},
      {"scratch_chunk_size", "0"},
      {"scratch_chunk_size", "1MiB"},
      {"scratch_chunk_size", "5MiB"},
      {"scratch_arena_size", "-8GiB"},
      {"scratch_arena_size", "8 GiBs"},
      {"fence", "off"},
      {"scratch_fence", "always"},
      {"scratch_fence", "true"},
  };
  for (const Case& c : cases) {
    const std::string text = std::string(c.key) + ":" + c.value;
    SCOPED_TRACE(text);
    const std::string msg = error_of(text);
    ASSERT_FALSE(msg.empty()) << "accepted a bad value";
    EXPECT_EQ(msg.rfind("bad value \"", 0), 0u) << msg;
    EXPECT_NE(msg.find(std::string("\"") + c.value + "\" for " + c.key + ": "), std::string::npos)
        << msg;
    // The error is found among good items too, and names the bad one.
    const std::string mixed = error_of("arena_size:1GiB, " + text + " ,fence:true");
    EXPECT_NE(mixed.find(std::string(" for ") + c.key + ":"), std::string::npos) << mixed;
  }
}

TEST(Config, ExampleMessagesReadWell) {
  EXPECT_EQ(error_of("max_reserved:12Q")
                .rfind("bad value \"12Q\" for max_reserved: expected a size like 512MiB", 0),
            0u);
  const std::string unknown = error_of("chunk:2MiB");
  EXPECT_EQ(unknown.rfind("unknown key \"chunk\" (known keys: arena_size, ", 0), 0u) << unknown;
  for (const char* key :
       {"arena_size", "max_chunk_size", "reserve_slack", "max_reserved", "memory_fraction",
        "release_threshold", "small_max", "no_vmm", "peer_policy", "scratch_chunk_size",
        "scratch_arena_size", "fence", "scratch_fence"}) {
    EXPECT_NE(unknown.find(key), std::string::npos) << key;
  }
  EXPECT_NE(error_of("arena_size:1.5G").find("1536MiB"), std::string::npos);
  EXPECT_NE(error_of("arena_size:-1").find("negative"), std::string::npos);
  EXPECT_NE(error_of("arena_size:99999999999TiB").find("too large"), std::string::npos);
  const std::string no_colon = error_of("fence:true,arena_size");
  EXPECT_NE(no_colon.find("\"arena_size\" has no value"), std::string::npos) << no_colon;
  // Keys are case-sensitive, like PYTORCH_CUDA_ALLOC_CONF's.
  EXPECT_NE(error_of("Arena_Size:1GiB").find("unknown key \"Arena_Size\""), std::string::npos);
  EXPECT_NE(error_of(":1GiB").find("unknown key \"\""), std::string::npos);
}

TEST(Config, ToStringRoundTrips) {
  Config odd;
  odd.arena_bytes = 1000;  // not a whole unit: written in bytes
  odd.max_chunk_bytes = 6 * kMiB;
  odd.reserve_slack = -0.5;
  odd.max_reserved_bytes = (std::size_t{3} << 30) + 4096;
  odd.memory_fraction = 0.1;  // not exact in binary: needs the shortest round-trip text
  odd.release_threshold_bytes = 0;
  odd.small_block_max_bytes = 513;
  odd.span_warmup_allocations = 7;
  odd.span_max_bytes = 40 << 10;
  odd.shared_spans = false;
  odd.force_no_vmm = true;
  odd.peer_policy = PeerPolicy::none;
  odd.scratch_chunk_bytes = 2 * kMiB;
  odd.scratch_arena_bytes = std::size_t{5} << 40;
  odd.fence_enabled = false;
  odd.scratch_fence_tracked = true;
  Config other;
  other.memory_fraction = 2.0 / 3.0;
  other.peer_policy = PeerPolicy::per_allocation;
  other.release_threshold_bytes = SIZE_MAX - 1;
  other.reserve_slack = 1.0 / 3.0;
  other.max_chunk_bytes = std::size_t{1} << 30;
  for (const Config& c : {Config{}, odd, other}) {
    const std::string text = to_string(c);
    SCOPED_TRACE(text);
    EXPECT_TRUE(same(parse_config(text), c));
    // Over a different base too: every key is written, so the base cannot leak in.
    EXPECT_TRUE(same(parse_config(text, odd), c));
  }
  EXPECT_NE(to_string(other).find("max_chunk_size:1GiB,"), std::string::npos);
  EXPECT_NE(to_string(Config{}).find("release_threshold:none"), std::string::npos);
  EXPECT_NE(to_string(odd).find("arena_size:1000,"), std::string::npos);
}

TEST(Config, PeerPolicyNames) {
  EXPECT_STREQ(to_string(PeerPolicy::automatic), "auto");
  EXPECT_STREQ(to_string(PeerPolicy::per_allocation), "per_allocation");
  EXPECT_STREQ(to_string(PeerPolicy::global), "global");
  EXPECT_STREQ(to_string(PeerPolicy::none), "none");
}

// Restores GVM_CONF as it was when the test started.
class EnvGuard {
 public:
  EnvGuard() {
    if (const char* v = std::getenv("GVM_CONF")) saved_ = v, had_ = true;
  }
  ~EnvGuard() {
    if (had_)
      setenv("GVM_CONF", saved_.c_str(), 1);
    else
      unsetenv("GVM_CONF");
  }

 private:
  std::string saved_;
  bool had_ = false;
};

TEST(Config, FromEnv) {
  EnvGuard guard;
  unsetenv("GVM_CONF");
  EXPECT_TRUE(same(config_from_env(), Config{}));
  setenv("GVM_CONF", "max_reserved:2GiB,peer_policy:none", 1);
  const Config c = config_from_env();
  EXPECT_EQ(c.max_reserved_bytes, std::size_t{2} << 30);
  EXPECT_EQ(c.peer_policy, PeerPolicy::none);
  setenv("GVM_CONF", "max_reserved:2GiB,bogus:1", 1);
  EXPECT_THROW(config_from_env(), config_error);
}

// parse_config does not know where its text came from; config_from_env says
// GVM_CONF, once (a caller that added it again printed "GVM_CONF: GVM_CONF:").
TEST(Config, OnlyTheEnvironmentNamesGvmConf) {
  EnvGuard guard;
  EXPECT_EQ(error_of("bogus:1").find("GVM_CONF"), std::string::npos) << error_of("bogus:1");
  setenv("GVM_CONF", "bogus:1", 1);
  try {
    (void)config_from_env();
    ADD_FAILURE() << "accepted bogus:1";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("GVM_CONF: unknown key \"bogus\"", 0), 0u) << msg;
    EXPECT_EQ(msg.find("GVM_CONF", 1), std::string::npos) << msg;
  }
}

// A runaway value is quoted by its start and its length, not in full.
TEST(Config, HugeValuesAreNotEchoedInFull) {
  const std::string digits(1000000, '7');
  for (const std::string& text :
       {"arena_size:" + digits, "fence:" + digits, digits + ":1", digits}) {
    const std::string msg = error_of(text);
    ASSERT_FALSE(msg.empty());
    EXPECT_LT(msg.size(), 400u) << msg.substr(0, 400);
    EXPECT_NE(msg.find("(1000000 characters)"), std::string::npos) << msg.substr(0, 400);
  }
  EXPECT_EQ(error_of("arena_size:" + digits).rfind("bad value \"777", 0), 0u);
}

}  // namespace
}  // namespace gvm
