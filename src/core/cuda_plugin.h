// Loading the CUDA component (libgflow_cuda.so, src/kernels/cuda/plugin.h)
// when an op first meets a device tensor, so libgflow itself runs on
// machines without CUDA. Thread-safe; the result is cached for the process.
#pragma once

#include <string>

#include "kernels/cuda/plugin.h"

namespace gflow::cuda {

// The component's table, or nullptr with `why` set: not built
// (GFLOW_WITH_CUDA), cannot be loaded (GFLOW_CUDA_PLUGIN, the directory of
// libgflow, the loader's search path), an ABI mismatch, or no usable GPU
// (the CUDA runtime's reason, e.g. no driver).
const Plugin* load(std::string* why);

// Tests: makes load() return `p` (a software CUDA, tests/testing/soft_cuda)
// instead of the component; nullptr restores the component.
void installPluginForTesting(const Plugin* p);

}  // namespace gflow::cuda
