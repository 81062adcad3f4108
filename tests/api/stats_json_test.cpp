// to_json(Stats): valid JSON, every field, driver calls by name.
#include <gtest/gtest.h>

#include <string>

#include "gvm/stats.hpp"
#include "json.hpp"
#include "json_check.hpp"

namespace gvm {
namespace {

using test::Json;
using test::JsonReader;

DeviceStats numbered_device(int device, std::uint64_t base) {
  DeviceStats d;
  d.device = device;
  d.live_bytes = base + 1;
  d.reserved_bytes = base + 2;
  d.cached_bytes = base + 3;
  d.peak_live_bytes = base + 4;
  d.peak_reserved_bytes = base + 5;
  d.scratch_reserved_bytes = base + 6;
  d.allocations = base + 7;
  d.frees = base + 8;
  d.cache_hits = base + 9;
  d.chunks_mapped = base + 10;
  d.chunks_unmapped = base + 11;
  d.oom_retries = base + 12;
  d.fences = base + 13;
  d.cross_stream_waits = base + 14;
  d.chunks_reused = base + 15;
  return d;
}

Json parse_or_fail(const std::string& text) {
  Json j;
  std::string why;
  EXPECT_TRUE(JsonReader::parse(text, &j, &why)) << why << "\n" << text;
  return j;
}

TEST(StatsJson, EmptyStats) {
  const std::string text = to_json(Stats{});
  EXPECT_EQ(text, "{\"devices\":[],\"driver_calls\":{},\"driver_totals\":{\"calls\":0,\"ns\":0}}");
  parse_or_fail(text);
}

TEST(StatsJson, FixedStatsGiveExactText) {
  Stats s;
  s.devices.push_back(numbered_device(0, 100));
  s.driver.calls[static_cast<std::size_t>(vmm::Call::mem_create)] = 3;
  s.driver.nanoseconds[static_cast<std::size_t>(vmm::Call::mem_create)] = 45000;
  EXPECT_EQ(to_json(s),
            "{\"devices\":[{\"device\":0,\"live_bytes\":101,\"reserved_bytes\":102,"
            "\"cached_bytes\":103,\"peak_live_bytes\":104,\"peak_reserved_bytes\":105,"
            "\"scratch_reserved_bytes\":106,\"allocations\":107,\"frees\":108,"
            "\"cache_hits\":109,\"chunks_mapped\":110,\"chunks_unmapped\":111,"
            "\"oom_retries\":112,\"fences\":113,\"cross_stream_waits\":114,\"chunks_reused\":115}],"
            "\"driver_calls\":{\"cuMemCreate\":{\"calls\":3,\"ns\":45000}},"
            "\"driver_totals\":{\"calls\":3,\"ns\":45000}}");
}

TEST(StatsJson, EveryFieldOfEveryDeviceAndOnlyNonZeroCalls) {
  Stats s;
  s.devices.push_back(numbered_device(0, 0));
  s.devices.push_back(numbered_device(1, std::uint64_t{1} << 40));
  s.devices.push_back(DeviceStats{});  // device -1 must stay a valid (negative) number
  // Every call gets a distinct count except cuMemMap, left at zero.
  for (int i = 0; i < vmm::kCallCount; ++i) {
    if (static_cast<vmm::Call>(i) == vmm::Call::mem_map) continue;
    s.driver.calls[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(i + 1);
    s.driver.nanoseconds[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(1000 * (i + 1));
  }
  const Json j = parse_or_fail(to_json(s));
  ASSERT_EQ(j.kind, Json::Kind::object);
  const Json* devices = j.find("devices");
  ASSERT_NE(devices, nullptr);
  ASSERT_EQ(devices->items.size(), 3u);
  const Json& d1 = devices->items[1];
  EXPECT_EQ(d1.keys_in_order.size(), 16u);  // device + 15 counters
  EXPECT_EQ(d1.find("device")->as_u64(), 1u);
  EXPECT_EQ(d1.find("live_bytes")->as_u64(), (std::uint64_t{1} << 40) + 1);
  EXPECT_EQ(d1.find("cross_stream_waits")->as_u64(), (std::uint64_t{1} << 40) + 14);
  EXPECT_EQ(d1.find("chunks_reused")->as_u64(), (std::uint64_t{1} << 40) + 15);
  EXPECT_EQ(devices->items[2].find("device")->text, "-1");

  const Json* calls = j.find("driver_calls");
  ASSERT_NE(calls, nullptr);
  EXPECT_EQ(calls->members.size(), static_cast<std::size_t>(vmm::kCallCount - 1));
  EXPECT_EQ(calls->find("cuMemMap"), nullptr);
  for (int i = 0; i < vmm::kCallCount; ++i) {
    if (static_cast<vmm::Call>(i) == vmm::Call::mem_map) continue;
    const char* name = vmm::call_name(static_cast<vmm::Call>(i));
    const Json* c = calls->find(name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_EQ(c->find("calls")->as_u64(), static_cast<std::uint64_t>(i + 1)) << name;
    EXPECT_EQ(c->find("ns")->as_u64(), static_cast<std::uint64_t>(1000 * (i + 1))) << name;
  }
  const Json* totals = j.find("driver_totals");
  ASSERT_NE(totals, nullptr);
  EXPECT_EQ(totals->find("calls")->as_u64(), s.driver.total_calls());
  EXPECT_EQ(totals->find("ns")->as_u64(), s.driver.total_nanoseconds());
}

TEST(StatsJson, Totals) {
  DriverCallStats d;
  EXPECT_EQ(d.total_calls(), 0u);
  d.calls[0] = 2;
  d.calls[static_cast<std::size_t>(vmm::kCallCount - 1)] = 5;
  d.nanoseconds[3] = 7;
  EXPECT_EQ(d.total_calls(), 7u);
  EXPECT_EQ(d.total_nanoseconds(), 7u);
}

TEST(StatsJson, StringsAreEscaped) {
  std::string raw = "quote\" backslash\\ newline\n tab\t bell\x07 nul";
  raw.push_back('\0');
  raw += " utf8 \xc3\xa9";
  std::string out;
  detail::append_json_string(out, raw);
  EXPECT_EQ(out,
            "\"quote\\\" backslash\\\\ newline\\n tab\\t bell\\u0007 nul\\u0000 utf8 \xc3\xa9\"");
  Json j;
  std::string why;
  // The reader takes only ASCII \u escapes; everything here is.
  ASSERT_TRUE(JsonReader::parse(out, &j, &why)) << why;
  EXPECT_EQ(j.text, raw);
}

TEST(StatsJson, TheCheckerRejectsBrokenJson) {
  // The checker must be able to fail, or the tests above prove nothing.
  for (const char* bad : {"", "{", "{\"a\":1,}", "{\"a\" 1}", "[1 2]", "{\"a\":01}",
                          "\"raw\nnewline\"", "{\"a\":1}{", "{\"a\":1,\"a\":2}", "nul"}) {
    EXPECT_FALSE(JsonReader::parse(bad, nullptr, nullptr)) << bad;
  }
}

}  // namespace
}  // namespace gvm
