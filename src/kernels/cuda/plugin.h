// The interface between libgflow and its CUDA component, libgflow_cuda.so.
//
// libgflow never links the CUDA runtime: when an op first meets a device
// tensor it dlopens the component (src/core/cuda_plugin.cc) and calls its one
// exported C function, gflow_cuda_plugin(), for this table. The component
// links the CUDA runtime statically, so only the GPU driver must be present
// where device tensors are used. Every entry returns a cudaError_t as int
// (0 = success) unless said otherwise; streams and events are cudaStream_t /
// cudaEvent_t passed as void*.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace gflow::cuda {

constexpr uint32_t kPluginAbi = 1;

struct Plugin {
  uint32_t abi = 0;  // kPluginAbi of the component
  const char* (*errorString)(int err) = nullptr;
  int (*deviceCount)(int* n) = nullptr;
  // The device whose memory `p` is (-1: host memory or unknown to CUDA).
  int (*pointerDevice)(const void* p, int* device) = nullptr;
  int (*getDevice)(int* device) = nullptr;
  int (*setDevice)(int device) = nullptr;
  int (*streamCreate)(void** stream) = nullptr;  // non-blocking, current device
  int (*streamDestroy)(void* stream) = nullptr;
  int (*streamSynchronize)(void* stream) = nullptr;
  int (*eventCreate)(void** event) = nullptr;  // without timing
  int (*eventDestroy)(void* event) = nullptr;
  int (*eventRecord)(void* event, void* stream) = nullptr;
  int (*streamWaitEvent)(void* stream, void* event) = nullptr;
  int (*memcpyAsync)(void* dst, const void* src, size_t bytes, void* stream) = nullptr;
  int (*hostAlloc)(void** p, size_t bytes) = nullptr;  // pinned host memory
  int (*hostFree)(void* p) = nullptr;

  // Kernels (kernels/cuda/kernels.h).
  decltype(&kernels::cuda::batchedCopy) batchedCopy = nullptr;
  decltype(&kernels::cuda::narrow) narrow = nullptr;
  decltype(&kernels::cuda::widen) widen = nullptr;
  decltype(&kernels::cuda::flagNonFinite) flagNonFinite = nullptr;
  decltype(&kernels::cuda::accumulateChunkNorms) accumulateChunkNorms = nullptr;
  decltype(&kernels::cuda::topChunksTempBytes) topChunksTempBytes = nullptr;
  decltype(&kernels::cuda::topChunks) topChunks = nullptr;
  decltype(&kernels::cuda::gatherChunks) gatherChunks = nullptr;
  decltype(&kernels::cuda::scatterChunks) scatterChunks = nullptr;
};

}  // namespace gflow::cuda

// Exported by libgflow_cuda.so.
extern "C" const gflow::cuda::Plugin* gflow_cuda_plugin();
