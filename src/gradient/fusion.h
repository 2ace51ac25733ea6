// Packing and unpacking fusion buffers: the copies of chunk fusion, as one
// batch for kernels::GradientKernels::copy (host or device memory alike).
#pragma once

#include <cstdint>
#include <vector>

#include "gflow/types.h"
#include "gradient/bucket_plan.h"
#include "kernels/gradient_kernels.h"

namespace gflow::gradient {

// Each (non-empty) tensor of `bucket` to its offset in `buffer`, and back.
std::vector<kernels::GradientKernels::Copy> packCopies(const Bucket& bucket,
                                                       const std::vector<Tensor>& tensors,
                                                       void* buffer);
std::vector<kernels::GradientKernels::Copy> unpackCopies(const Bucket& bucket, const void* buffer,
                                                         const std::vector<Tensor>& tensors);

// The same on host memory, at once.
void pack(const Bucket& bucket, const std::vector<Tensor>& tensors, void* buffer);
void unpack(const Bucket& bucket, const void* buffer, const std::vector<Tensor>& tensors);

}  // namespace gflow::gradient
