// parse_config / to_string(Config): the GVM_CONF text format.
//
//   text   := item ("," item)*          empty items are skipped: "a:1,,b:2"
//   item   := key ":" value             spaces around key and value are ignored
//   size   := digits [unit]             unit: B, K|KB|KiB, M|MB|MiB, G|GB|GiB,
//                                       T|TB|TiB, any case, all powers of 1024
//
// Every error is a config_error that names the key and the value, so a user who
// set the variable months ago sees what to fix. parse_config does not know where
// the text came from; config_from_env prefixes its errors with "GVM_CONF: ".
#include "gvm/config.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>

#include "gvm/errors.hpp"

namespace gvm {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kTiB = std::size_t{1} << 40;

// Physical chunks are whole granules; 2 MiB is the granularity of every GPU we
// know (docs/measurements.md: "2 MiB minimum and recommended" on H200).
constexpr std::size_t kChunkMultiple = 2 * kMiB;
// Size classes below 512 B would be smaller than kBlockAlignment; above 64 MiB
// a "small" block would be larger than most chunks and defeat best-fit.
constexpr std::size_t kSmallMaxMin = 512;
constexpr std::size_t kSmallMaxMax = 64 * kMiB;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

// A value or key quoted for a message: in full up to 64 characters, else its
// start and its length (a runaway value must not flood the terminal).
std::string quoted(std::string_view text) {
  constexpr std::size_t kWhole = 64;
  constexpr std::size_t kStart = 24;
  std::string out(1, '"');
  if (text.size() <= kWhole) {
    out.append(text).push_back('"');
    return out;
  }
  out.append(text.substr(0, kStart)).append("...\" (");
  out.append(std::to_string(text.size())).append(" characters)");
  return out;
}

[[noreturn]] void bad_value(std::string_view key, std::string_view value, std::string_view why) {
  std::string msg = "bad value ";
  msg.append(quoted(value)).append(" for ").append(key).append(": ").append(why);
  throw config_error(msg);
}

constexpr std::string_view kExpectSize =
    "expected a size like 512MiB (a whole number of bytes, or with a suffix B, K/KB/KiB, "
    "M/MB/MiB, G/GB/GiB, T/TB/TiB; all powers of 1024)";

// Parses a size with an optional binary unit; throws naming `key`.
std::size_t parse_size(std::string_view key, std::string_view value) {
  const std::string_view s = value;
  if (!s.empty() && s.front() == '-') bad_value(key, value, "sizes cannot be negative");
  std::size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) bad_value(key, value, kExpectSize);
  if (digits < s.size() && s[digits] == '.') {
    bad_value(key, value,
              "fractions are not accepted; write a whole number in a smaller unit "
              "(1536MiB, not 1.5GiB)");
  }
  std::size_t number = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + digits, number);
  if (ec == std::errc::result_out_of_range) bad_value(key, value, "too large");
  if (ec != std::errc{} || end != s.data() + digits) bad_value(key, value, kExpectSize);

  std::string_view unit = trim(s.substr(digits));
  std::size_t scale = 0;
  if (unit.empty() || iequals(unit, "b")) {
    scale = 1;
  } else {
    static constexpr std::array<std::pair<char, std::size_t>, 4> kPrefixes{
        {{'k', kKiB}, {'m', kMiB}, {'g', kGiB}, {'t', kTiB}}};
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(unit.front())));
    std::string_view rest = unit.substr(1);
    const bool rest_ok = rest.empty() || iequals(rest, "b") || iequals(rest, "ib");
    for (const auto& [prefix, bytes] : kPrefixes) {
      if (p == prefix && rest_ok) scale = bytes;
    }
  }
  if (scale == 0) bad_value(key, value, kExpectSize);
  if (number > SIZE_MAX / scale) bad_value(key, value, "too large");
  return number * scale;
}

// A size-class bound (small_max, span_max): a size between 512 B and 64 MiB.
std::size_t parse_class_size(std::string_view key, std::string_view value) {
  const std::size_t bytes = parse_size(key, value);
  if (bytes < kSmallMaxMin || bytes > kSmallMaxMax) bad_value(key, value, "must be between 512B and 64MiB");
  return bytes;
}

bool parse_bool(std::string_view key, std::string_view value) {
  if (iequals(value, "true") || value == "1") return true;
  if (iequals(value, "false") || value == "0") return false;
  bad_value(key, value, "expected true, false, 1 or 0");
}

std::uint32_t parse_count(std::string_view key, std::string_view value, std::uint32_t max) {
  std::uint32_t n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc{} || end != value.data() + value.size() || n > max)
    bad_value(key, value, "expected a whole number from 0 to " + std::to_string(max));
  return n;
}

bool is_unbounded(std::string_view value) {
  return iequals(value, "none") || iequals(value, "inf");
}

void require_chunk_multiple(std::string_view key, std::string_view value, std::size_t bytes) {
  if (bytes == 0 || bytes % kChunkMultiple != 0) {
    bad_value(key, value, "must be a positive multiple of 2MiB (the driver's granularity)");
  }
}

// One key: its name and how it writes its value into a Config.
struct Key {
  std::string_view name;
  void (*apply)(Config& c, std::string_view key, std::string_view value);
};

constexpr std::array<Key, 16> kKeys{{
    {"arena_size",
     [](Config& c, std::string_view k, std::string_view v) { c.arena_bytes = parse_size(k, v); }},
    {"max_chunk_size",
     [](Config& c, std::string_view k, std::string_view v) {
       const std::size_t bytes = parse_size(k, v);
       require_chunk_multiple(k, v, bytes);
       c.max_chunk_bytes = bytes;
     }},
    {"reserve_slack",
     [](Config& c, std::string_view k, std::string_view v) {
       double f = 0.0;
       auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), f);
       if (ec != std::errc{} || end != v.data() + v.size() || !std::isfinite(f)) {
         bad_value(k, v, "expected a number like 0.02 (negative: never trim before growing)");
       }
       c.reserve_slack = f;
     }},
    {"max_reserved", [](Config& c, std::string_view k,
                        std::string_view v) { c.max_reserved_bytes = parse_size(k, v); }},
    {"memory_fraction",
     [](Config& c, std::string_view k, std::string_view v) {
       // "none" is how to_string writes the default (no cap), so it round-trips.
       if (iequals(v, "none")) {
         c.memory_fraction = 0.0;
         return;
       }
       double f = 0.0;
       auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), f);
       if (ec != std::errc{} || end != v.data() + v.size() || !std::isfinite(f)) {
         bad_value(k, v, "expected a number in (0, 1], like 0.9, or none");
       }
       if (!(f > 0.0 && f <= 1.0)) bad_value(k, v, "must be in (0, 1], or none for no cap");
       c.memory_fraction = f;
     }},
    {"release_threshold",
     [](Config& c, std::string_view k, std::string_view v) {
       c.release_threshold_bytes = is_unbounded(v) ? SIZE_MAX : parse_size(k, v);
     }},
    {"small_max",
     [](Config& c, std::string_view k, std::string_view v) {
       c.small_block_max_bytes = parse_class_size(k, v);
     }},
    {"span_warmup",
     [](Config& c, std::string_view k, std::string_view v) {
       c.span_warmup_allocations = parse_count(k, v, 1u << 30);
     }},
    {"span_max",
     [](Config& c, std::string_view k, std::string_view v) {
       c.span_max_bytes = parse_class_size(k, v);
     }},
    {"shared_spans",
     [](Config& c, std::string_view k, std::string_view v) { c.shared_spans = parse_bool(k, v); }},
    {"no_vmm",
     [](Config& c, std::string_view k, std::string_view v) { c.force_no_vmm = parse_bool(k, v); }},
    {"peer_policy",
     [](Config& c, std::string_view k, std::string_view v) {
       static constexpr std::array<std::pair<std::string_view, PeerPolicy>, 4> kPolicies{{
           {"auto", PeerPolicy::automatic},
           {"per_allocation", PeerPolicy::per_allocation},
           {"global", PeerPolicy::global},
           {"none", PeerPolicy::none},
       }};
       for (const auto& [name, policy] : kPolicies) {
         if (iequals(v, name)) {
           c.peer_policy = policy;
           return;
         }
       }
       bad_value(k, v, "expected auto, per_allocation, global or none");
     }},
    {"scratch_chunk_size",
     [](Config& c, std::string_view k, std::string_view v) {
       const std::size_t bytes = parse_size(k, v);
       require_chunk_multiple(k, v, bytes);
       c.scratch_chunk_bytes = bytes;
     }},
    {"scratch_arena_size", [](Config& c, std::string_view k,
                              std::string_view v) { c.scratch_arena_bytes = parse_size(k, v); }},
    {"fence",
     [](Config& c, std::string_view k, std::string_view v) { c.fence_enabled = parse_bool(k, v); }},
    {"scratch_fence",
     [](Config& c, std::string_view k, std::string_view v) {
       if (iequals(v, "devices")) {
         c.scratch_fence_tracked = false;
       } else if (iequals(v, "tracked")) {
         c.scratch_fence_tracked = true;
       } else {
         bad_value(k, v, "expected devices or tracked");
       }
     }},
}};

std::string known_keys() {
  std::string out;
  for (const Key& k : kKeys) {
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

void apply_item(Config& c, std::string_view item) {
  const std::size_t colon = item.find(':');
  if (colon == std::string_view::npos) {
    std::string msg = "item ";
    msg.append(quoted(item)).append(" has no value: expected key:value (known keys: ");
    msg.append(known_keys()).append(")");
    throw config_error(msg);
  }
  const std::string_view key = trim(item.substr(0, colon));
  const std::string_view value = trim(item.substr(colon + 1));
  for (const Key& k : kKeys) {
    if (k.name == key) {
      if (value.empty()) bad_value(key, value, "the value is empty");
      k.apply(c, key, value);
      return;
    }
  }
  std::string msg = "unknown key ";
  msg.append(quoted(key)).append(" (known keys: ").append(known_keys()).append(")");
  throw config_error(msg);
}

// Largest binary unit that divides `bytes` exactly, so the text is exact.
std::string size_text(std::size_t bytes) {
  static constexpr std::array<std::pair<std::size_t, std::string_view>, 4> kUnits{
      {{kTiB, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}}};
  if (bytes != 0) {
    for (const auto& [scale, name] : kUnits) {
      if (bytes % scale == 0) return std::to_string(bytes / scale).append(name);
    }
  }
  return std::to_string(bytes);
}

// Shortest text that reads back as the same double.
std::string double_text(double v) {
  std::array<char, 32> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return ec == std::errc{} ? std::string(buf.data(), end) : std::string("?");
}

}  // namespace

Config parse_config(std::string_view text, Config base) {
  // Work on a copy: a bad item leaves the caller's config as it was.
  Config c = base;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = trim(text.substr(pos, comma - pos));
    if (!item.empty()) apply_item(c, item);
    pos = comma + 1;
  }
  return c;
}

Config config_from_env() {
  const char* text = std::getenv("GVM_CONF");
  if (text == nullptr) return Config{};
  try {
    return parse_config(text);
  } catch (const config_error& e) {
    throw config_error(std::string("GVM_CONF: ") + e.what());
  }
}

const char* to_string(PeerPolicy p) noexcept {
  switch (p) {
    case PeerPolicy::automatic: return "auto";
    case PeerPolicy::per_allocation: return "per_allocation";
    case PeerPolicy::global: return "global";
    case PeerPolicy::none: return "none";
  }
  return "?";
}

std::string to_string(const Config& c) {
  std::string out;
  auto add = [&out](std::string_view key, const std::string& value) {
    if (!out.empty()) out += ',';
    out.append(key).append(":").append(value);
  };
  add("arena_size", size_text(c.arena_bytes));
  add("max_chunk_size", size_text(c.max_chunk_bytes));
  add("reserve_slack", double_text(c.reserve_slack));
  add("max_reserved", size_text(c.max_reserved_bytes));
  if (c.memory_fraction == 0.0) {
    add("memory_fraction", "none");
  } else {
    add("memory_fraction", double_text(c.memory_fraction));
  }
  add("release_threshold", c.release_threshold_bytes == SIZE_MAX
                               ? std::string("none")
                               : size_text(c.release_threshold_bytes));
  add("small_max", size_text(c.small_block_max_bytes));
  add("span_warmup", std::to_string(c.span_warmup_allocations));
  add("span_max", size_text(c.span_max_bytes));
  add("shared_spans", c.shared_spans ? "true" : "false");
  add("no_vmm", c.force_no_vmm ? "true" : "false");
  add("peer_policy", to_string(c.peer_policy));
  add("scratch_chunk_size", size_text(c.scratch_chunk_bytes));
  add("scratch_arena_size", size_text(c.scratch_arena_bytes));
  add("fence", c.fence_enabled ? "true" : "false");
  add("scratch_fence", c.scratch_fence_tracked ? "tracked" : "devices");
  return out;
}

}  // namespace gvm
