#include "gvm/vmm/result.hpp"

namespace gvm::vmm {

std::string result_name(Result r) {
  switch (r) {
    case Result::success: return "CUDA_SUCCESS";
    case Result::invalid_value: return "CUDA_ERROR_INVALID_VALUE";
    case Result::out_of_memory: return "CUDA_ERROR_OUT_OF_MEMORY";
    case Result::not_initialized: return "CUDA_ERROR_NOT_INITIALIZED";
    case Result::deinitialized: return "CUDA_ERROR_DEINITIALIZED";
    case Result::no_device: return "CUDA_ERROR_NO_DEVICE";
    case Result::invalid_device: return "CUDA_ERROR_INVALID_DEVICE";
    case Result::invalid_context: return "CUDA_ERROR_INVALID_CONTEXT";
    case Result::invalid_handle: return "CUDA_ERROR_INVALID_HANDLE";
    case Result::illegal_state: return "CUDA_ERROR_ILLEGAL_STATE";
    case Result::not_found: return "CUDA_ERROR_NOT_FOUND";
    case Result::not_ready: return "CUDA_ERROR_NOT_READY";
    case Result::illegal_address: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case Result::peer_access_already_enabled: return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    case Result::peer_access_not_enabled: return "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED";
    case Result::context_is_destroyed: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case Result::launch_failed: return "CUDA_ERROR_LAUNCH_FAILED";
    case Result::not_permitted: return "CUDA_ERROR_NOT_PERMITTED";
    case Result::not_supported: return "CUDA_ERROR_NOT_SUPPORTED";
    case Result::stream_capture_unsupported: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case Result::stream_capture_invalidated: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case Result::stream_capture_unmatched: return "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED";
    case Result::stream_capture_unjoined: return "CUDA_ERROR_STREAM_CAPTURE_UNJOINED";
    case Result::stream_capture_isolation: return "CUDA_ERROR_STREAM_CAPTURE_ISOLATION";
    case Result::stream_capture_implicit: return "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT";
    case Result::captured_event: return "CUDA_ERROR_CAPTURED_EVENT";
    case Result::stream_capture_wrong_thread: return "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD";
    case Result::unknown: return "CUDA_ERROR_UNKNOWN";
  }
  return "CUresult(" + std::to_string(static_cast<int>(r)) + ")";
}

DriverError::DriverError(Result result, const std::string& what_was_called)
    : std::runtime_error(what_was_called + " failed: " + result_name(result)), result_(result) {}

}  // namespace gvm::vmm
