// Kernels of coarse-grained sparse communication (CSC): per-chunk L1 norms,
// the top chunks by norm, and moving whole chunks between a dense vector and
// a packed one. A chunk is `chunk` consecutive elements; the last one of a
// vector may be shorter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gflow::kernels {

inline size_t numChunks(size_t n, size_t chunk) {
  return (n + chunk - 1) / chunk;
}

// norms[c] = sum of |x[i]| over chunk c (float32, eight partial sums).
void chunkL1Norms(const float* x, size_t n, size_t chunk, float* norms);

// The `k` chunks with the largest norms, ties to the lower index, returned
// in ascending order. Deterministic: the same norms give the same chunks. A
// NaN norm counts as the largest (a diverging chunk is sent, not hidden).
std::vector<uint32_t> topChunks(const float* norms, size_t count, size_t k);

// out[j*chunk ..] = chunk picked[j] of x, zero-padded to `chunk` elements.
void gatherChunks(const float* x, size_t n, size_t chunk, const std::vector<uint32_t>& picked,
                  float* out);
// The inverse: chunk picked[j] of x = in[j*chunk ..] (padding dropped).
void scatterChunks(const float* in, size_t n, size_t chunk, const std::vector<uint32_t>& picked,
                   float* x);

}  // namespace gflow::kernels
