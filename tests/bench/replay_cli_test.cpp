// The replay tools' shared command line (bench/replay_cli.hpp) and input
// quoting (bench/quoted_input.hpp): the pieces of their messages.
#include "replay_cli.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "quoted_input.hpp"

namespace gvm::bench {
namespace {

TEST(ReplayCli, CountsSayOneInTheSingular) {
  EXPECT_EQ(count_of(0, "allocation"), "0 allocations");
  EXPECT_EQ(count_of(1, "allocation"), "1 allocation");
  EXPECT_EQ(count_of(2, "free"), "2 frees");
}

TEST(ReplayCli, LongInputIsQuotedByItsStartAndLength) {
  EXPECT_EQ(quoted_input("abc"), "'abc'");
  EXPECT_EQ(quoted_input(std::string(64, 'x')), "'" + std::string(64, 'x') + "'");
  EXPECT_EQ(quoted_input(std::string(65, 'x')), "'xxxxxxxxxxxxxxxxxxxxxxxx...' (65 characters)");
}

TEST(ReplayCli, ACountOutOfRangeIsNotEchoedInFull) {
  try {
    (void)parse_count("--repeat", std::string(100000, '9'), 1, 10);
    FAIL() << "accepted";
  } catch (const ArgError& e) {
    EXPECT_LT(std::string(e.what()).size(), 120u) << e.what();
    EXPECT_NE(std::string(e.what()).find("(100000 characters)"), std::string::npos) << e.what();
  }
}

TEST(ReplayCli, AnUnwritableOutputFileFailsWithTheSystemsReason) {
  try {
    check_writable("--timeline", "/nonexistent-gvm-dir/t.csv");
    FAIL() << "accepted";
  } catch (const OutputFileError& e) {
    EXPECT_STREQ(
        e.what(),
        "--timeline '/nonexistent-gvm-dir/t.csv': cannot write: No such file or directory");
  }
  // A writable path is left as it was: not created by the check.
  const std::string path = ::testing::TempDir() + "gvm_replay_cli_new.csv";
  std::remove(path.c_str());
  check_writable("--timeline", path);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(ReplayCli, ABadCommandLineIsOneLine) {
  ::testing::internal::CaptureStderr();
  print_arg_error("gvm-replay", ArgError("unknown option '--x'"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "gvm-replay: unknown option '--x' (gvm-replay --help lists the options)\n");
}

}  // namespace
}  // namespace gvm::bench
