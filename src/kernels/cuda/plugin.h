// gflow's CUDA component (libgflow_cuda.so) as the layers above kernels see
// it: the runtime table (cuda/runtime.h) extended by the kernel entries
// (kernels.h), so one reference reaches both (`plugin.streamSynchronize`,
// `plugin.narrow`). The component fills it in plugin.cu and exports it as
// gflow_cuda_plugin(); load() below finds it in the component the CUDA
// layer's loader (cuda/loader.h) opened. Kernel entries return a cudaError_t
// as int (0 = success), like the runtime's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/runtime.h"
#include "kernels/cuda/kernels.h"

namespace gflow::cuda {

struct Plugin : Runtime {
  decltype(&kernels::cuda::batchedCopy) batchedCopy = nullptr;
  decltype(&kernels::cuda::narrow) narrow = nullptr;
  decltype(&kernels::cuda::widen) widen = nullptr;
  decltype(&kernels::cuda::scale) scale = nullptr;
  decltype(&kernels::cuda::flagNonFinite) flagNonFinite = nullptr;
  decltype(&kernels::cuda::accumulateChunkNorms) accumulateChunkNorms = nullptr;
  decltype(&kernels::cuda::topChunksTempBytes) topChunksTempBytes = nullptr;
  decltype(&kernels::cuda::topChunks) topChunks = nullptr;
  decltype(&kernels::cuda::gatherChunks) gatherChunks = nullptr;
  decltype(&kernels::cuda::scatterChunks) scatterChunks = nullptr;
};

// The component's table, or nullptr with `why` set for every reason
// cuda::loadRuntime gives (not built, cannot be loaded, another version, no
// usable GPU) and for a component without the kernel table. Thread-safe;
// the result is cached for the process.
const Plugin* load(std::string* why);

// Tests: makes load() return `p` (a software CUDA, tests/testing/soft_cuda)
// and cuda::loadRuntime() its runtime part instead of the component;
// nullptr restores the component.
void installPluginForTesting(const Plugin* p);

}  // namespace gflow::cuda

// Exported by libgflow_cuda.so: the runtime table with the kernel entries
// (static, never freed).
extern "C" const gflow::cuda::Plugin* gflow_cuda_plugin();
