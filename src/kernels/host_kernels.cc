#include "kernels/host_kernels.h"

#include <algorithm>
#include <cstdint>
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
  // Zeroed (the interface promises nothing; zeros cost little here).
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

void HostKernels::narrow(void* dst, const float* src, size_t count, DataType wire, float scale,
                         float* residual) {
  kernels::narrow(dst, src, count, wire, scale, residual);
}

void HostKernels::widen(float* dst, const void* src, size_t count, DataType wire, float scale) {
  kernels::widen(dst, src, count, wire, scale);
}

void HostKernels::scale(float* data, size_t count, float k) {
  for (size_t i = 0; i < count; ++i) data[i] *= k;
}

bool HostKernels::nonFinite(const void* data, size_t count, DataType dtype) {
  return anyNonFinite(data, count, dtype);
}

namespace {

using Piece = GradientKernels::SparseBucket::Piece;

// Calls fn(piece, from, to, at) for the bucket's pieces cut at chunk
// boundaries: elements [from, to) of the piece sit at bucket element `at`.
template <class Fn>
void forEachPart(const GradientKernels::SparseBucket& b, Fn fn) {
  for (const Piece& p : b.pieces) {
    size_t at = p.at;
    for (size_t from = 0; from < p.count;) {
      const size_t to = std::min(p.count, from + (b.chunk - at % b.chunk));
      fn(p, from, to, at);
      at += to - from;
      from = to;
    }
  }
}

// Where chunk c is in the picked list idx[0..k) (ascending), or SIZE_MAX.
size_t slotOf(const uint32_t* idx, size_t k, size_t c) {
  const uint32_t* it = std::lower_bound(idx, idx + k, static_cast<uint32_t>(c));
  return it != idx + k && *it == c ? static_cast<size_t>(it - idx) : SIZE_MAX;
}

}  // namespace

// One pass per part: the residual update fused with the part's L1 norm, and
// the gradient cleared (scatterChunks then writes only the sent chunks).
void HostKernels::accumulateChunkNorms(SparseBucket& b, float m, float* norms) {
  std::fill_n(norms, numChunks(b.n, b.chunk), 0.0f);
  forEachPart(b, [&](const Piece& p, size_t from, size_t to, size_t at) {
    norms[at / b.chunk] += p.u ? moveMomentumL1(p.v + from, p.u + from, p.g + from, m, to - from)
                               : moveL1(p.v + from, p.g + from, to - from);
  });
  b.gradientsCleared = true;
}

void HostKernels::topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, void*,
                            size_t) {
  const std::vector<size_t> picked = kernels::topChunks(norms, count, k);
  for (size_t j = 0; j < picked.size(); ++j) idx[j] = static_cast<uint32_t>(picked[j]);
}

void HostKernels::gatherChunks(float* packed, const SparseBucket& b, const uint32_t* idx,
                               size_t k) {
  std::fill_n(packed, k * b.chunk, 0.0f);
  forEachPart(b, [&](const Piece& p, size_t from, size_t to, size_t at) {
    const size_t slot = slotOf(idx, k, at / b.chunk);
    if (slot == SIZE_MAX) return;
    std::memcpy(packed + slot * b.chunk + at % b.chunk, p.v + from, (to - from) * sizeof(float));
  });
}

void HostKernels::scatterChunks(SparseBucket& b, const float* packed, const uint32_t* idx, size_t k,
                                bool maskVelocity) {
  forEachPart(b, [&](const Piece& p, size_t from, size_t to, size_t at) {
    const size_t len = to - from, slot = slotOf(idx, k, at / b.chunk);
    if (slot == SIZE_MAX) {
      if (!b.gradientsCleared) std::fill_n(p.g + from, len, 0.0f);
      return;
    }
    std::memcpy(p.g + from, packed + slot * b.chunk + at % b.chunk, len * sizeof(float));
    std::fill_n(p.v + from, len, 0.0f);
    if (maskVelocity && p.u) std::fill_n(p.u + from, len, 0.0f);
  });
}

const std::shared_ptr<GradientKernels>& hostKernels() {
  // Leaked on purpose: ops finishing during static destruction still use it.
  static const auto* k = new std::shared_ptr<GradientKernels>(std::make_shared<HostKernels>());
  return *k;
}

}  // namespace gflow::kernels
