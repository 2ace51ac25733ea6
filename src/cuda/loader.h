// Loading gflow's CUDA component (libgflow_cuda.so, runtime.h) when an op
// first meets a device tensor, so libgflow itself runs on machines without
// CUDA. Thread-safe; the result is cached for the process.
#pragma once

#include <string>

#include "cuda/runtime.h"

namespace gflow::cuda {

// The component's runtime table, or nullptr with `why` set: not built
// (GFLOW_WITH_CUDA), cannot be loaded (GFLOW_CUDA_PLUGIN, the directory of
// libgflow, the loader's search path), an ABI mismatch, or no usable GPU
// (the CUDA runtime's reason, e.g. no driver).
const Runtime* loadRuntime(std::string* why);

// Another table the component exports as extern "C" `name` (a function
// returning it), from the component loadRuntime() opened; nullptr when it
// is not loaded or lacks the symbol. For the kernels layer's table.
void* componentSymbol(const char* name);

// Sets the component's path for this process (gflow::setCudaComponent),
// replacing GFLOW_CUDA_PLUGIN. False, with `why` set, once loadRuntime() or
// componentSymbol() has tried to load it: the load happens once per process.
bool setComponentPath(const std::string& path, std::string* why);

// Tests: makes loadRuntime() return `r` instead of the component; nullptr
// restores the component.
void installRuntimeForTesting(const Runtime* r);

}  // namespace gflow::cuda
