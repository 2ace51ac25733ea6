// CUDA kernels (contract in kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/kernels.h"

namespace gflow::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int blocksFor(size_t n, int perThread = 1) {
  const size_t per = static_cast<size_t>(kThreads) * perThread;
  const size_t b = (n + per - 1) / per;
  return static_cast<int>(b < 1 ? 1 : (b > 65535u * 8 ? 65535u * 8 : b));
}

int lastError() {
  return static_cast<int>(cudaGetLastError());
}

__global__ void copySegments(const CopySegment* segs, size_t n) {
  for (size_t s = blockIdx.y; s < n; s += gridDim.y) {
    const CopySegment seg = segs[s];
    const uintptr_t a = reinterpret_cast<uintptr_t>(seg.src) | reinterpret_cast<uintptr_t>(seg.dst);
    const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
    const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if ((a & 15) == 0) {
      const size_t vecs = seg.bytes / 16;
      const uint4* src = static_cast<const uint4*>(seg.src);
      uint4* dst = static_cast<uint4*>(seg.dst);
      for (size_t i = first; i < vecs; i += stride) dst[i] = src[i];
      const char* s8 = static_cast<const char*>(seg.src);
      char* d8 = static_cast<char*>(seg.dst);
      for (size_t i = vecs * 16 + first; i < seg.bytes; i += stride) d8[i] = s8[i];
    } else {
      const char* s8 = static_cast<const char*>(seg.src);
      char* d8 = static_cast<char*>(seg.dst);
      for (size_t i = first; i < seg.bytes; i += stride) d8[i] = s8[i];
    }
  }
}

__global__ void narrowHalf(__half* dst, const float* src, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(blockDim.x) * gridDim.x) {
    dst[i] = __float2half_rn(__fmul_rn(src[i], scale));
  }
}

__global__ void narrowBf16(__nv_bfloat16* dst, const float* src, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(blockDim.x) * gridDim.x) {
    dst[i] = __float2bfloat16_rn(__fmul_rn(src[i], scale));
  }
}

__global__ void widenHalf(float* dst, const __half* src, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(blockDim.x) * gridDim.x) {
    dst[i] = __fmul_rn(__half2float(src[i]), scale);
  }
}

__global__ void widenBf16(float* dst, const __nv_bfloat16* src, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(blockDim.x) * gridDim.x) {
    dst[i] = __fmul_rn(__bfloat162float(src[i]), scale);
  }
}

// ---- block quantization (the CPU twin: kernels/cpu/block_quant.h) ----------
// One thread per value, one thread block per quantization block. Every step
// is the twin's IEEE operation, rounded the same way (__fmul_rn etc. keep
// nvcc from contracting them into FMAs; rintf rounds to nearest even).

constexpr float kQuantTiny = 7.52316384526264e-37f;  // 2^-120, as the twin

__device__ size_t blockOffset(size_t blk, bool int4) {
  return blk * (4 + (int4 ? kQuantBlock / 2 : kQuantBlock));
}

__device__ void storeScale(unsigned char* p, float s) {
  const uint32_t u = __float_as_uint(s);
  for (int k = 0; k < 4; ++k) p[k] = static_cast<unsigned char>(u >> (8 * k));
}

__device__ float loadScale(const unsigned char* p) {
  uint32_t u = 0;
  for (int k = 0; k < 4; ++k) u |= static_cast<uint32_t>(p[k]) << (8 * k);
  return __uint_as_float(u);
}

// The largest of the block's magnitude bit patterns (inf/NaN sort on top).
__device__ uint32_t blockTop(uint32_t bits) {
  __shared__ uint32_t warpTop[kQuantBlock / 32];
  const uint32_t t = __reduce_max_sync(0xffffffffu, bits);
  if ((threadIdx.x & 31) == 0) warpTop[threadIdx.x >> 5] = t;
  __syncthreads();
  uint32_t top = 0;
  for (int w = 0; w < static_cast<int>(kQuantBlock / 32); ++w) top = max(top, warpTop[w]);
  __syncthreads();  // warpTop is reused by the next block of the loop
  return top;
}

// A quantized wire: its scale, its largest code and whether it is int4.
struct Quantizer {
  float scale;
  float qmax;
  bool int4;
};

__global__ void quantizeBlocks(unsigned char* out, const float* src, size_t count, float* residual,
                               Quantizer z) {
  const float scale = z.scale, qmax = z.qmax;
  const bool int4 = z.int4;
  const size_t blocks = (count + kQuantBlock - 1) / kQuantBlock;
  for (size_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const size_t at = blk * kQuantBlock + threadIdx.x;
    const bool in = at < count;
    float y = in ? __fmul_rn(src[at], scale) : 0.0f;
    if (residual && in) y = __fadd_rn(y, residual[at]);
    const uint32_t top = blockTop(__float_as_uint(y) & 0x7FFFFFFFu);
    const float m = __uint_as_float(top);
    const bool bad = top >= 0x7F800000u;
    float s = 0.0f, q = 0.0f;
    if (bad) {
      s = __uint_as_float(0x7FC00000u);
    } else if (m >= kQuantTiny) {
      s = __fdiv_rn(m, qmax);
      q = rintf(__fmul_rn(y, __fdiv_rn(qmax, m)));
      q = q > qmax ? qmax : (q < -qmax ? -qmax : q);
    }
    unsigned char* p = out + blockOffset(blk, int4);
    if (threadIdx.x == 0) storeScale(p, s);
    const int qi = static_cast<int>(q);
    if (int4) {
      const int next = __shfl_down_sync(0xffffffffu, qi, 1);
      if ((threadIdx.x & 1) == 0) {
        p[4 + threadIdx.x / 2] = static_cast<unsigned char>((qi & 0xF) | ((next & 0xF) << 4));
      }
    } else {
      p[4 + threadIdx.x] = static_cast<unsigned char>(static_cast<int8_t>(qi));
    }
    if (residual && in) residual[at] = bad ? 0.0f : __fsub_rn(y, __fmul_rn(q, s));
  }
}

__global__ void dequantizeBlocks(float* dst, const unsigned char* in, size_t count, float scale,
                                 bool int4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(blockDim.x) * gridDim.x) {
    const size_t blk = i / kQuantBlock, j = i % kQuantBlock;
    const unsigned char* p = in + blockOffset(blk, int4);
    int q;
    if (int4) {
      const int nib = (j & 1) ? p[4 + j / 2] >> 4 : p[4 + j / 2] & 0xF;
      q = nib >= 8 ? nib - 16 : nib;
    } else {
      q = static_cast<int8_t>(p[4 + j]);
    }
    dst[i] = __fmul_rn(__fmul_rn(static_cast<float>(q), loadScale(p)), scale);
  }
}

// A block is inf/NaN when its scale is.
__global__ void nonFiniteBlocks(const unsigned char* data, size_t blocks, bool int4, int* flag) {
  bool bad = false;
  for (size_t b = blockIdx.x * size_t(blockDim.x) + threadIdx.x; b < blocks;
       b += size_t(blockDim.x) * gridDim.x) {
    bad = bad || !isfinite(loadScale(data + blockOffset(b, int4)));
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(flag, 1);
}

unsigned quantGrid(size_t count) {
  const size_t blocks = (count + kQuantBlock - 1) / kQuantBlock;
  return static_cast<unsigned>(blocks < (1u << 30) ? blocks : (1u << 30));
}

__global__ void scaleFloat(float* data, size_t n, float k) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(blockDim.x) * gridDim.x) {
    data[i] = __fmul_rn(data[i], k);
  }
}

template <typename T>
__device__ bool finite(T x) {
  return isfinite(static_cast<float>(x));
}
template <>
__device__ bool finite<double>(double x) {
  return isfinite(x);
}
template <>
__device__ bool finite<__half>(__half x) {
  return isfinite(__half2float(x));
}
template <>
__device__ bool finite<__nv_bfloat16>(__nv_bfloat16 x) {
  return isfinite(__bfloat162float(x));
}

template <typename T>
__global__ void nonFinite(const T* data, size_t n, int* flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(blockDim.x) * gridDim.x) {
    bad = bad || !finite(data[i]);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(flag, 1);
}

// float8: inf or NaN is every code whose bits under `mask` are all ones
// (E5M2: the exponent, 0x7C; E4M3FN, which has no inf: 0x7F, its NaN).
__global__ void nonFiniteFloat8(const uint8_t* data, size_t n, uint8_t mask, int* flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(blockDim.x) * gridDim.x) {
    bad = bad || (data[i] & mask) == mask;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(flag, 1);
}

// One block per chunk: update, then a block reduction of |v|.
__global__ void chunkNorms(ChunkedResidual r, const float* g, float m, float* norms) {
  __shared__ float partial[kThreads];
  float* v = r.v;
  float* u = r.u;
  const size_t n = r.n, chunk = r.chunk;
  const size_t c = blockIdx.x;
  const size_t begin = c * chunk;
  const size_t end = begin + chunk < n ? begin + chunk : n;
  float sum = 0.0f;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float add = g[i];
    if (u) {
      add = __fadd_rn(__fmul_rn(m, u[i]), g[i]);
      u[i] = add;
    }
    const float nv = __fadd_rn(v[i], add);
    v[i] = nv;
    sum += fabsf(nv);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) norms[c] = partial[0];
}

// Sort keys: larger norm -> larger key; NaN the largest of all.
__global__ void normKeys(const float* norms, size_t count, uint32_t* keys, uint32_t* vals) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(blockDim.x) * gridDim.x) {
    const float f = norms[i];
    uint32_t b = __float_as_uint(f);
    if (isnan(f)) {
      b = 0xffffffffu;
    } else {
      b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
      if (b == 0xffffffffu) b = 0xfffffffeu;  // keep NaN strictly above
    }
    keys[i] = b;
    vals[i] = static_cast<uint32_t>(i);
  }
}

__global__ void gather(float* packed, ChunkedResidual r, PickedChunks p) {
  const float* v = r.v;
  const uint32_t* idx = p.idx;
  const size_t chunk = r.chunk, n = r.n;
  const size_t total = p.k * chunk;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(blockDim.x) * gridDim.x) {
    const size_t e = static_cast<size_t>(idx[i / chunk]) * chunk + i % chunk;
    packed[i] = e < n ? v[e] : 0.0f;
  }
}

__global__ void scatter(float* grad, ChunkedResidual r, const float* packed, PickedChunks p) {
  float* v = r.v;
  float* u = r.u;
  const uint32_t* idx = p.idx;
  const size_t chunk = r.chunk, n = r.n;
  const size_t total = p.k * chunk;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(blockDim.x) * gridDim.x) {
    const size_t e = static_cast<size_t>(idx[i / chunk]) * chunk + i % chunk;
    if (e >= n) continue;
    grad[e] = packed[i];
    v[e] = 0.0f;
    if (u) u[e] = 0.0f;
  }
}

size_t align256(size_t b) {
  return (b + 255) & ~size_t(255);
}

}  // namespace

int batchedCopy(const CopySegment* segments, size_t n, void* scratch, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e =
      cudaMemcpyAsync(scratch, segments, n * sizeof(CopySegment), cudaMemcpyHostToDevice, s);
  if (e != cudaSuccess) return static_cast<int>(e);
  uint64_t biggest = 0;
  for (size_t i = 0; i < n; ++i)
    biggest = segments[i].bytes > biggest ? segments[i].bytes : biggest;
  dim3 grid(blocksFor(biggest / 16 + 1), n < 65535 ? static_cast<unsigned>(n) : 65535u);
  copySegments<<<grid, kThreads, 0, s>>>(static_cast<const CopySegment*>(scratch), n);
  return lastError();
}

int narrow(void* dst, const float* src, size_t count, WireFormat format, float* residual,
           void* stream) {
  const DataType wire = format.type;
  const float scale = format.scale;
  if (count == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (wire == DataType::kQInt8 || wire == DataType::kQInt4) {
    const bool int4 = wire == DataType::kQInt4;
    quantizeBlocks<<<quantGrid(count), kQuantBlock, 0, s>>>(
        static_cast<unsigned char*>(dst), src, count, residual,
        Quantizer{scale, int4 ? 7.0f : 127.0f, int4});
    return lastError();
  }
  if (residual) return static_cast<int>(cudaErrorInvalidValue);
  if (wire == DataType::kFloat16) {
    narrowHalf<<<blocksFor(count), kThreads, 0, s>>>(static_cast<__half*>(dst), src, count, scale);
  } else if (wire == DataType::kBFloat16) {
    narrowBf16<<<blocksFor(count), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), src, count,
                                                     scale);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return lastError();
}

int widen(float* dst, const void* src, size_t count, WireFormat format, void* stream) {
  const DataType wire = format.type;
  const float scale = format.scale;
  if (count == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (wire == DataType::kQInt8 || wire == DataType::kQInt4) {
    dequantizeBlocks<<<blocksFor(count), kThreads, 0, s>>>(
        dst, static_cast<const unsigned char*>(src), count, scale, wire == DataType::kQInt4);
    return lastError();
  }
  if (wire == DataType::kFloat16) {
    widenHalf<<<blocksFor(count), kThreads, 0, s>>>(dst, static_cast<const __half*>(src), count,
                                                    scale);
  } else if (wire == DataType::kBFloat16) {
    widenBf16<<<blocksFor(count), kThreads, 0, s>>>(dst, static_cast<const __nv_bfloat16*>(src),
                                                    count, scale);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return lastError();
}

int scale(float* data, size_t count, float k, void* stream) {
  if (count == 0) return 0;
  scaleFloat<<<blocksFor(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(data, count, k);
  return lastError();
}

int flagNonFinite(const void* data, size_t count, DataType dtype, int* flag, void* stream) {
  if (count == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int b = blocksFor(count, 8);
  switch (dtype) {
    case DataType::kFloat32:
      nonFinite<<<b, kThreads, 0, s>>>(static_cast<const float*>(data), count, flag);
      break;
    case DataType::kFloat64:
      nonFinite<<<b, kThreads, 0, s>>>(static_cast<const double*>(data), count, flag);
      break;
    case DataType::kFloat16:
      nonFinite<<<b, kThreads, 0, s>>>(static_cast<const __half*>(data), count, flag);
      break;
    case DataType::kBFloat16:
      nonFinite<<<b, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(data), count, flag);
      break;
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2:
      nonFiniteFloat8<<<b, kThreads, 0, s>>>(static_cast<const uint8_t*>(data), count,
                                             dtype == DataType::kFloat8E5M2 ? 0x7C : 0x7F, flag);
      break;
    // Complex: both parts of every element.
    case DataType::kComplex64:
      return flagNonFinite(data, 2 * count, DataType::kFloat32, flag, stream);
    case DataType::kComplex128:
      return flagNonFinite(data, 2 * count, DataType::kFloat64, flag, stream);
    case DataType::kQInt8:
    case DataType::kQInt4:
      nonFiniteBlocks<<<b, kThreads, 0, s>>>(static_cast<const unsigned char*>(data), count,
                                             dtype == DataType::kQInt4, flag);
      break;
    default: return 0;  // integers and bool are always finite
  }
  return lastError();
}

int accumulateChunkNorms(const ChunkedResidual& r, const float* g, float m, float* norms,
                         void* stream) {
  if (r.n == 0) return 0;
  if (r.chunk == 0) return static_cast<int>(cudaErrorInvalidValue);
  const size_t chunks = (r.n + r.chunk - 1) / r.chunk;
  chunkNorms<<<static_cast<unsigned>(chunks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      r, g, m, norms);
  return lastError();
}

size_t topChunksTempBytes(size_t count) {
  size_t sortBytes = 0, selBytes = 0;
  const int c = static_cast<int>(count);
  cub::DeviceRadixSort::SortPairsDescending(
      nullptr, sortBytes, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), c);
  cub::DeviceRadixSort::SortKeys(nullptr, selBytes, static_cast<uint32_t*>(nullptr),
                                 static_cast<uint32_t*>(nullptr), c);
  return 4 * align256(count * sizeof(uint32_t)) +
         align256(sortBytes > selBytes ? sortBytes : selBytes);
}

int topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, Scratch temp,
              void* stream) {
  const size_t tempBytes = temp.bytes;
  if (k > count) k = count;
  if (k == 0) return 0;
  if (tempBytes < topChunksTempBytes(count) || count > 0x7fffffffu) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  char* t = static_cast<char*>(temp.data);
  const size_t a = align256(count * sizeof(uint32_t));
  uint32_t* keys = reinterpret_cast<uint32_t*>(t);
  uint32_t* keysOut = reinterpret_cast<uint32_t*>(t + a);
  uint32_t* vals = reinterpret_cast<uint32_t*>(t + 2 * a);
  uint32_t* valsOut = reinterpret_cast<uint32_t*>(t + 3 * a);
  void* cubTemp = t + 4 * a;
  size_t cubBytes = tempBytes - 4 * a;
  normKeys<<<blocksFor(count), kThreads, 0, s>>>(norms, count, keys, vals);
  // Radix sort is stable: equal norms keep ascending chunk order.
  cudaError_t e = cub::DeviceRadixSort::SortPairsDescending(
      cubTemp, cubBytes, keys, keysOut, vals, valsOut, static_cast<int>(count), 0, 32, s);
  if (e != cudaSuccess) return static_cast<int>(e);
  // The first k chunk indices, in ascending order.
  cubBytes = tempBytes - 4 * a;
  e = cub::DeviceRadixSort::SortKeys(cubTemp, cubBytes, valsOut, idx, static_cast<int>(k), 0, 32,
                                     s);
  if (e != cudaSuccess) return static_cast<int>(e);
  return lastError();
}

int gatherChunks(float* packed, const ChunkedResidual& r, PickedChunks picked, void* stream) {
  if (picked.k == 0) return 0;
  gather<<<blocksFor(picked.k * r.chunk), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      packed, r, picked);
  return lastError();
}

int scatterChunks(float* grad, const ChunkedResidual& r, const float* packed, PickedChunks picked,
                  void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemsetAsync(grad, 0, r.n * sizeof(float), s);
  if (e != cudaSuccess) return static_cast<int>(e);
  if (picked.k == 0) return 0;
  scatter<<<blocksFor(picked.k * r.chunk), kThreads, 0, s>>>(grad, r, packed, picked);
  return lastError();
}

}  // namespace gflow::kernels::cuda
