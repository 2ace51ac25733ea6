// CPU kernels of kernels/sparse.h (the CUDA twins come with the NCCL backend).
#include "kernels/sparse.h"

#include <algorithm>
#include <cmath>

namespace gflow::kernels {
namespace {

// Sums eight independent lanes (a shape the vectoriser maps onto one
// register), then folds them in a fixed order. `ivdep` (clang:
// `assume_safety`): the callers' arrays never overlap, and without it GCC's
// -O2 cost model, which will not add a run-time overlap check, left the
// lanes scalar (the CSC hook's largest pass over the gradient). Each lane
// still adds its elements in order, so the bits are those of the scalar
// loop.
template <class Update>
float updateAndSum(size_t n, Update update) {
  float acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
#if defined(__clang__)
#pragma clang loop vectorize(assume_safety)
#elif defined(__GNUC__)
#pragma GCC ivdep
#endif
    for (size_t j = 0; j < 8; ++j) acc[j] += std::fabs(update(i + j));
  }
  for (; i < n; ++i) acc[i % 8] += std::fabs(update(i));
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

float accumulateL1(float* v, const float* g, size_t n) {
  return updateAndSum(n, [v, g](size_t i) { return v[i] += g[i]; });
}

float accumulateMomentumL1(float* v, float* u, const float* g, float m, size_t n) {
  return updateAndSum(n, [v, u, g, m](size_t i) {
    u[i] = m * u[i] + g[i];
    return v[i] += u[i];
  });
}

float moveL1(float* v, float* g, size_t n) {
  return updateAndSum(n, [v, g](size_t i) {
    const float r = v[i] += g[i];
    g[i] = 0.0f;
    return r;
  });
}

float moveMomentumL1(float* v, float* u, float* g, float m, size_t n) {
  return updateAndSum(n, [v, u, g, m](size_t i) {
    u[i] = m * u[i] + g[i];
    g[i] = 0.0f;
    return v[i] += u[i];
  });
}

std::vector<size_t> topChunks(const float* norms, size_t count, size_t k) {
  k = std::min(k, count);
  std::vector<size_t> idx(count);
  for (size_t i = 0; i < count; ++i) idx[i] = i;
  // Larger norm first, NaN before everything, then lower index.
  auto before = [norms](size_t a, size_t b) {
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

}  // namespace gflow::kernels
