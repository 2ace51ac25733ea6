// GradientKernels: the one interface the gradient layer (fusion,
// compression, CSC) and core's compressed allreduce call for their element
// work, so each protocol is written once for host and device memory.
// HostKernels (host_kernels.h) runs the CPU kernels of this layer
// (convert.h, sparse.h) on the calling thread; CudaKernels (cuda_kernels.h)
// enqueues the CUDA component's kernels on one stream. Which one a caller
// gets is decided once, from the tensors' device, when its reducer, batch
// or op is set up (DeviceKernelsPool, device_kernels_pool.h, keeps a
// communicator's).
//
// Every pointer is memory of the implementation's device (where()).
// Operations run in call order: on the host at once, on a GPU in stream
// order, so a caller needs no synchronisation between them; the ones that
// return a value to the host (nonFinite) and synchronize() wait for all
// earlier work. Used from one thread at a time, except acquire()/release(),
// which any thread may call. Failures throw gflow::Error(kInternal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gflow/types.h"

namespace gflow::kernels {

class GradientKernels {
 public:
  virtual ~GradientKernels() = default;

  // The device of the memory these kernels work on, and (GPU) the stream
  // they run on; a Tensor over that memory carries both.
  virtual Device where() const = 0;
  virtual void* stream() const = 0;

  // Memory kept until this object goes, zeroed.
  virtual void* allocate(size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  // Scratch for one job (at least `bytes`), handed back with release().
  virtual void* acquire(size_t bytes) = 0;
  virtual void release(void* block) = 0;

  // One contiguous copy per entry (none overlap), as one batch.
  struct Copy {
    const void* src;
    void* dst;
    size_t bytes;
  };
  virtual void copy(const std::vector<Copy>& copies) = 0;
  // The same into host memory (every dst), waiting until it has arrived:
  // what the host reads of this memory (the residual guard's sample).
  virtual void toHost(const std::vector<Copy>& copies) = 0;

  // float32 <-> wire type (kFloat16, kBFloat16, kQInt8, kQInt4) with a
  // scale: convert.h's contract, bit for bit (a quantized wire's `count` is
  // float32 values; `residual`, error feedback, quantized wires only, may be
  // null).
  virtual void narrow(void* dst, const float* src, size_t count, DataType wire, float scale,
                      float* residual) = 0;
  virtual void widen(float* dst, const void* src, size_t count, DataType wire, float scale) = 0;
  // data[i] *= k (float32, rounded to nearest even like the CPU's multiply):
  // allreduce's prescale/postscale on uncompressed data.
  virtual void scale(float* data, size_t count, float k) = 0;
  // Whether any element is inf or NaN (floating dtypes; false otherwise).
  virtual bool nonFinite(const void* data, size_t count, DataType dtype) = 0;

  // CSC on one bucket: `n` float32 elements in chunks of `chunk` (the last
  // one may be shorter), laid out as the bucket's tensors in order. Each
  // piece is one tensor: its gradient `g`, its residual `v` and velocity `u`
  // (u null without momentum), at bucket element `at`. Where the
  // implementation works on contiguous memory (stagingElements() > 0), the
  // caller gives it g/v/u scratch of n elements each in `staged`, which
  // stays the bucket's from accumulateChunkNorms to scatterChunks.
  struct SparseBucket {
    struct Piece {
      float* g;
      float* v;
      float* u;
      size_t count;
      size_t at;
    };
    std::vector<Piece> pieces;
    size_t n = 0;
    size_t chunk = 1;
    struct {
      float* g = nullptr;
      float* v = nullptr;
      float* u = nullptr;
    } staged;
    // Set by an accumulateChunkNorms that left every gradient zero (the
    // host's): scatterChunks then writes only the picked chunks.
    bool gradientsCleared = false;
  };
  // Elements of each of staged.g/v/u for a bucket of `n` (0: none needed).
  virtual size_t stagingElements(size_t n) const = 0;
  // v += g (no velocity), or u = m u + g and v += u; norms[c] = the L1 norm
  // of chunk c of the new v (float32; on the host a chunk that spans two
  // tensors sums the norms of its two parts). From here until scatterChunks
  // the caller neither reads nor writes the gradients (the host clears them
  // in this pass).
  virtual void accumulateChunkNorms(SparseBucket& b, float m, float* norms) = 0;
  // Scratch bytes topChunks needs for `count` norms.
  virtual size_t topChunksTempBytes(size_t count) const = 0;
  // idx[0..k) = the k chunks with the largest norms, ascending (sparse.h's
  // topChunks: ties to the lower index, NaN the largest).
  virtual void topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, void* temp,
                         size_t tempBytes) = 0;
  // packed[j * chunk ..] = chunk idx[j] of the residual (a short last chunk
  // padded with zeros).
  virtual void gatherChunks(float* packed, const SparseBucket& b, const uint32_t* idx,
                            size_t k) = 0;
  // Each gradient = the packed chunks at their place and zeros elsewhere;
  // the picked chunks of the residual (and, with `maskVelocity`, of the
  // velocity) become zero.
  virtual void scatterChunks(SparseBucket& b, const float* packed, const uint32_t* idx, size_t k,
                             bool maskVelocity) = 0;

  // Waits until everything called so far has run (a no-op on the host).
  virtual void synchronize() = 0;
};

}  // namespace gflow::kernels
