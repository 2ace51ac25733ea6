// The software CUDA (soft_cuda.h) built as a loadable gflow CUDA component,
// libgflow_softcuda.so, for tests of front ends that load the component by
// path (Python's gflow.set_cuda_component, GFLOW_CUDA_PLUGIN): it exports
// the component's entry points over the software tables, and allocation
// helpers that a test reaches through ctypes. Each process that loads it
// gets GFLOW_SOFTCUDA_DEVICES soft GPUs (default 2) and no NCCL (the
// software NCCL only joins ranks that are threads of one process), so
// device tensors are staged. Test code only: never installed.
#include <cstdlib>

#include "testing/soft_cuda.h"

namespace {

const gflow::cuda::Plugin* table() {
  static const gflow::cuda::Plugin* p = [] {
    const char* n = std::getenv("GFLOW_SOFTCUDA_DEVICES");
    gflow::testing::softcuda::install(n && *n ? std::atoi(n) : 2);
    return gflow::testing::softcuda::plugin();
  }();
  return p;
}

}  // namespace

#define GFLOW_SOFTCUDA_EXPORT extern "C" __attribute__((visibility("default")))

GFLOW_SOFTCUDA_EXPORT const gflow::cuda::Runtime* gflow_cuda_runtime() {
  return table();
}

GFLOW_SOFTCUDA_EXPORT const gflow::cuda::Plugin* gflow_cuda_plugin() {
  return table();
}

// `bytes` of soft device memory of `device` (its address; 0 on failure).
GFLOW_SOFTCUDA_EXPORT void* gflow_softcuda_alloc(int device, size_t bytes) {
  table();
  return gflow::testing::softcuda::alloc(device, bytes);
}

// 1 when `p` was soft device memory and is freed.
GFLOW_SOFTCUDA_EXPORT int gflow_softcuda_free(void* p) {
  return gflow::testing::softcuda::free(p) ? 1 : 0;
}

// Soft device memory regions alive now (a test checks gflow freed its own).
GFLOW_SOFTCUDA_EXPORT int gflow_softcuda_alive() {
  return gflow::testing::softcuda::allocationsAlive();
}
