// Kernels of coarse-grained sparse communication (CSC): the residual update
// fused with the L1 norm of the result, and the top chunks by norm. A chunk
// is `chunk` consecutive elements of a bucket; the last one may be shorter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gflow::kernels {

inline size_t numChunks(size_t n, size_t chunk) {
  return (n + chunk - 1) / chunk;
}

// v[i] += g[i]; returns the sum of |v[i]| after the update (float32, eight
// partial sums): error feedback and a chunk norm in one pass. The arrays
// must not overlap.
float accumulateL1(float* v, const float* g, size_t n);
// Momentum correction (Deep Gradient Compression): u[i] = m * u[i] + g[i],
// v[i] += u[i]; returns the sum of |v[i]|.
float accumulateMomentumL1(float* v, float* u, const float* g, float m, size_t n);
// The same, and g[i] = 0 in the same pass: the gradient moves into the
// residual while its cache lines are at hand, so writing the unsent chunks'
// zeros later costs no second pass over it. Same bits in v (and u).
float moveL1(float* v, float* g, size_t n);
float moveMomentumL1(float* v, float* u, float* g, float m, size_t n);

// The `k` chunks with the largest norms, ties to the lower index, returned
// in ascending order. Deterministic: the same norms give the same chunks. A
// NaN norm counts as the largest (a diverging chunk is sent, not hidden).
std::vector<size_t> topChunks(const float* norms, size_t count, size_t k);

}  // namespace gflow::kernels
