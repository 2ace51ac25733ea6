// GradientKernels on CUDA memory: device memory and the CUDA kernels of
// fusion (batched copy), compression (narrow/widen, the inf/NaN flag), the
// float32 scale and CSC (kernels/cuda/kernels.h), enqueued on one stream of
// one GPU through gflow's CUDA component (kernels/cuda/plugin.h). The only
// file that calls the component's kernel entries. A fused op's collective
// waits for what its before step enqueued (backend::inputsProduced records
// an event after it) and has finished on the GPU when its after step runs,
// so the order on the GPU is pack -> collective -> unpack without a host
// round trip before the collective.
//
// Made on any thread (a reducer's constructor, or the first op of a
// communicator that needs them), then used from one thread at a time (the
// communicator's executing thread, which runs the ops' before/after steps);
// acquire()/release() from any thread. Every CUDA failure throws
// gflow::Error(kInternal) naming the GPU and what failed.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "gflow/types.h"
#include "kernels/cuda/plugin.h"
#include "kernels/gradient_kernels.h"

namespace gflow::kernels {

class CudaKernels final : public GradientKernels {
 public:
  // For memory of `device` and work on `stream` (cudaStream_t).
  // `maxTensors`: the copies of one batch expected (the first size of the
  // segment table; a bigger batch grows it).
  CudaKernels(const gflow::cuda::Plugin& plugin, int device, void* stream, size_t maxTensors);
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
  void copy(const std::vector<Copy>& copies) override;    // one kernel
  void toHost(const std::vector<Copy>& copies) override;  // memcpyAsync each, then waits
  void narrow(void* dst, const float* src, size_t count, DataType wire, float scale,
              float* residual) override;
  void widen(float* dst, const void* src, size_t count, DataType wire, float scale) override;
  void scale(float* data, size_t count, float k) override;
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
  // After each launch: `done_` follows the stream's last work of ours.
  void launched();

  const gflow::cuda::Plugin& p_;
  int device_;
  void* stream_;          // the caller's: it may be destroyed before we are
  void* done_ = nullptr;  // event after our last work on stream_
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

}  // namespace gflow::kernels
