// The sweep's buffers on a GPU (--device cuda in allreduce_bw, and the raw
// NCCL harness): one device, one non-blocking stream, and an input and
// output allocation per size. The host buffers are copied there after each
// fill and back for the check, outside the timed loop. Built without CUDA
// (GFLOW_BENCH_CUDA unset), the constructor throws a clear error.
#pragma once

#include <cstddef>

namespace gflow::bench {

class DeviceBuffers {
 public:
  // This rank's GPU: local rank modulo the GPUs the process sees.
  explicit DeviceBuffers(int localRank);
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  // Allocates `bytes` for the input and, unless in place, for the output.
  void bind(size_t bytes, bool inPlace);
  void upload(const void* in, const void* out, size_t bytes);
  void download(void* out, size_t bytes);
  // Waits for the stream's work (raw libraries enqueue and return).
  void synchronize();

  void* in() const { return in_; }
  void* out() const { return out_; }
  void* stream() const { return stream_; }
  int device() const { return device_; }

 private:
  void release();
  void* in_ = nullptr;
  void* out_ = nullptr;
  void* stream_ = nullptr;  // cudaStream_t
  int device_ = 0;
};

}  // namespace gflow::bench
