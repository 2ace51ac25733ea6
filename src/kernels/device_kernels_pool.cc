#include "kernels/device_kernels_pool.h"

#include <string>

#include "common/check.h"
#include "kernels/cuda/plugin.h"
#include "kernels/cuda_kernels.h"
#include "kernels/host_kernels.h"

namespace gflow::kernels {

namespace {

// The first size of a pooled CudaKernels' copy table (copy() grows it).
constexpr size_t kInitialSegments = 64;

}  // namespace

DeviceKernelsPool::~DeviceKernelsPool() = default;

std::shared_ptr<GradientKernels> DeviceKernelsPool::get(Device where, void* stream) {
  if (where.type != DeviceType::kCUDA) return hostKernels();
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<GradientKernels>& slot = kernels_[{where.index, stream}];
  if (!slot) {
    std::string why;
    const gflow::cuda::Plugin* plugin = gflow::cuda::load(&why);
    if (!plugin) {
      GFLOW_THROW(kInternal, ErrorContext{})
          << "kernels for cuda:" << where.index << " need gflow's CUDA component: " << why;
    }
    slot = std::make_shared<CudaKernels>(*plugin, where.index, stream, kInitialSegments);
  }
  return slot;
}

}  // namespace gflow::kernels
