// Residuals: the reducer's error-feedback storage, a zeroed float32 residual
// per float32 gradient (docs/compression.md), in the gradients' memory:
// host vectors, or device memory of the reducer's CUDA kernels (which owns
// it and outlives the steps).
#pragma once

#include <memory>
#include <vector>

#include "gflow/types.h"
#include "kernels/gradient_kernels.h"

namespace gflow::gradient {

class Residuals {
 public:
  // One per float32 tensor of `tensors` (null for the others); `device`:
  // the kernels whose memory holds them (null: host memory).
  void allocate(const std::vector<Tensor>& tensors, kernels::GradientKernels* device);
  // `from`'s values (the same tensors), copied in by the kernels that own
  // this storage (GradientReducer::rebuild).
  void carryFrom(const Residuals& from, const std::vector<Tensor>& tensors);

  bool empty() const { return pointers_.empty(); }
  // Per tensor (null: none), for the Fuser and the automatic wire.
  std::vector<float*>* pointers() { return &pointers_; }
  const std::vector<float*>& get() const { return pointers_; }

 private:
  std::vector<float*> pointers_;
  std::vector<std::vector<float>> host_;  // their memory (host gradients)
  kernels::GradientKernels* device_ = nullptr;
};

}  // namespace gflow::gradient
