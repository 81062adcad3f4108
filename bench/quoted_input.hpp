// quoted_input(text): a piece of user input as a message quotes it, 'like this', in
// full up to 64 characters; longer, by its start and its length, so that a
// million-digit size or a runaway line does not flood the terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gvm::bench {

inline std::string quoted_input(std::string_view text) {
  constexpr std::size_t kWhole = 64;  // longer input is cut
  constexpr std::size_t kStart = 24;  // what is kept of it
  // Built by appends: g++ 12 warns -Wrestrict on "'" + std::string(...).
  std::string out(1, '\'');
  if (text.size() <= kWhole) {
    out.append(text).push_back('\'');
    return out;
  }
  out.append(text.substr(0, kStart)).append("...' (");
  out.append(std::to_string(text.size())).append(" characters)");
  return out;
}

}  // namespace gvm::bench
