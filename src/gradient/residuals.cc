#include "gradient/residuals.h"

#include "kernels/host_kernels.h"

namespace gflow::gradient {

void Residuals::allocate(const std::vector<Tensor>& tensors, kernels::GradientKernels* device) {
  device_ = device;
  pointers_.assign(tensors.size(), nullptr);
  host_.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].dtype != DataType::kFloat32) continue;
    if (device_) {
      pointers_[i] = static_cast<float*>(device_->allocate(tensors[i].nbytes()));  // zeroed
    } else {
      host_[i].assign(tensors[i].count, 0.0f);
      pointers_[i] = host_[i].data();
    }
  }
}

void Residuals::carryFrom(const Residuals& from, const std::vector<Tensor>& tensors) {
  std::vector<kernels::GradientKernels::Copy> copies;
  for (size_t i = 0; i < pointers_.size() && i < from.pointers_.size(); ++i) {
    if (pointers_[i] && from.pointers_[i]) {
      copies.push_back({from.pointers_[i], pointers_[i], tensors[i].nbytes()});
    }
  }
  if (copies.empty()) return;
  (device_ ? device_ : kernels::hostKernels().get())->copy(copies);
}

}  // namespace gflow::gradient
