// DeviceKernelsPool: the GradientKernels of a communicator's device
// buffers, one CudaKernels per (GPU, stream), made on first use and kept
// until the pool goes. A communicator owns one and destroys it after its
// executor's last op, so the device memory those kernels hand out (the
// wire buffers of compressed allreduces, allreduceCoalesced's fusion
// regions) is never freed while an op runs: cudaFree synchronizes the
// device and could wait on another communicator's NCCL kernels.
//
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "gflow/types.h"
#include "kernels/gradient_kernels.h"

namespace gflow::kernels {

class DeviceKernelsPool {
 public:
  DeviceKernelsPool() = default;
  ~DeviceKernelsPool();
  DeviceKernelsPool(const DeviceKernelsPool&) = delete;
  DeviceKernelsPool& operator=(const DeviceKernelsPool&) = delete;

  // The kernels for memory on `where` with work on `stream`: hostKernels()
  // for host memory; for a GPU this pool's CudaKernels of (GPU, stream).
  // Throws gflow::Error(kInternal) when the CUDA component cannot be
  // loaded or CUDA fails making them (callers check the tensor's placement
  // first, so neither happens for a tensor an op accepted).
  std::shared_ptr<GradientKernels> get(Device where, void* stream);

 private:
  std::mutex mutex_;
  std::map<std::pair<int, void*>, std::shared_ptr<GradientKernels>> kernels_;
};

}  // namespace gflow::kernels
