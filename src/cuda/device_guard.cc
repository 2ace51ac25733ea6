#include "cuda/device_guard.h"

namespace gflow::cuda {

DeviceGuard::DeviceGuard(const Runtime& rt, int device) : rt_(rt) {
  if ((error_ = rt_.getDevice(&before_)) != 0) before_ = -1;
  if (before_ == device) return;
  // Even when the current device is unknown: what matters is that `device`
  // is current for the scope.
  const int e = rt_.setDevice(device);
  if (!error_) error_ = e;
  changed_ = e == 0 && before_ >= 0;
}

DeviceGuard::~DeviceGuard() {
  if (changed_) rt_.setDevice(before_);
}

}  // namespace gflow::cuda
