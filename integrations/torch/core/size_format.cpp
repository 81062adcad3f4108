#include "size_format.hpp"

#include <cstdio>

namespace gvm::torch_backend {

std::string format_size(std::uint64_t bytes) {
  char buf[64];
  const auto b = static_cast<double>(bytes);
  if (bytes <= 1024) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else if (bytes <= (std::uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  } else if (bytes <= (std::uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  }
  return buf;
}

}  // namespace gvm::torch_backend
