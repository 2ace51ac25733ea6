#include "common/device_buffers.h"

#include <stdexcept>
#include <string>

#if GFLOW_BENCH_CUDA
#include <cuda_runtime.h>
#endif

namespace gflow::bench {

#if GFLOW_BENCH_CUDA
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
  }
}

cudaStream_t asStream(void* s) {
  return static_cast<cudaStream_t>(s);
}

}  // namespace

DeviceBuffers::DeviceBuffers(int localRank) {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    throw std::runtime_error(std::string("--device cuda: no usable GPU (") +
                             (e != cudaSuccess ? cudaGetErrorString(e) : "none found") + ")");
  }
  device_ = localRank % n;
  check(cudaSetDevice(device_), "cudaSetDevice");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
}

DeviceBuffers::~DeviceBuffers() {
  release();
  cudaStreamDestroy(asStream(stream_));
}

void DeviceBuffers::bind(size_t bytes, bool inPlace) {
  release();
  check(cudaMalloc(&in_, bytes ? bytes : 1), "cudaMalloc");
  out_ = in_;
  if (!inPlace) check(cudaMalloc(&out_, bytes ? bytes : 1), "cudaMalloc");
}

// On the buffers' own stream, then waited for: the op runs on that stream
// (a non-blocking one), which is not ordered after the legacy default
// stream, and cudaMemcpy from pageable memory can return before its DMA
// has reached the device.
void DeviceBuffers::upload(const void* in, const void* out, size_t bytes) {
  cudaStream_t s = asStream(stream_);
  check(cudaMemcpyAsync(in_, in, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
  if (out_ != in_) {
    check(cudaMemcpyAsync(out_, out, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
  }
  synchronize();
}

void DeviceBuffers::download(void* out, size_t bytes) {
  check(cudaMemcpyAsync(out, out_, bytes, cudaMemcpyDeviceToHost, asStream(stream_)),
        "cudaMemcpyAsync");
  synchronize();
}

void DeviceBuffers::synchronize() {
  check(cudaStreamSynchronize(asStream(stream_)), "cudaStreamSynchronize");
}

void DeviceBuffers::release() {
  if (out_ && out_ != in_) cudaFree(out_);
  if (in_) cudaFree(in_);
  in_ = out_ = nullptr;
}

#else

DeviceBuffers::DeviceBuffers(int) {
  throw std::runtime_error("--device cuda: this program was built without CUDA (GFLOW_WITH_CUDA)");
}
DeviceBuffers::~DeviceBuffers() = default;
void DeviceBuffers::bind(size_t, bool) {}
void DeviceBuffers::upload(const void*, const void*, size_t) {}
void DeviceBuffers::download(void*, size_t) {}
void DeviceBuffers::synchronize() {}
void DeviceBuffers::release() {}

#endif

}  // namespace gflow::bench
