// Packing and unpacking fusion buffers: the copies of chunk fusion.
#pragma once

#include <cstdint>
#include <vector>

#include "gflow/types.h"
#include "gradient/bucket_plan.h"

namespace gflow::gradient {

// Copies each tensor of `bucket` to its offset in `buffer`.
void pack(const Bucket& bucket, const std::vector<Tensor>& tensors, void* buffer);
// Copies each tensor's region of `buffer` back into the tensor.
void unpack(const Bucket& bucket, const void* buffer, const std::vector<Tensor>& tensors);

}  // namespace gflow::gradient
