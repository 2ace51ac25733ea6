#include "kernels/host_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/convert.h"
#include "kernels/sparse.h"

namespace gflow::kernels {

HostKernels::~HostKernels() {
  for (void* p : owned_) std::free(p);
}

void* HostKernels::allocate(size_t bytes) {
  void* p = std::calloc(std::max<size_t>(bytes, 1), 1);
  if (!p) throw std::bad_alloc();
  std::lock_guard<std::mutex> lock(mutex_);
  owned_.push_back(p);
  return p;
}

void HostKernels::zero(void* p, size_t bytes) {
  if (bytes > 0) std::memset(p, 0, bytes);
}

void* HostKernels::acquire(size_t bytes) {
  // Zeroed, as the vectors the host path allocated per job were.
  void* p = std::calloc(std::max<size_t>(bytes, 1), 1);
  if (!p) throw std::bad_alloc();
  return p;
}

void HostKernels::release(void* block) {
  std::free(block);
}

void HostKernels::copy(const std::vector<Copy>& copies) {
  for (const Copy& c : copies) {
    if (c.bytes > 0) std::memcpy(c.dst, c.src, c.bytes);
  }
}

void HostKernels::narrow(void* dst, const float* src, size_t count, DataType wire, float scale) {
  kernels::narrow(dst, src, count, wire, scale);
}

void HostKernels::widen(float* dst, const void* src, size_t count, DataType wire, float scale) {
  kernels::widen(dst, src, count, wire, scale);
}

bool HostKernels::nonFinite(const void* data, size_t count, DataType dtype) {
  return anyNonFinite(data, count, dtype);
}

void HostKernels::accumulateChunkNorms(float* v, float* u, const float* g, float m, size_t n,
                                       size_t chunk, float* norms) {
  for (size_t c = 0, at = 0; at < n; ++c, at += chunk) {
    const size_t len = std::min(chunk, n - at);
    norms[c] = u ? accumulateMomentumL1(v + at, u + at, g + at, m, len)
                 : accumulateL1(v + at, g + at, len);
  }
}

void HostKernels::topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, void*,
                            size_t) {
  const std::vector<size_t> picked = kernels::topChunks(norms, count, k);
  for (size_t j = 0; j < picked.size(); ++j) idx[j] = static_cast<uint32_t>(picked[j]);
}

void HostKernels::gatherChunks(float* packed, const float* v, const uint32_t* idx, size_t k,
                               size_t chunk, size_t n) {
  for (size_t j = 0; j < k; ++j) {
    const size_t at = static_cast<size_t>(idx[j]) * chunk, len = std::min(chunk, n - at);
    std::memcpy(packed + j * chunk, v + at, len * sizeof(float));
    std::fill(packed + j * chunk + len, packed + (j + 1) * chunk, 0.0f);
  }
}

void HostKernels::scatterChunks(float* grad, float* v, float* u, const float* packed,
                                const uint32_t* idx, size_t k, size_t chunk, size_t n) {
  std::fill_n(grad, n, 0.0f);
  for (size_t j = 0; j < k; ++j) {
    const size_t at = static_cast<size_t>(idx[j]) * chunk, len = std::min(chunk, n - at);
    std::memcpy(grad + at, packed + j * chunk, len * sizeof(float));
    std::fill_n(v + at, len, 0.0f);
    if (u) std::fill_n(u + at, len, 0.0f);
  }
}

const std::shared_ptr<GradientKernels>& hostKernels() {
  // Leaked on purpose: ops finishing during static destruction still use it.
  static const auto* k = new std::shared_ptr<GradientKernels>(std::make_shared<HostKernels>());
  return *k;
}

}  // namespace gflow::kernels
