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

#include "backend/nccl/nccl_api.h"
#include "kernels/cuda/kernels.h"

namespace gflow::cuda {

constexpr uint32_t kPluginAbi = 2;
// eventQuery's answer while the work before the event is still running
// (cudaErrorNotReady).
constexpr int kNotReady = 600;

struct Plugin {
  uint32_t abi = 0;  // kPluginAbi of the component
  const char* (*errorString)(int err) = nullptr;
  int (*deviceCount)(int* n) = nullptr;
  // The device whose memory `p` is (-1: host memory or unknown to CUDA).
  int (*pointerDevice)(const void* p, int* device) = nullptr;
  // The PCI bus id of `device` ("0000:3b:00.0"), the GPU's identity across
  // processes whatever CUDA_VISIBLE_DEVICES says.
  int (*pciBusId)(int device, char* out, int len) = nullptr;
  int (*getDevice)(int* device) = nullptr;
  int (*setDevice)(int device) = nullptr;
  int (*streamCreate)(void** stream) = nullptr;  // non-blocking, current device
  int (*streamDestroy)(void* stream) = nullptr;
  int (*streamSynchronize)(void* stream) = nullptr;
  int (*eventCreate)(void** event) = nullptr;  // without timing
  int (*eventDestroy)(void* event) = nullptr;
  int (*eventRecord)(void* event, void* stream) = nullptr;
  int (*streamWaitEvent)(void* stream, void* event) = nullptr;
  // 0: the work before the event has finished; kNotReady: not yet.
  int (*eventQuery)(void* event) = nullptr;
  int (*memcpyAsync)(void* dst, const void* src, size_t bytes, void* stream) = nullptr;
  int (*deviceAlloc)(void** p, size_t bytes) = nullptr;  // on the current device
  int (*deviceFree)(void* p) = nullptr;
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

  // NCCL (backend/nccl/nccl_api.h), loaded by the component on first call:
  // nullptr with *why set when the component was built without NCCL
  // (GFLOW_WITH_NCCL) or libnccl.so.2 cannot be loaded. Thread-safe.
  const nccl::Api* (*nccl)(const char** why) = nullptr;
};

}  // namespace gflow::cuda

// Exported by libgflow_cuda.so.
extern "C" const gflow::cuda::Plugin* gflow_cuda_plugin();
