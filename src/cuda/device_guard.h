// Making a CUDA device current on this thread for a scope, gflow's one way
// to do it (CUDA's current device is per thread, and the caller's must
// survive a call into gflow).
#pragma once

#include <utility>

#include "cuda/runtime.h"

namespace gflow::cuda {

class DeviceGuard {
 public:
  // Makes `device` current on this thread unless it already is. Never
  // throws: error() tells whether it worked.
  DeviceGuard(const Runtime& rt, int device);
  // Makes the device that was current before the guard current again, when
  // the guard changed it.
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  // 0, or the CUDA error of reading or setting the current device (then
  // `device` is not known to be current).
  int error() const { return error_; }

 private:
  const Runtime& rt_;
  int before_ = -1;  // the caller's device; -1: unknown
  bool changed_ = false;
  int error_ = 0;
};

// Runs `fn` (returning a CUDA error as int) with `device` current, and
// returns its result, or the error of making `device` current without
// running `fn`.
template <typename F>
int onDevice(const Runtime& rt, int device, F&& fn) {
  DeviceGuard g(rt, device);
  if (g.error()) return g.error();
  return std::forward<F>(fn)();
}

}  // namespace gflow::cuda
