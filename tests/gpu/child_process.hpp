// Runs a helper program in a child process and collects what it printed.
// The hazard tests need this: a sticky driver error poisons the whole
// process, so the unfenced cases run where they cannot hurt the test binary.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace gvm::test {

struct ChildResult {
  int exit_code = -1;      // -1 when it did not exit normally
  int signal = 0;          // the signal that ended it, if any
  bool timed_out = false;  // killed after the timeout
  std::string output;      // stdout and stderr, interleaved
  std::string error;       // why it could not be started, if it was not
};

// Starts `path args...` (no shell), waits at most `timeout_s` seconds.
ChildResult run_child(const std::string& path, const std::vector<std::string>& args, int timeout_s);

// The "key=value" lines of a child's output (later lines win).
std::map<std::string, std::string> parse_key_values(const std::string& output);

}  // namespace gvm::test
