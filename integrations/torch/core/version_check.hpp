// The backend is built against one PyTorch (its C++ classes have no stable
// ABI): loaded into another, it must refuse with a message that names both.
#pragma once

#include <string>
#include <string_view>

namespace gvm::torch_backend {

// "" when `running` is the version the backend was built for (torch.__version__,
// compared whole: 2.11.0+cu130 is not 2.11.0+cu128), else the message.
std::string version_mismatch(std::string_view built_for, std::string_view running);

}  // namespace gvm::torch_backend
