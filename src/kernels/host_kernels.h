// GradientKernels on host memory: the CPU kernels of this layer
// (convert.h, sparse.h) and memcpy, run on the calling thread. CSC works in
// place in the tensors, residual and velocity (no staging copies).
// Stateless apart from the memory allocate() hands out, which lives as long
// as the instance: an owner of such memory (CSC's residual) makes its own
// instance; the shared one (hostKernels()) serves callers that only compute.
// Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "kernels/gradient_kernels.h"

namespace gflow::kernels {

class HostKernels final : public GradientKernels {
 public:
  HostKernels() = default;
  ~HostKernels() override;
  HostKernels(const HostKernels&) = delete;
  HostKernels& operator=(const HostKernels&) = delete;

  Device where() const override { return Device{}; }
  void* stream() const override { return nullptr; }
  void* allocate(size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void* acquire(size_t bytes) override;
  void release(void* block) override;
  void copy(const std::vector<Copy>& copies) override;
  void toHost(const std::vector<Copy>& copies) override { copy(copies); }
  void narrow(void* dst, const float* src, size_t count, DataType wire, float scale,
              float* residual) override;
  void widen(float* dst, const void* src, size_t count, DataType wire, float scale) override;
  void scale(float* data, size_t count, float k) override;
  bool nonFinite(const void* data, size_t count, DataType dtype) override;
  size_t stagingElements(size_t) const override { return 0; }  // works in place
  void accumulateChunkNorms(SparseBucket& b, float m, float* norms) override;
  size_t topChunksTempBytes(size_t) const override { return 0; }
  void topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, void* temp,
                 size_t tempBytes) override;
  void gatherChunks(float* packed, const SparseBucket& b, const uint32_t* idx, size_t k) override;
  void scatterChunks(SparseBucket& b, const float* packed, const uint32_t* idx, size_t k,
                     bool maskVelocity) override;
  void synchronize() override {}

 private:
  std::mutex mutex_;
  std::vector<void*> owned_;  // allocate()'s memory
};

// The process-wide host kernels (never destroyed; do not allocate() from
// it, that memory would stay until exit).
const std::shared_ptr<GradientKernels>& hostKernels();

}  // namespace gflow::kernels
