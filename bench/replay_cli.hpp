// The command line shared by gvm-replay and gvm-replay-baseline: --flag value
// or --flag=value, "--" before a trace name, -h/--help, and the options both
// tools take (--repeat, --json, --timeline, --timeline-every, TRACE). Each tool
// adds its own options through a callback. Also their one-line error report,
// and their JSON string, count and median helpers.
#pragma once

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "quoted_input.hpp"

namespace gvm::bench {

// A bad command line: the tool says what is wrong in one line (print_arg_error)
// and exits 1.
class ArgError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The one line a bad command line gets (docs/replay.md): the message and where
// the options are listed, not the whole usage text.
inline void print_arg_error(std::string_view tool, const ArgError& e) {
  std::cerr << tool << ": " << e.what() << " (" << tool << " --help lists the options)\n";
}

// An output file that cannot be written, with the system's reason.
class OutputFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Opens `path` for writing as `flag` will, so that a path that cannot be
// written fails when the command line is read, with the system's reason
// ("No such file or directory", "Permission denied"), and not after a replay of
// minutes. A file that did not exist before is removed again.
inline void check_writable(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    const int err = errno;
    throw OutputFileError(flag + " " + quoted_input(path) +
                          ": cannot write: " + std::strerror(err));
  }
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
}

// "1 allocation", "2 allocations".
inline std::string count_of(std::uint64_t n, std::string_view noun) {
  return std::to_string(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

struct ReplayArgs {
  int repeat = 1;
  bool json = false;
  std::string timeline;
  std::size_t timeline_every = 1;
  std::string trace;
  bool help = false;
};

inline long long parse_count(const std::string& flag, std::string_view text, long long min,
                             long long max) {
  long long v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min || v > max) {
    throw ArgError(flag + " wants an integer from " + std::to_string(min) + " to " +
                   std::to_string(max) + ", got " + quoted_input(text));
  }
  return v;
}

// One option the shared parser does not know: `value()` takes its value (from
// "=value" or the next argument). Returns false for an unknown option.
using ExtraOption =
    std::function<bool(const std::string& flag, const std::function<std::string()>& value)>;

inline void parse_replay_args(int argc, char** argv, ReplayArgs& a, const ExtraOption& extra) {
  bool have_trace = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      a.help = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      if (arg == "--") {
        if (++i >= argc) break;
        arg = argv[i];
      }
      if (have_trace)
        throw ArgError("more than one trace given: " + quoted_input(a.trace) + " and " +
                       quoted_input(arg));
      a.trace = arg;
      have_trace = true;
      continue;
    }
    std::string flag = arg;
    std::optional<std::string> inline_value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    const std::function<std::string()> value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw ArgError(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--json") {
      if (inline_value) throw ArgError("--json takes no value");
      a.json = true;
    } else if (flag == "--repeat") {
      a.repeat = static_cast<int>(parse_count(flag, value(), 1, 1000000));
    } else if (flag == "--timeline") {
      a.timeline = value();
      if (a.timeline.empty()) throw ArgError("--timeline needs a file name");
      check_writable(flag, a.timeline);
    } else if (flag == "--timeline-every") {
      a.timeline_every = static_cast<std::size_t>(parse_count(flag, value(), 1, 1LL << 40));
    } else if (!extra(flag, value)) {
      throw ArgError("unknown option " + quoted_input(arg));
    }
  }
}

// The shipped GPT-2 trace: in the source tree (GVM_SOURCE_DIR, a compile
// definition of the tools), else in the current directory.
inline std::string default_trace() {
  const std::string rel = "traces/gpt2_train.trace.gz";
#ifdef GVM_SOURCE_DIR
  const std::string in_source = std::string(GVM_SOURCE_DIR) + "/" + rel;
  if (std::ifstream(in_source).good()) return in_source;
#endif
  if (std::ifstream(rel).good()) return rel;
  throw ArgError("no trace given and the default " + rel +
                 " is neither in the source tree nor in the current directory");
}

// A JSON string literal for s (quotes, backslashes and control bytes escaped).
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// The median of a non-empty list (the mean of the middle two for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace gvm::bench
