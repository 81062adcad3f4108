// Stats totals and the JSON form of a Stats snapshot.
#include "gvm/stats.hpp"

#include <numeric>
#include <string>
#include <string_view>

#include "json.hpp"

namespace gvm {

namespace detail {

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

}  // namespace detail

std::uint64_t DriverCallStats::total_calls() const noexcept {
  return std::accumulate(calls.begin(), calls.end(), std::uint64_t{0});
}

std::uint64_t DriverCallStats::total_nanoseconds() const noexcept {
  return std::accumulate(nanoseconds.begin(), nanoseconds.end(), std::uint64_t{0});
}

namespace {

void append_field(std::string& out, bool& first, std::string_view name, std::uint64_t value) {
  if (!first) out += ',';
  first = false;
  detail::append_json_string(out, name);
  out += ':';
  out += std::to_string(value);
}

void append_device(std::string& out, const DeviceStats& d) {
  out += '{';
  bool first = true;
  // The device id is the only signed field; -1 (unset) must stay -1.
  detail::append_json_string(out, "device");
  out += ':';
  out += std::to_string(d.device);
  first = false;
  append_field(out, first, "live_bytes", d.live_bytes);
  append_field(out, first, "reserved_bytes", d.reserved_bytes);
  append_field(out, first, "cached_bytes", d.cached_bytes);
  append_field(out, first, "peak_live_bytes", d.peak_live_bytes);
  append_field(out, first, "peak_reserved_bytes", d.peak_reserved_bytes);
  append_field(out, first, "scratch_reserved_bytes", d.scratch_reserved_bytes);
  append_field(out, first, "allocations", d.allocations);
  append_field(out, first, "frees", d.frees);
  append_field(out, first, "cache_hits", d.cache_hits);
  append_field(out, first, "chunks_mapped", d.chunks_mapped);
  append_field(out, first, "chunks_unmapped", d.chunks_unmapped);
  append_field(out, first, "oom_retries", d.oom_retries);
  append_field(out, first, "fences", d.fences);
  append_field(out, first, "cross_stream_waits", d.cross_stream_waits);
  out += '}';
}

}  // namespace

std::string to_json(const Stats& s) {
  std::string out;
  out.reserve(512 + 400 * s.devices.size());
  out += "{\"devices\":[";
  for (std::size_t i = 0; i < s.devices.size(); ++i) {
    if (i != 0) out += ',';
    append_device(out, s.devices[i]);
  }
  out += "],\"driver_calls\":{";
  bool first_call = true;
  for (int i = 0; i < vmm::kCallCount; ++i) {
    const auto idx = static_cast<std::size_t>(i);
    if (s.driver.calls[idx] == 0 && s.driver.nanoseconds[idx] == 0) continue;
    if (!first_call) out += ',';
    first_call = false;
    detail::append_json_string(out, vmm::call_name(static_cast<vmm::Call>(i)));
    out += ":{";
    bool first = true;
    append_field(out, first, "calls", s.driver.calls[idx]);
    append_field(out, first, "ns", s.driver.nanoseconds[idx]);
    out += '}';
  }
  out += "},\"driver_totals\":{";
  bool first = true;
  append_field(out, first, "calls", s.driver.total_calls());
  append_field(out, first, "ns", s.driver.total_nanoseconds());
  out += "}}";
  return out;
}

}  // namespace gvm
