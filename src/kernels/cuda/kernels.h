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

// dst[i] = round_to_nearest_even(src[i] * scale) in `wire` (kFloat16 or
// kBFloat16); beyond the wire range -> inf, as the CPU twin. kQInt8 and
// kQInt4: `count` float32 values into blocks, with error feedback through
// `residual` (may be null; quantized wires only), the bits of the CPU twin
// (kernels/convert.h, cpu/block_quant.h).
int narrow(void* dst, const float* src, size_t count, DataType wire, float scale, float* residual,
           void* stream);
// dst[i] = float(src[i]) * scale (quantized wires: `count` values of blocks).
int widen(float* dst, const void* src, size_t count, DataType wire, float scale, void* stream);
// data[i] = data[i] * k (float32, round to nearest even: the CPU's multiply).
int scale(float* data, size_t count, float k, void* stream);
// Sets *flag (device int) to 1 if any element is inf or NaN (floating types;
// the flag is left unchanged otherwise). The caller zeroes it first.
int flagNonFinite(const void* data, size_t count, DataType dtype, int* flag, void* stream);

// CSC residual step over n elements in chunks of `chunk`:
//   u = m * u + g (when u is not null), v += (u or g),
// and norms[c] = sum over chunk c of |v| after the update.
int accumulateChunkNorms(float* v, float* u, const float* g, float m, size_t n, size_t chunk,
                         float* norms, void* stream);

// The k chunks with the largest norms (NaN first, ties to the lower index),
// written to idx[0..k) in ascending order. `temp` is device memory of at
// least topChunksTempBytes(count) bytes.
size_t topChunksTempBytes(size_t count);
int topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, void* temp,
              size_t tempBytes, void* stream);

// packed[j * chunk + t] = v[idx[j] * chunk + t] (zero past the end of v).
int gatherChunks(float* packed, const float* v, const uint32_t* idx, size_t k, size_t chunk,
                 size_t n, void* stream);
// grad = 0 except the picked chunks, which get the reduced values from
// `packed`; the picked chunks of v (and u when not null) are cleared.
int scatterChunks(float* grad, float* v, float* u, const float* packed, const uint32_t* idx,
                  size_t k, size_t chunk, size_t n, void* stream);

}  // namespace gflow::kernels::cuda
