// The trace reader: parsing, gzip, every error with its line number, and the
// shipped trace's documented counts.
#include "trace.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace gvm::bench {
namespace {

std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "gvm_trace_" + info->name() + "_" + name;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out) << path;
  out << bytes;
}

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Allocations 100 + 200 on stream 0, 50 on stream 7; id 1 is freed and used
// again. Live bytes after each event: 100, 300, 350, 250, 650 (peak), 600, 400.
const char* const kSmall =
    "# a comment\n"
    "a 1 100 0\n"
    "a 2 200 0\n"
    "\n"
    "a 3 50 7\n"
    "f 1 7\n"
    "a 1 400 7\n"
    "f 3 0\n"
    "f 2 0\n";

void expect_small(const Trace& t) {
  EXPECT_EQ(t.allocations, 4u);
  EXPECT_EQ(t.frees, 3u);
  EXPECT_EQ(t.peak_live_bytes, 650u);
  EXPECT_EQ(t.end_live_bytes, 400u);
  EXPECT_EQ(t.end_live_blocks, 1u);
  ASSERT_EQ(t.stream_ids, (std::vector<std::uint64_t>{0, 7}));
  // id 1 allocated twice: two distinct dense blocks.
  ASSERT_EQ(t.block_ids, (std::vector<std::uint64_t>{1, 2, 3, 1}));
  ASSERT_EQ(t.events.size(), 7u);
  EXPECT_EQ(t.events[0].op, TraceOp::allocate);
  EXPECT_EQ(t.events[0].block, 0u);
  EXPECT_EQ(t.events[0].bytes, 100u);
  EXPECT_EQ(t.events[2].stream, 1u);
  // A free carries the block and its size, on the stream the trace names.
  EXPECT_EQ(t.events[3].op, TraceOp::free);
  EXPECT_EQ(t.events[3].block, 0u);
  EXPECT_EQ(t.events[3].bytes, 100u);
  EXPECT_EQ(t.events[3].stream, 1u);
  EXPECT_EQ(t.events[4].block, 3u);
  EXPECT_EQ(t.events[4].bytes, 400u);
  EXPECT_EQ(t.events[5].block, 2u);
  EXPECT_EQ(t.events[5].stream, 0u);
}

TEST(TraceReader, ParsesInlineText) {
  Trace t = parse_trace(kSmall, "small");
  EXPECT_EQ(t.source, "small");
  expect_small(t);
}

TEST(TraceReader, AcceptsTabsCrlfAndNoFinalNewline) {
  Trace t = parse_trace("a\t1  100\t0\r\na 2 5 3\r\nf 1 0", "x");
  EXPECT_EQ(t.allocations, 2u);
  EXPECT_EQ(t.frees, 1u);
  EXPECT_EQ(t.peak_live_bytes, 105u);
  EXPECT_EQ(t.end_live_bytes, 5u);
  EXPECT_EQ(t.stream_ids, (std::vector<std::uint64_t>{0, 3}));
}

TEST(TraceReader, EmptyTraceHasNoEvents) {
  Trace t = parse_trace("", "empty");
  EXPECT_TRUE(t.events.empty());
  EXPECT_EQ(t.peak_live_bytes, 0u);
  EXPECT_EQ(t.stream_count(), 1u);
}

TEST(TraceReader, ReadsPlainAndGzipFilesAlike) {
  const std::string plain = temp_path("plain.trace");
  const std::string gz = temp_path("small.trace.gz");
  write_file(plain, kSmall);
  write_gzip(gz, kSmall);
  ASSERT_TRUE(is_gzip(read_file(gz)));
  ASSERT_FALSE(is_gzip(read_file(plain)));

  Trace a = read_trace(plain);
  Trace b = read_trace(gz);
  EXPECT_EQ(a.source, plain);
  EXPECT_EQ(b.source, gz);
  expect_small(a);
  expect_small(b);
  std::remove(plain.c_str());
  std::remove(gz.c_str());
}

// The error for `text`, which must be a TraceError.
TraceError error_of(const std::string& text) {
  try {
    parse_trace(text, "t.trace");
  } catch (const TraceError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return TraceError("", 0, "");
}

struct BadLine {
  const char* text;
  std::size_t line;
  const char* message;  // the whole message, source and line included
};

TEST(TraceReader, EveryErrorNamesItsLine) {
  const BadLine cases[] = {
      {"a 1 10 0\nx 2 3 0\n", 2,
       "t.trace:2: unknown event 'x' (expected 'a <id> <bytes> <stream>' or 'f <id> <stream>')"},
      {"alloc 1 10 0\n", 1,
       "t.trace:1: unknown event 'alloc' (expected 'a <id> <bytes> <stream>' or 'f <id> "
       "<stream>')"},
      {"a 1 10\n", 1, "t.trace:1: 'a' takes 3 fields (a <id> <bytes> <stream>), got 2"},
      {"a 1 10 0 9\n", 1, "t.trace:1: 'a' takes 3 fields (a <id> <bytes> <stream>), got 4"},
      {"a 1 10 0\nf 1\n", 2, "t.trace:2: 'f' takes 2 fields (f <id> <stream>), got 1"},
      {"a 1 10 0\nf 1 0 0\n", 2, "t.trace:2: 'f' takes 2 fields (f <id> <stream>), got 3"},
      {"a x 10 0\n", 1, "t.trace:1: bad <id> 'x': expected a non-negative decimal integer"},
      {"a 1 -10 0\n", 1, "t.trace:1: bad <bytes> '-10': expected a non-negative decimal integer"},
      {"a 1 10k 0\n", 1, "t.trace:1: bad <bytes> '10k': expected a non-negative decimal integer"},
      {"a 1 10 s\n", 1, "t.trace:1: bad <stream> 's': expected a non-negative decimal integer"},
      {"a 1 99999999999999999999 0\n", 1, "t.trace:1: <bytes> '99999999999999999999' is too large"},
      {"\n\na 1 0 0\n", 3, "t.trace:3: <bytes> is 0 (id 1): an allocation needs 1 or more"},
      {"a 1 10 0\na 2 10 0\na 1 10 0\n", 3,
       "t.trace:3: duplicate id 1: already live, allocated at line 1"},
      {"a 1 10 0\nf 2 0\n", 2, "t.trace:2: free of unknown id 2 (never allocated)"},
      {"a 1 10 0\n# x\nf 1 0\nf 1 0\n", 4, "t.trace:4: free of id 1, already freed at line 3"},
      {"a 1 18446744073709551615 0\na 2 1 0\n", 2, "t.trace:2: live bytes overflow 64 bits"},
      // Every field bad: the first is named (g++ evaluated the arguments of one
      // call right to left and blamed <stream>).
      {"a x y z\n", 1, "t.trace:1: bad <id> 'x': expected a non-negative decimal integer"},
      {"a 1 y z\n", 1, "t.trace:1: bad <bytes> 'y': expected a non-negative decimal integer"},
      {"a 1 10 0\nf x z\n", 2, "t.trace:2: bad <id> 'x': expected a non-negative decimal integer"},
  };
  for (const BadLine& c : cases) {
    SCOPED_TRACE(c.text);
    TraceError e = error_of(c.text);
    EXPECT_EQ(e.line(), c.line);
    EXPECT_STREQ(e.what(), c.message);
  }
}

// A runaway field is quoted by its start and its length, not echoed in full.
TEST(TraceReader, HugeFieldsAreNotEchoedInFull) {
  const std::string digits(1000000, '9');
  const std::string junk(1000000, 'k');
  EXPECT_EQ(std::string(error_of("a 1 " + digits + " 0\n").what()),
            "t.trace:1: <bytes> '999999999999999999999999...' (1000000 characters) is too large");
  EXPECT_EQ(std::string(error_of("a 1 1" + junk + " 0\n").what()),
            "t.trace:1: bad <bytes> '1kkkkkkkkkkkkkkkkkkkkkkk...' (1000001 characters): expected a "
            "non-negative decimal integer");
  EXPECT_LT(std::string(error_of(junk + "\n").what()).size(), 200u);
}

// A file without one event is refused: a replay of it would print a ratio of 0.
TEST(TraceReader, FileWithoutEventsIsAnError) {
  const struct {
    const char* text;
    const char* why;
  } cases[] = {
      {"", "no events: the file is empty"},
      {"# only a comment\n\n   \n# and another\n",
       "no events: the file holds only blank lines and comments"},
  };
  for (const auto& c : cases) {
    const std::string path = temp_path("no_events.trace");
    write_file(path, c.text);
    try {
      read_trace(path);
      ADD_FAILURE() << "no error for '" << c.text << "'";
    } catch (const TraceError& e) {
      EXPECT_EQ(e.line(), 0u);
      EXPECT_EQ(std::string(e.what()), path + ": " + c.why);
    }
    std::remove(path.c_str());
  }
}

TEST(TraceReader, MissingFileIsAnError) {
  const std::string path = temp_path("does_not_exist.trace");
  try {
    read_trace(path);
    FAIL() << "no error";
  } catch (const TraceError& e) {
    EXPECT_EQ(e.line(), 0u);
    EXPECT_EQ(std::string(e.what()), path + ": cannot open: No such file or directory");
  }
}

TEST(TraceReader, TruncatedGzipIsAnError) {
  const std::string gz = temp_path("full.trace.gz");
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "a " + std::to_string(i) + " 512 0\n";
  write_gzip(gz, text);
  std::string bytes = read_file(gz);
  ASSERT_GT(bytes.size(), 100u);
  const std::string cut = temp_path("cut.trace.gz");
  write_file(cut, bytes.substr(0, bytes.size() / 2));
  try {
    read_trace(cut);
    FAIL() << "a truncated gzip file was read without error";
  } catch (const TraceError& e) {
    EXPECT_EQ(e.line(), 0u);
    EXPECT_NE(std::string(e.what()).find(cut + ": gzip error: "), std::string::npos) << e.what();
  }
  std::remove(gz.c_str());
  std::remove(cut.c_str());
}

TEST(TraceReader, BinaryFileIsAnError) {
  const std::string path = temp_path("binary");
  write_file(path, std::string("a 1 10 0\n\0\x01\x02", 12));
  try {
    read_trace(path);
    FAIL() << "no error";
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": not a text trace (contains NUL bytes)");
  }
  std::remove(path.c_str());
}

// The figures README/DESIGN give for the shipped trace; the peak is recomputed
// here from the requested sizes in the file.
TEST(TraceReader, ShippedTrace) {
  const std::string path = std::string(GVM_SOURCE_DIR) + "/traces/gpt2_train.trace.gz";
  Trace t = read_trace(path);
  EXPECT_EQ(t.allocations, 57421u);
  EXPECT_EQ(t.frees, 57418u);
  EXPECT_EQ(t.events.size(), 57421u + 57418u);
  EXPECT_EQ(t.end_live_blocks, 3u);
  EXPECT_EQ(t.stream_count(), 1u);
  EXPECT_EQ(t.peak_live_bytes, 19089979616u);
}

}  // namespace
}  // namespace gvm::bench
