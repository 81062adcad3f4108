// gvmalloc as a benchmark backend: gvm::Allocator on the real driver
// (gvm_cuda) or on a simulated H200 (gvm_sim_h200, the front end and the
// simulator's bookkeeping, no GPU). Streams come from TestDriver::stream_create.
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace gvm::bench {
namespace {

constexpr int kDevice = 0;

class GvmBackend final : public Backend {
 public:
  explicit GvmBackend(vmm::Driver& driver) : allocator_(driver, config_from_env()) {}
  void* allocate(std::size_t bytes, StreamHandle stream) override {
    return allocator_.allocate(bytes, kDevice, stream);
  }
  void deallocate(void* p, std::size_t bytes, StreamHandle stream) override {
    allocator_.deallocate(p, bytes, kDevice, stream);
  }
  std::optional<std::size_t> reserved_bytes() override {
    return allocator_.device_stats(kDevice).reserved_bytes;
  }
  std::optional<std::size_t> peak_reserved_bytes() override {
    return allocator_.device_stats(kDevice).peak_reserved_bytes;
  }
  std::optional<std::uint64_t> driver_calls() override {
    return allocator_.stats().driver.total_calls();
  }

 private:
  Allocator allocator_;
};

class GvmHost final : public BackendHost {
 public:
  GvmHost(BackendKind kind, std::unique_ptr<vmm::TestDriver> driver)
      : kind_(kind), driver_(std::move(driver)) {}
  GvmHost(const GvmHost&) = delete;
  GvmHost& operator=(const GvmHost&) = delete;
  ~GvmHost() override {
    for (StreamHandle s : streams_) {
      (void)driver_->stream_synchronize(kDevice, s);
      (void)driver_->stream_destroy(kDevice, s);
    }
  }

  BackendKind kind() const override { return kind_; }
  void bind_thread() override {}  // the driver API names the device in every call
  StreamHandle stream(std::size_t index) override {
    std::lock_guard<std::mutex> lock(mutex_);
    while (streams_.size() <= index) {
      StreamHandle s = nullptr;
      vmm::check(driver_->stream_create(kDevice, &s), "cuStreamCreate");
      streams_.push_back(s);
    }
    return streams_[index];
  }
  void synchronize(StreamHandle stream) override {
    vmm::check(driver_->stream_synchronize(kDevice, stream), "cuStreamSynchronize");
  }
  std::unique_ptr<Backend> make_backend(const BackendOptions&) override {
    return std::make_unique<GvmBackend>(*driver_);
  }

 private:
  BackendKind kind_;
  std::unique_ptr<vmm::TestDriver> driver_;
  std::mutex mutex_;
  std::vector<StreamHandle> streams_;
};

struct LoadedDriver {
  std::unique_ptr<vmm::TestDriver> driver;
  std::string problem;
};

// The real driver, loaded once; handed to the gvm_cuda host on first use.
LoadedDriver& loaded_driver() {
  static LoadedDriver d = [] {
    LoadedDriver r;
    std::string why;
    r.driver = vmm::try_load_cuda_test_driver(&why);
    if (!r.driver) {
      r.problem = why;
      return r;
    }
    int count = 0;
    if (r.driver->device_count(&count) != vmm::Result::success || count < 1) {
      r.problem = "the CUDA driver shows no device";
      r.driver.reset();
    }
    return r;
  }();
  return d;
}

}  // namespace

namespace detail {

const std::string& cuda_driver_problem() {
  return loaded_driver().problem;
}

BackendHost* gvm_host(BackendKind kind, std::string* why_not) {
  if (kind == BackendKind::gvm_sim_h200) {
    static GvmHost sim(kind, vmm::SimDriver::uniform(vmm::Profile::h200, 1));
    return &sim;
  }
  static std::once_flag once;
  static std::unique_ptr<GvmHost> real;
  std::call_once(once, [] {
    LoadedDriver& d = loaded_driver();
    if (d.driver) real = std::make_unique<GvmHost>(BackendKind::gvm_cuda, std::move(d.driver));
  });
  if (!real && why_not) *why_not = cuda_driver_problem();
  return real.get();
}

}  // namespace detail
}  // namespace gvm::bench
