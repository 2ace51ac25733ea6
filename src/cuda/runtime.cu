// libgflow_cuda.so's runtime table (runtime.h) over the CUDA runtime.
#include <cuda_runtime.h>

#include "cuda/runtime.h"

namespace gflow::cuda {

// nccl_loader.cu (built with NCCL or its fallback without).
const nccl::Api* loadNccl(const char** why);

namespace {

const char* errorString(int err) {
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}
int deviceCount(int* n) {
  return static_cast<int>(cudaGetDeviceCount(n));
}
int pointerDevice(const void* p, int* device) {
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it: an unknown pointer is an answer, not a failure
    *device = -1;
    return 0;
  }
  *device = (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) ? a.device : -1;
  return 0;
}
int pciBusId(int device, char* out, int len) {
  return static_cast<int>(cudaDeviceGetPCIBusId(out, len, device));
}
int getDevice(int* d) {
  return static_cast<int>(cudaGetDevice(d));
}
int setDevice(int d) {
  return static_cast<int>(cudaSetDevice(d));
}
int streamCreate(void** s) {
  cudaStream_t st = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  *s = st;
  return static_cast<int>(e);
}
int streamDestroy(void* s) {
  return static_cast<int>(cudaStreamDestroy(static_cast<cudaStream_t>(s)));
}
int streamSynchronize(void* s) {
  return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
}
int eventCreate(void** ev) {
  cudaEvent_t e = nullptr;
  cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  *ev = e;
  return static_cast<int>(r);
}
int eventDestroy(void* ev) {
  return static_cast<int>(cudaEventDestroy(static_cast<cudaEvent_t>(ev)));
}
int eventRecord(void* ev, void* s) {
  return static_cast<int>(
      cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(s)));
}
int streamWaitEvent(void* s, void* ev) {
  return static_cast<int>(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(ev), 0));
}
int eventQuery(void* ev) {
  return static_cast<int>(cudaEventQuery(static_cast<cudaEvent_t>(ev)));
}
int eventSynchronize(void* ev) {
  return static_cast<int>(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)));
}
int memcpyAsync(void* dst, const void* src, size_t bytes, void* s) {
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(s)));
}
int deviceAlloc(void** p, size_t bytes) {
  return static_cast<int>(cudaMalloc(p, bytes));
}
int deviceFree(void* p) {
  return static_cast<int>(cudaFree(p));
}
int hostAlloc(void** p, size_t bytes) {
  return static_cast<int>(cudaHostAlloc(p, bytes, cudaHostAllocPortable));
}
int hostFree(void* p) {
  return static_cast<int>(cudaFreeHost(p));
}

Runtime makeTable() {
  Runtime t;
  t.abi = kComponentAbi;
  t.errorString = errorString;
  t.deviceCount = deviceCount;
  t.pointerDevice = pointerDevice;
  t.pciBusId = pciBusId;
  t.getDevice = getDevice;
  t.setDevice = setDevice;
  t.streamCreate = streamCreate;
  t.streamDestroy = streamDestroy;
  t.streamSynchronize = streamSynchronize;
  t.eventCreate = eventCreate;
  t.eventDestroy = eventDestroy;
  t.eventRecord = eventRecord;
  t.streamWaitEvent = streamWaitEvent;
  t.eventQuery = eventQuery;
  t.eventSynchronize = eventSynchronize;
  t.memcpyAsync = memcpyAsync;
  t.deviceAlloc = deviceAlloc;
  t.deviceFree = deviceFree;
  t.hostAlloc = hostAlloc;
  t.hostFree = hostFree;
  t.nccl = loadNccl;
  return t;
}

}  // namespace
}  // namespace gflow::cuda

extern "C" __attribute__((visibility("default"))) const gflow::cuda::Runtime* gflow_cuda_runtime() {
  static const gflow::cuda::Runtime table = gflow::cuda::makeTable();
  return &table;
}
