// Allocation traces: the reader.
//
// Text, one event a line, optionally gzip-compressed (docs/replay.md,
// "Traces"):
//
//   a <id> <bytes> <stream>     allocate; <id> names the block until its free
//   f <id> <stream>             free
//
// Blank lines and lines starting with '#' are skipped. An id may be used
// again once its block is freed. Every field is a non-negative decimal integer
// and <bytes> is at least 1 (the allocator refuses 0 bytes).
//
// The reader turns ids and streams into dense indices, so that a replay keeps
// its live blocks in a flat vector instead of a hash map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gvm::bench {

enum class TraceOp : std::uint8_t { allocate, free };

// 16 bytes: the shipped trace (~115k events) takes under 2 MiB.
struct TraceEvent {
  std::uint64_t bytes;   // requested size (allocate); the block's size (free)
  std::uint32_t block;   // dense index of the block: 0, 1, 2, ... in order of allocation
  std::uint16_t stream;  // index into Trace::stream_ids
  TraceOp op;
};
static_assert(sizeof(TraceEvent) == 16);

struct Trace {
  std::string source;  // file name (or the name given to parse_trace)
  std::vector<TraceEvent> events;
  // stream_ids[i] is the trace's own number of stream index i; stream 0 of the
  // trace (the legacy default stream) is always index 0, present or not.
  std::vector<std::uint64_t> stream_ids{0};
  // block_ids[b]: the id the trace gave block b (for messages).
  std::vector<std::uint64_t> block_ids;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  // Sum of requested bytes of live blocks: its maximum over the trace, and
  // what is still live at the end.
  std::uint64_t peak_live_bytes = 0;
  std::uint64_t end_live_bytes = 0;
  std::uint64_t end_live_blocks = 0;

  std::size_t block_count() const noexcept { return block_ids.size(); }
  std::size_t stream_count() const noexcept { return stream_ids.size(); }
};

// A trace that cannot be read: names the source and, for a bad line, its
// 1-based number ("trace.txt:12: ...").
class TraceError : public std::runtime_error {
 public:
  TraceError(const std::string& source, std::size_t line, const std::string& message);
  // 0 when the error is not about one line (an unreadable file).
  std::size_t line() const noexcept { return line_; }

 private:
  std::size_t line_;
};

// Parses trace text. Throws TraceError naming the first bad line.
Trace parse_trace(std::string_view text, std::string source = "<trace>");

// Reads a trace file, plain text or gzip (recognised by its magic bytes).
// Throws TraceError for a file that cannot be opened or decompressed, a bad
// line, or a file without a single event.
Trace read_trace(const std::string& path);

// Whether `bytes` start with the gzip magic number (1f 8b).
bool is_gzip(std::string_view bytes) noexcept;

}  // namespace gvm::bench
