// Stats totals and the JSON form of a Stats snapshot.
#include "gvm/stats.hpp"

#include <numeric>
#include <string>
#include <type_traits>
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
  // Every field of the table, in its order; the device id is the only
  // signed one, and -1 (unset) must stay -1.
#define GVM_STATS_JSON(type, name, doc)                 \
  if constexpr (std::is_signed_v<type>) {              \
    if (!first) out += ',';                            \
    first = false;                                     \
    detail::append_json_string(out, #name);            \
    out += ':';                                        \
    out += std::to_string(d.name);                     \
  } else {                                             \
    append_field(out, first, #name, d.name);           \
  }
  GVM_DEVICE_STATS_FIELDS(GVM_STATS_JSON)
#undef GVM_STATS_JSON
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
