// kernels::GradientKernels on CUDA tensors: device memory and the CUDA
// kernels of fusion (batched copy), compression (narrow/widen, the inf/NaN
// flag) and CSC (kernels/cuda/kernels.h), enqueued on the gradients' stream
// through gflow's CUDA component. The only file that calls the component's
// kernel entries. The collective between a fused op's steps runs on the same
// stream (NCCL) or waits for it (staging), so the order on the GPU is
// pack -> collective -> unpack without host round trips in between.
//
// Used from the communicator's executing thread (the ops' before/after
// steps) and, for setup, from the reducer's constructor. Every CUDA failure
// throws gflow::Error(kInternal) naming what failed.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gflow/types.h"
#include "kernels/cuda/plugin.h"
#include "kernels/gradient_kernels.h"

namespace gflow::gradient {

class CudaKernels final : public kernels::GradientKernels {
 public:
  // For gradients on `device` produced on `stream` (cudaStream_t); `maxTensors`
  // bounds the tensors of one bucket (the segment table of a copy).
  CudaKernels(const cuda::Plugin& plugin, int device, void* stream, size_t maxTensors);
  ~CudaKernels() override;
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  int device() const { return device_; }
  void* stream() const override { return stream_; }
  Device where() const override { return Device{DeviceType::kCUDA, device_}; }

  void* allocate(size_t bytes) override;
  void zero(void* p, size_t bytes) override;  // waits for the stream
  void* acquire(size_t bytes) override;       // reused blocks
  void release(void* block) override;
  void copy(const std::vector<Copy>& copies) override;  // one kernel
  void narrow(void* dst, const float* src, size_t count, DataType wire, float scale) override;
  void widen(float* dst, const void* src, size_t count, DataType wire, float scale) override;
  bool nonFinite(const void* data, size_t count, DataType dtype) override;
  // CSC stages each bucket contiguously (one batched copy in, one out).
  size_t stagingElements(size_t n) const override { return n; }
  void accumulateChunkNorms(SparseBucket& b, float m, float* norms) override;
  size_t topChunksTempBytes(size_t count) const override;
  void topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, void* temp,
                 size_t tempBytes) override;
  void gatherChunks(float* packed, const SparseBucket& b, const uint32_t* idx, size_t k) override;
  void scatterChunks(SparseBucket& b, const float* packed, const uint32_t* idx, size_t k,
                     bool maskVelocity) override;
  void synchronize() override;

 private:
  void check(int err, const char* what) const;

  const cuda::Plugin& p_;
  int device_;
  void* stream_;
  size_t maxSegments_;
  void* segmentsHost_ = nullptr;    // pinned table of the last copy
  void* segmentsDevice_ = nullptr;  // its device copy
  int* flagDevice_ = nullptr;
  int* flagHost_ = nullptr;  // pinned
  std::vector<void*> owned_;
  struct Block {
    void* p;
    size_t bytes;
    bool busy;
  };
  std::mutex blocksMutex_;
  std::vector<Block> blocks_;
};

// The GPU all `tensors` live on, or -1 when they are all cpu tensors. Sets
// `why` (and returns -2) when they mix devices or streams, or a pointer is
// not memory of the GPU its tensor names.
int commonDevice(const cuda::Plugin* plugin, const std::vector<Tensor>& tensors,
                 const std::vector<std::string>& names, std::string* why);

}  // namespace gflow::gradient
