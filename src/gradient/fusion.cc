#include "gradient/fusion.h"

#include "kernels/host_kernels.h"

namespace gflow::gradient {

using Copy = kernels::GradientKernels::Copy;

std::vector<Copy> packCopies(const Bucket& bucket, const std::vector<Tensor>& tensors,
                             void* buffer) {
  std::vector<Copy> copies;
  auto* out = static_cast<char*>(buffer);
  for (size_t k = 0; k < bucket.tensors.size(); ++k) {
    const Tensor& t = tensors[bucket.tensors[k]];
    if (t.count > 0) copies.push_back({t.data, out + bucket.offsets[k], t.nbytes()});
  }
  return copies;
}

std::vector<Copy> unpackCopies(const Bucket& bucket, const void* buffer,
                               const std::vector<Tensor>& tensors) {
  std::vector<Copy> copies;
  const auto* in = static_cast<const char*>(buffer);
  for (size_t k = 0; k < bucket.tensors.size(); ++k) {
    const Tensor& t = tensors[bucket.tensors[k]];
    if (t.count > 0) copies.push_back({in + bucket.offsets[k], t.data, t.nbytes()});
  }
  return copies;
}

void pack(const Bucket& bucket, const std::vector<Tensor>& tensors, void* buffer) {
  kernels::hostKernels()->copy(packCopies(bucket, tensors, buffer));
}

void unpack(const Bucket& bucket, const void* buffer, const std::vector<Tensor>& tensors) {
  kernels::hostKernels()->copy(unpackCopies(bucket, buffer, tensors));
}

}  // namespace gflow::gradient
