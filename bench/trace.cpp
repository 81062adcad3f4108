#include "trace.hpp"

#include <zlib.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>

#include "quoted_input.hpp"

namespace gvm::bench {

namespace {

std::string format_error(const std::string& source, std::size_t line, const std::string& message) {
  if (line == 0) return source + ": " + message;
  return source + ":" + std::to_string(line) + ": " + message;
}

// Splits a line on blanks (space, tab) into at most `max` fields; returns how
// many fields there are in total (which may exceed `max`).
std::size_t split_fields(std::string_view line, std::string_view* fields, std::size_t max) {
  std::size_t n = 0;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i == line.size()) break;
    std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (n < max) fields[n] = line.substr(start, i - start);
    ++n;
  }
  return n;
}

class LineParser {
 public:
  LineParser(Trace& trace, std::size_t line) : trace_(trace), line_(line) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw TraceError(trace_.source, line_, message);
  }

  std::uint64_t number(std::string_view field, const char* what) const {
    std::uint64_t value = 0;
    auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
    if (ec == std::errc::result_out_of_range) {
      fail(std::string("<") + what + "> " + quoted_input(field) + " is too large");
    }
    if (ec != std::errc() || end != field.data() + field.size()) {
      fail(std::string("bad <") + what + "> " + quoted_input(field) +
           ": expected a non-negative decimal integer");
    }
    return value;
  }

 private:
  Trace& trace_;
  std::size_t line_;
};

struct LiveBlock {
  std::uint32_t block;
  std::size_t line;  // where it was allocated
};

class Builder {
 public:
  explicit Builder(Trace& trace) : trace_(trace) { stream_index_.emplace(0, 0); }

  void line(std::string_view text, std::size_t line_no) {
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    std::string_view f[4];
    const std::size_t n = split_fields(text, f, 4);
    if (n == 0 || f[0][0] == '#') return;
    LineParser p(trace_, line_no);
    if (f[0] == "a") {
      if (n != 4) {
        p.fail("'a' takes 3 fields (a <id> <bytes> <stream>), got " + std::to_string(n - 1));
      }
      // One statement per field: the order of function arguments is unspecified
      // (g++ reads them right to left), and the first bad field must be named.
      const std::uint64_t id = p.number(f[1], "id");
      const std::uint64_t bytes = p.number(f[2], "bytes");
      const std::uint64_t stream_id = p.number(f[3], "stream");
      allocate(p, id, bytes, stream_id, line_no);
    } else if (f[0] == "f") {
      if (n != 3) p.fail("'f' takes 2 fields (f <id> <stream>), got " + std::to_string(n - 1));
      const std::uint64_t id = p.number(f[1], "id");
      const std::uint64_t stream_id = p.number(f[2], "stream");
      free(p, id, stream_id, line_no);
    } else {
      p.fail("unknown event " + quoted_input(f[0]) +
             " (expected 'a <id> <bytes> <stream>' or 'f <id> <stream>')");
    }
  }

  void finish() {
    trace_.end_live_bytes = live_bytes_;
    trace_.end_live_blocks = live_.size();
  }

 private:
  std::uint16_t stream(const LineParser& p, std::uint64_t id) {
    auto it = stream_index_.find(id);
    if (it != stream_index_.end()) return it->second;
    if (trace_.stream_ids.size() > std::numeric_limits<std::uint16_t>::max()) {
      p.fail("too many distinct streams (the reader keeps at most 65536)");
    }
    auto index = static_cast<std::uint16_t>(trace_.stream_ids.size());
    trace_.stream_ids.push_back(id);
    stream_index_.emplace(id, index);
    return index;
  }

  void allocate(const LineParser& p, std::uint64_t id, std::uint64_t bytes, std::uint64_t stream_id,
                std::size_t line_no) {
    if (bytes == 0)
      p.fail("<bytes> is 0 (id " + std::to_string(id) + "): an allocation needs 1 or more");
    if (auto it = live_.find(id); it != live_.end()) {
      p.fail("duplicate id " + std::to_string(id) + ": already live, allocated at line " +
             std::to_string(it->second.line));
    }
    if (trace_.block_ids.size() > std::numeric_limits<std::uint32_t>::max()) {
      p.fail("too many allocations (the reader keeps at most 2^32)");
    }
    if (bytes > std::numeric_limits<std::uint64_t>::max() - live_bytes_) {
      p.fail("live bytes overflow 64 bits");
    }
    const std::uint16_t s = stream(p, stream_id);
    const auto block = static_cast<std::uint32_t>(trace_.block_ids.size());
    trace_.block_ids.push_back(id);
    block_bytes_.push_back(bytes);
    live_.emplace(id, LiveBlock{block, line_no});
    freed_.erase(id);
    trace_.events.push_back(TraceEvent{bytes, block, s, TraceOp::allocate});
    ++trace_.allocations;
    live_bytes_ += bytes;
    if (live_bytes_ > trace_.peak_live_bytes) trace_.peak_live_bytes = live_bytes_;
  }

  void free(const LineParser& p, std::uint64_t id, std::uint64_t stream_id, std::size_t line_no) {
    auto it = live_.find(id);
    if (it == live_.end()) {
      if (auto f = freed_.find(id); f != freed_.end()) {
        p.fail("free of id " + std::to_string(id) + ", already freed at line " +
               std::to_string(f->second));
      }
      p.fail("free of unknown id " + std::to_string(id) + " (never allocated)");
    }
    const std::uint16_t s = stream(p, stream_id);
    const std::uint32_t block = it->second.block;
    const std::uint64_t bytes = block_bytes_[block];
    live_.erase(it);
    freed_[id] = line_no;
    trace_.events.push_back(TraceEvent{bytes, block, s, TraceOp::free});
    ++trace_.frees;
    live_bytes_ -= bytes;
  }

  Trace& trace_;
  std::unordered_map<std::uint64_t, std::uint16_t> stream_index_;
  std::unordered_map<std::uint64_t, LiveBlock> live_;
  std::unordered_map<std::uint64_t, std::size_t> freed_;  // id -> line of its last free
  std::vector<std::uint64_t> block_bytes_;
  std::uint64_t live_bytes_ = 0;
};

struct FileCloser {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
struct GzCloser {
  void operator()(gzFile_s* f) const noexcept { gzclose(f); }
};

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string read_plain(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw TraceError(path, 0, "cannot open: " + errno_text(errno));
  std::string data;
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) data.append(buf, n);
  if (std::ferror(f.get())) throw TraceError(path, 0, "read error: " + errno_text(errno));
  return data;
}

std::string read_gzip(const std::string& path) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw TraceError(path, 0, "cannot open: " + errno_text(errno));
  // A larger input buffer than zlib's 8 KiB default: fewer read() calls.
  gzbuffer(f.get(), 1 << 18);
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f.get(), buf, sizeof buf);
    if (n < 0) break;
    data.append(buf, static_cast<std::size_t>(n));
    if (n == 0) break;
  }
  // A truncated or corrupt stream shows here (zlib: "unexpected end of file").
  int errnum = Z_OK;
  const char* msg = gzerror(f.get(), &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) {
    throw TraceError(path, 0, std::string("gzip error: ") + (msg ? msg : "unknown"));
  }
  return data;
}

}  // namespace

TraceError::TraceError(const std::string& source, std::size_t line, const std::string& message)
    : std::runtime_error(format_error(source, line, message)), line_(line) {}

bool is_gzip(std::string_view bytes) noexcept {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

Trace parse_trace(std::string_view text, std::string source) {
  Trace trace;
  trace.source = std::move(source);
  // The shipped trace averages 13.5 bytes a line; reserving for 12 makes the
  // event vector grow once, with at most ~15% to spare.
  trace.events.reserve(text.size() / 12 + 1);
  Builder builder(trace);
  std::size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const std::size_t eol = text.find('\n');
    builder.line(text.substr(0, eol), line_no);
    if (eol == std::string_view::npos) break;
    text.remove_prefix(eol + 1);
  }
  builder.finish();
  return trace;
}

Trace read_trace(const std::string& path) {
  std::string head;
  {
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
    if (!f) throw TraceError(path, 0, "cannot open: " + errno_text(errno));
    char magic[2];
    head.assign(magic, std::fread(magic, 1, sizeof magic, f.get()));
  }
  std::string text = is_gzip(head) ? read_gzip(path) : read_plain(path);
  if (text.find('\0') != std::string::npos) {
    throw TraceError(path, 0, "not a text trace (contains NUL bytes)");
  }
  Trace trace = parse_trace(text, path);
  // A replay of nothing would report a ratio of 0 and look like a result.
  if (trace.events.empty()) {
    throw TraceError(path, 0,
                     text.empty() ? "no events: the file is empty"
                                  : "no events: the file holds only blank lines and comments");
  }
  return trace;
}

}  // namespace gvm::bench
