#include "gradient/fusion.h"

#include <cstring>

namespace gflow::gradient {

void pack(const Bucket& bucket, const std::vector<Tensor>& tensors, void* buffer) {
  auto* out = static_cast<char*>(buffer);
  for (size_t k = 0; k < bucket.tensors.size(); ++k) {
    const Tensor& t = tensors[bucket.tensors[k]];
    if (t.count > 0) std::memcpy(out + bucket.offsets[k], t.data, t.nbytes());
  }
}

void unpack(const Bucket& bucket, const void* buffer, const std::vector<Tensor>& tensors) {
  const auto* in = static_cast<const char*>(buffer);
  for (size_t k = 0; k < bucket.tensors.size(); ++k) {
    const Tensor& t = tensors[bucket.tensors[k]];
    if (t.count > 0) std::memcpy(t.data, in + bucket.offsets[k], t.nbytes());
  }
}

}  // namespace gflow::gradient
