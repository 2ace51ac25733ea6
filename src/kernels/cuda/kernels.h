// CUDA kernels of gflow's own layers on device buffers: fusion pack/unpack,
// float32 <-> float16/bfloat16 conversion with a scale, a float32 scale in
// place and an inf/NaN flag,
// and the CSC steps (residual update with chunk L1 norms, top-chunk
// selection, sparse gather/scatter). Each has a CPU twin (src/kernels/
// convert.h, sparse.h, src/gradient/fusion.h) with the same contract; the
// GPU tests (tests/gpu/) compare them, bit for bit where the arithmetic is the
// same (copies, conversions, selection) and within float32 reassociation
// error for the norms (a GPU sums in a different order).
//
// Compiled by nvcc into libgflow_cuda.so, never into libgflow. Every
// function enqueues on `stream` and returns the cudaError_t of the launch
// (0 = success); device pointers unless said otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gflow/types.h"

namespace gflow::kernels::cuda {

// A conversion's wire type (kFloat16, kBFloat16, kQInt8, kQInt4) and the
// scale applied on the way.
struct WireFormat {
  DataType type;
  float scale;
};

// A CSC bucket on the device: n float32 elements in chunks of `chunk`, its
// residual v and, with momentum, its velocity u (null without).
struct ChunkedResidual {
  float* v;
  float* u;
  size_t n;
  size_t chunk;
};

// The k chunks picked, by index (device memory, ascending).
struct PickedChunks {
  const uint32_t* idx;
  size_t k;
};

// Device scratch memory.
struct Scratch {
  void* data;
  size_t bytes;
};

// One contiguous copy of a batched copy.
struct CopySegment {
  const void* src;
  void* dst;
  uint64_t bytes;
};

// Runs every copy of `segments` (a host array of n entries) in one kernel
// (fusion pack: tensors -> buffer; unpack: buffer -> tensors). `scratch` is
// device memory of at least n * sizeof(CopySegment) bytes the segment table
// is copied into (asynchronously, from `segments`, which must stay valid
// until the stream reaches the copy: pinned memory, or synchronize).
int batchedCopy(const CopySegment* segments, size_t n, void* scratch, void* stream);

// dst[i] = round_to_nearest_even(src[i] * wire.scale) in wire.type
// (kFloat16 or kBFloat16); beyond the wire range -> inf, as the CPU twin.
// kQInt8 and kQInt4: `count` float32 values into blocks, with error
// feedback through `residual` (may be null; quantized wires only), the bits
// of the CPU twin (kernels/convert.h, cpu/block_quant.h).
int narrow(void* dst, const float* src, size_t count, WireFormat wire, float* residual,
           void* stream);
// dst[i] = float(src[i]) * wire.scale (quantized wires: `count` values of
// blocks).
int widen(float* dst, const void* src, size_t count, WireFormat wire, void* stream);
// data[i] = data[i] * k (float32, round to nearest even: the CPU's multiply).
int scale(float* data, size_t count, float k, void* stream);
// Sets *flag (device int) to 1 if any element is inf or NaN (floating types;
// the flag is left unchanged otherwise). The caller zeroes it first.
int flagNonFinite(const void* data, size_t count, DataType dtype, int* flag, void* stream);

// CSC residual step over the bucket `r` with gradient g:
//   u = m * u + g (when r.u is not null), v += (u or g),
// and norms[c] = sum over chunk c of |v| after the update.
int accumulateChunkNorms(const ChunkedResidual& r, const float* g, float m, float* norms,
                         void* stream);

// The k chunks with the largest norms (NaN first, ties to the lower index),
// written to idx[0..k) in ascending order. `temp` holds at least
// topChunksTempBytes(count) bytes.
size_t topChunksTempBytes(size_t count);
int topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, Scratch temp,
              void* stream);

// packed[j * chunk + t] = r.v[idx[j] * chunk + t] (zero past the end of v).
int gatherChunks(float* packed, const ChunkedResidual& r, PickedChunks picked, void* stream);
// grad (r.n elements) = 0 except the picked chunks, which get the reduced
// values from `packed`; the picked chunks of r.v (and r.u when not null)
// are cleared.
int scatterChunks(float* grad, const ChunkedResidual& r, const float* packed, PickedChunks picked,
                  void* stream);

}  // namespace gflow::kernels::cuda
