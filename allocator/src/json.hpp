// Tiny JSON writing helpers (internal): gvmalloc emits JSON for its stats and
// has no JSON library dependency.
#pragma once

#include <string>
#include <string_view>

namespace gvm::detail {

// Appends `s` as a JSON string literal (quotes included). Control characters,
// quote and backslash are escaped; other bytes pass through (the input is
// expected to be UTF-8).
void append_json_string(std::string& out, std::string_view s);

}  // namespace gvm::detail
