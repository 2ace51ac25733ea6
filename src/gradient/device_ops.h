// The gradient layer on CUDA tensors: device memory and the CUDA kernels of
// fusion (pack/unpack), compression (narrow/widen, the inf/NaN flag) and
// CSC (kernels/cuda/kernels.h), enqueued on the gradients' stream through
// gflow's CUDA component. The fuser and CSC call these where they call the
// CPU kernels for host tensors; the collective between them runs on the
// same stream (NCCL) or waits for it (staging), so the order on the GPU is
// pack -> collective -> unpack without host round trips in between.
//
// Used from the communicator's executing thread (the ops' before/after
// steps) and, for setup, from the reducer's constructor. Every CUDA failure
// throws gflow::Error(kInternal) naming what failed.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gflow/types.h"
#include "gradient/bucket_plan.h"
#include "kernels/cuda/plugin.h"

namespace gflow::gradient {

class DeviceOps {
 public:
  // For gradients on `device` produced on `stream` (cudaStream_t); `maxTensors`
  // bounds the tensors of one bucket (the segment table of a copy).
  DeviceOps(const cuda::Plugin& plugin, int device, void* stream, size_t maxTensors);
  ~DeviceOps();
  DeviceOps(const DeviceOps&) = delete;
  DeviceOps& operator=(const DeviceOps&) = delete;

  int device() const { return device_; }
  void* stream() const { return stream_; }
  Device where() const { return Device{DeviceType::kCUDA, device_}; }

  // Device memory kept until this object goes (zeroed).
  void* allocate(size_t bytes);
  // Zeroes device memory (waits for the stream).
  void zero(void* p, size_t bytes);
  // Scratch for one job: reused blocks, handed back with release(). Any
  // thread.
  void* acquire(size_t bytes);
  void release(void* block);

  // One contiguous copy per entry, in one kernel.
  struct Copy {
    const void* src;
    void* dst;
    size_t bytes;
  };
  void copy(const std::vector<Copy>& copies);
  // Fusion: each tensor of `b` to / from its offset in `region`.
  void pack(const Bucket& b, const std::vector<Tensor>& tensors, void* region);
  void unpack(const Bucket& b, const void* region, const std::vector<Tensor>& tensors);
  // float32 <-> wire type with a scale (kernels/convert.h's contract).
  void narrow(void* dst, const float* src, size_t count, DataType wire, float scale);
  void widen(float* dst, const void* src, size_t count, DataType wire, float scale);
  // Whether any element is inf or NaN (waits for the stream).
  bool nonFinite(const void* data, size_t count, DataType dtype);

  // CSC steps (kernels/cuda/kernels.h).
  void accumulateChunkNorms(float* v, float* u, const float* g, float m, size_t n, size_t chunk,
                            float* norms);
  size_t topChunksTempBytes(size_t count) const;
  void topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, void* temp,
                 size_t tempBytes);
  void gatherChunks(float* packed, const float* v, const uint32_t* idx, size_t k, size_t chunk,
                    size_t n);
  void scatterChunks(float* grad, float* v, float* u, const float* packed, const uint32_t* idx,
                     size_t k, size_t chunk, size_t n);

  // Waits until the stream has run everything enqueued so far.
  void synchronize();

 private:
  void check(int err, const char* what) const;

  const cuda::Plugin& p_;
  int device_;
  void* stream_;
  size_t maxSegments_;
  void* segmentsHost_ = nullptr;    // pinned table of the last copy
  void* segmentsDevice_ = nullptr;  // its device copy
  int* flagDevice_ = nullptr;
  int* flagHost_ = nullptr;  // pinned
  std::vector<void*> owned_;
  struct Block {
    void* p;
    size_t bytes;
    bool busy;
  };
  std::mutex blocksMutex_;
  std::vector<Block> blocks_;
};

// The GPU all `tensors` live on, or -1 when they are all cpu tensors. Sets
// `why` (and returns -2) when they mix devices or streams, or a pointer is
// not memory of the GPU its tensor names.
int commonDevice(const cuda::Plugin* plugin, const std::vector<Tensor>& tensors,
                 const std::vector<std::string>& names, std::string* why);

}  // namespace gflow::gradient
