// The CUDA runtime as libgflow sees it: a table of plain C functions filled
// inside gflow's CUDA component, libgflow_cuda.so (runtime.cu), which links
// the CUDA runtime statically. libgflow never links CUDA: it dlopens the
// component on first use (loader.h), so only the GPU driver must be present
// where device tensors are used, and tests install a software CUDA with the
// same table (tests/testing/soft_cuda.h).
//
// Every entry returns a cudaError_t as int (0 = success) unless said
// otherwise; streams and events are cudaStream_t / cudaEvent_t passed as
// void*. The entries are as thread-safe as the CUDA runtime calls they wrap;
// the current device is per thread (DeviceGuard, device_guard.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/nccl_api.h"

namespace gflow::cuda {

// The version of the component's tables (this one and the kernel entries of
// kernels/cuda/plugin.h); the loader refuses a component of another version.
constexpr uint32_t kComponentAbi = 7;
// eventQuery's answer while the work before the event is still running
// (cudaErrorNotReady).
constexpr int kNotReady = 600;

struct Runtime {
  uint32_t abi = 0;  // kComponentAbi of the component
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
  // Blocks until the work before the event has finished (no stream named:
  // the stream it was recorded on may be gone by then).
  int (*eventSynchronize)(void* event) = nullptr;
  int (*memcpyAsync)(void* dst, const void* src, size_t bytes, void* stream) = nullptr;
  int (*deviceAlloc)(void** p, size_t bytes) = nullptr;  // on the current device
  int (*deviceFree)(void* p) = nullptr;
  int (*hostAlloc)(void** p, size_t bytes) = nullptr;  // pinned host memory
  int (*hostFree)(void* p) = nullptr;

  // NCCL (nccl_api.h), loaded by the component on first call (nccl_loader.cu):
  // nullptr with *why set when the component was built without NCCL
  // (GFLOW_WITH_NCCL) or libnccl.so.2 cannot be loaded. Thread-safe.
  const nccl::Api* (*nccl)(const char** why) = nullptr;
};

}  // namespace gflow::cuda

// Exported by libgflow_cuda.so: its runtime table (static, never freed).
extern "C" const gflow::cuda::Runtime* gflow_cuda_runtime();
