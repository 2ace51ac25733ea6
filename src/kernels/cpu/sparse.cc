// CPU kernels of kernels/sparse.h (the CUDA twins come with the NCCL backend).
#include "kernels/sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gflow::kernels {

void chunkL1Norms(const float* x, size_t n, size_t chunk, float* norms) {
  const size_t chunks = numChunks(n, chunk);
  for (size_t c = 0; c < chunks; ++c) {
    const float* p = x + c * chunk;
    const size_t len = std::min(chunk, n - c * chunk);
    // Eight independent sums: a shape the vectoriser turns into one register.
    float acc[8] = {};
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
      for (int j = 0; j < 8; ++j) acc[j] += std::fabs(p[i + j]);
    }
    for (; i < len; ++i) acc[i % 8] += std::fabs(p[i]);
    norms[c] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
}

std::vector<uint32_t> topChunks(const float* norms, size_t count, size_t k) {
  k = std::min(k, count);
  std::vector<uint32_t> idx(count);
  for (size_t i = 0; i < count; ++i) idx[i] = static_cast<uint32_t>(i);
  // Larger norm first, NaN before everything, then lower index.
  auto before = [norms](uint32_t a, uint32_t b) {
    const float x = norms[a], y = norms[b];
    const bool nx = std::isnan(x), ny = std::isnan(y);
    if (nx != ny) return nx;
    if (!nx && x != y) return x > y;
    return a < b;
  };
  if (k < count) {
    std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), before);
    idx.resize(k);
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

void gatherChunks(const float* x, size_t n, size_t chunk, const std::vector<uint32_t>& picked,
                  float* out) {
  for (size_t j = 0; j < picked.size(); ++j) {
    const size_t at = static_cast<size_t>(picked[j]) * chunk;
    const size_t len = std::min(chunk, n - at);
    std::memcpy(out + j * chunk, x + at, len * sizeof(float));
    if (len < chunk) std::memset(out + j * chunk + len, 0, (chunk - len) * sizeof(float));
  }
}

void scatterChunks(const float* in, size_t n, size_t chunk, const std::vector<uint32_t>& picked,
                   float* x) {
  for (size_t j = 0; j < picked.size(); ++j) {
    const size_t at = static_cast<size_t>(picked[j]) * chunk;
    std::memcpy(x + at, in + j * chunk, std::min(chunk, n - at) * sizeof(float));
  }
}

}  // namespace gflow::kernels
