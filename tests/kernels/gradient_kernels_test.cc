// kernels::GradientKernels: the host implementation against independent
// references (float64 sums, exact rounding rules, plain loops), and the
// CUDA implementation (on the software GPU of tests/testing/soft_cuda) bit
// for bit against the host one on the same inputs, operation by operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "kernels/host_kernels.h"
#include "kernels/sparse.h"
#include "testing/soft_cuda.h"

namespace gflow {
namespace {

namespace softcuda = testing::softcuda;
using kernels::GradientKernels;

std::vector<float> randomFloats(size_t n, uint32_t seed, float lo = -4.0f, float hi = 4.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Small integers: every float32 sum of them is exact in any order.
std::vector<float> integerFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 17) - 8);
  return v;
}

uint16_t bitsOf(float f, DataType wire) {
  uint16_t out = 0;
  kernels::hostKernels()->narrow(&out, &f, 1, wire, 1.0f, nullptr);
  return out;
}

float widened(uint16_t w, DataType wire) {
  float out = 0;
  kernels::hostKernels()->widen(&out, &w, 1, wire, 1.0f);
  return out;
}

TEST(HostKernels, NarrowRoundsToNearestEvenAndWidenIsExact) {
  // float16: 10 mantissa bits (ulp 2^-10 at 1); bfloat16: 7 (ulp 2^-7).
  struct Case {
    DataType wire;
    double in, want;
  };
  const double h = std::ldexp(1.0, -11), b = std::ldexp(1.0, -8);
  const Case cases[] = {
      {DataType::kFloat16, 1.0 + h, 1.0},                // tie -> even
      {DataType::kFloat16, 1.0 + 3 * h, 1.0 + 4 * h},    // tie -> even
      {DataType::kFloat16, 1.0 + 1.5 * h, 1.0 + 2 * h},  // nearest
      {DataType::kFloat16, -2.5, -2.5},                  // representable
      {DataType::kFloat16, 65504.0, 65504.0},            // largest
      {DataType::kFloat16, 1e6, std::numeric_limits<double>::infinity()},
      {DataType::kBFloat16, 1.0 + b, 1.0},
      {DataType::kBFloat16, 1.0 + 3 * b, 1.0 + 4 * b},
      {DataType::kBFloat16, -(1.0 + 1.5 * b), -(1.0 + 2 * b)},
  };
  for (const Case& c : cases) {
    const float got = widened(bitsOf(static_cast<float>(c.in), c.wire), c.wire);
    if (std::isinf(c.want)) {
      EXPECT_TRUE(std::isinf(got)) << c.in;
    } else {
      EXPECT_EQ(static_cast<double>(got), c.want) << c.in << " on " << toString(c.wire);
    }
  }
  // The scales: narrow multiplies first, widen after (exact here).
  const std::vector<float> x = {0.5f, -1.25f, 3.0f};
  std::vector<uint16_t> w(3);
  std::vector<float> back(3);
  kernels::hostKernels()->narrow(w.data(), x.data(), 3, DataType::kFloat16, 4.0f, nullptr);
  kernels::hostKernels()->widen(back.data(), w.data(), 3, DataType::kFloat16, 0.5f);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(back[i], x[i] * 2.0f);
}

TEST(HostKernels, ScaleIsTheCorrectlyRoundedProduct) {
  auto x = randomFloats(1000, 11, -3e38f, 3e38f);
  x[3] = std::numeric_limits<float>::denorm_min();
  x[4] = -0.0f;
  for (float k : {0.25f, 1.0f / 3.0f, 7.5f, -1e-30f}) {
    std::vector<float> y = x;
    kernels::hostKernels()->scale(y.data(), y.size(), k);
    for (size_t i = 0; i < x.size(); ++i) {
      // The float64 product of two floats is exact: one rounding to float32.
      const float want = static_cast<float>(static_cast<double>(x[i]) * k);
      ASSERT_EQ(std::memcmp(&y[i], &want, sizeof(float)), 0) << x[i] << " * " << k;
    }
  }
}

TEST(HostKernels, NonFiniteFindsInfAndNanOfFloatingTypesOnly) {
  auto& k = *kernels::hostKernels();
  std::vector<float> f(100, 1.0f);
  EXPECT_FALSE(k.nonFinite(f.data(), f.size(), DataType::kFloat32));
  f[77] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(k.nonFinite(f.data(), f.size(), DataType::kFloat32));
  f[77] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(k.nonFinite(f.data(), f.size(), DataType::kFloat32));
  std::vector<uint16_t> half(50, 0x3c00);  // 1.0
  EXPECT_FALSE(k.nonFinite(half.data(), half.size(), DataType::kFloat16));
  half[49] = 0x7c00;  // +inf
  EXPECT_TRUE(k.nonFinite(half.data(), half.size(), DataType::kFloat16));
  std::vector<uint16_t> bf(50, 0x3f80);  // 1.0
  EXPECT_FALSE(k.nonFinite(bf.data(), bf.size(), DataType::kBFloat16));
  bf[3] = 0x7fc0;  // NaN
  EXPECT_TRUE(k.nonFinite(bf.data(), bf.size(), DataType::kBFloat16));
  const std::vector<int32_t> ints(10, 0x7f800000);  // the bits of inf, as ints
  EXPECT_FALSE(k.nonFinite(ints.data(), ints.size(), DataType::kInt32));
}

// A sparse bucket over `sizes` consecutive tensors of g / v / u (u may be
// null), at consecutive bucket positions.
GradientKernels::SparseBucket bucketOver(const std::vector<size_t>& sizes, float* g, float* v,
                                         float* u, size_t chunk) {
  GradientKernels::SparseBucket b;
  b.chunk = chunk;
  for (size_t s : sizes) {
    b.pieces.push_back({g + b.n, v + b.n, u ? u + b.n : nullptr, s, b.n});
    b.n += s;
  }
  return b;
}

TEST(HostKernels, ChunkNormsMatchAFloat64Reference) {
  // Tensors of 300, 0, 45 and 655 elements: chunks of 64 span tensors.
  const std::vector<size_t> sizes = {300, 0, 45, 655};
  const size_t n = 1000, chunk = 64;
  const float m = 0.5f;  // exact products of the integer data
  for (bool momentum : {false, true}) {
    auto g = integerFloats(n, 1), v = integerFloats(n, 2), u = integerFloats(n, 3);
    std::vector<double> rv(v.begin(), v.end()), ru(u.begin(), u.end());
    std::vector<float> norms(kernels::numChunks(n, chunk), -1.0f);
    auto b = bucketOver(sizes, g.data(), v.data(), momentum ? u.data() : nullptr, chunk);
    const auto g0 = g;  // the pass moves the gradient into the residual
    kernels::hostKernels()->accumulateChunkNorms(b, m, norms.data());
    EXPECT_EQ(g, std::vector<float>(n, 0.0f));
    g = g0;
    for (size_t c = 0; c < norms.size(); ++c) {
      double want = 0;
      for (size_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) {
        if (momentum) ru[i] = m * ru[i] + g[i];
        rv[i] += momentum ? ru[i] : g[i];
        want += std::fabs(rv[i]);
      }
      EXPECT_EQ(static_cast<double>(norms[c]), want) << "chunk " << c;
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(static_cast<double>(v[i]), rv[i]) << i;
      if (momentum) {
        ASSERT_EQ(static_cast<double>(u[i]), ru[i]) << i;
      }
    }
  }
}

TEST(HostKernels, TopChunksGatherAndScatterMatchPlainLoops) {
  auto& k = *kernels::hostKernels();
  // Ties go to the lower index; NaN counts as the largest.
  const std::vector<float> norms = {3, 1, 7, 3, std::numeric_limits<float>::quiet_NaN(), 7, 0};
  std::vector<uint32_t> idx(4);
  k.topChunks(norms.data(), norms.size(), 4, idx.data(), nullptr, k.topChunksTempBytes(7));
  EXPECT_EQ(idx, (std::vector<uint32_t>{0, 2, 4, 5}));
  // n = 10 in chunks of 4 over tensors of 3 and 7: chunk 0 spans both, the
  // last chunk (2) is short and padded.
  const size_t n = 10, chunk = 4;
  const std::vector<uint32_t> pick = {0, 2};
  auto v = randomFloats(n, 4), u = randomFloats(n, 5);
  std::vector<float> grad(n, 9.0f);
  auto b = bucketOver({3, 7}, grad.data(), v.data(), u.data(), chunk);
  std::vector<float> packed(2 * chunk, -1.0f);
  k.gatherChunks(packed.data(), b, pick.data(), 2);
  const std::vector<float> want = {v[0], v[1], v[2], v[3], v[8], v[9], 0.0f, 0.0f};
  EXPECT_EQ(packed, want);
  for (bool mask : {false, true}) {
    const auto v0 = v, u0 = u;
    k.scatterChunks(b, packed.data(), pick.data(), 2, mask);
    for (size_t i = 0; i < n; ++i) {
      const bool picked = i < 4 || i >= 8;
      EXPECT_EQ(grad[i], picked ? want[i < 4 ? i : i - 4] : 0.0f) << i;
      EXPECT_EQ(v[i], picked ? 0.0f : v0[i]) << i;
      EXPECT_EQ(u[i], picked && mask ? 0.0f : u0[i]) << i;
    }
  }
}

// The CSC protocol's order: the accumulate pass moves each gradient into
// its residual (leaving it zero), so the scatter writes only the picked
// chunks, and the result is the same as a scatter that writes the zeros.
TEST(HostKernels, TheAccumulatePassClearsTheGradientsForTheScatter) {
  auto& k = *kernels::hostKernels();
  const size_t n = 10, chunk = 4;
  const std::vector<uint32_t> pick = {1};
  auto g = randomFloats(n, 6), v = randomFloats(n, 7);
  const auto g0 = g, v0 = v;
  auto b = bucketOver({3, 7}, g.data(), v.data(), nullptr, chunk);
  std::vector<float> norms(3);
  k.accumulateChunkNorms(b, 0.0f, norms.data());
  EXPECT_TRUE(b.gradientsCleared);
  EXPECT_EQ(g, std::vector<float>(n, 0.0f));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], v0[i] + g0[i]) << i;
  const std::vector<float> packed = {1, 2, 3, 4};
  k.scatterChunks(b, packed.data(), pick.data(), 1, false);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(g[i], i >= 4 && i < 8 ? packed[i - 4] : 0.0f) << i;
}

TEST(HostKernels, CopyMovesEveryByteAndMemoryStartsZeroed) {
  auto& k = *kernels::hostKernels();
  std::vector<char> a(100), b(100, 0);
  std::iota(a.begin(), a.end(), 1);
  k.copy({{a.data(), b.data() + 50, 30}, {a.data() + 30, b.data(), 20}, {a.data(), b.data(), 0}});
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 30, b.begin() + 50));
  EXPECT_TRUE(std::equal(a.begin() + 30, a.begin() + 50, b.begin()));
  auto* p = static_cast<unsigned char*>(k.allocate(64));
  EXPECT_TRUE(std::all_of(p, p + 64, [](unsigned char c) { return c == 0; }));
  std::memset(p, 7, 64);
  k.zero(p, 64);
  EXPECT_TRUE(std::all_of(p, p + 64, [](unsigned char c) { return c == 0; }));
}

// The same operation on the host kernels (host vectors) and on the CUDA
// kernels over the software GPU (device copies of the same inputs).
class HostAndCudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    softcuda::install(1);
    cuda_ = std::make_unique<kernels::CudaKernels>(*softcuda::plugin(), 0, nullptr, 4);
  }
  void TearDown() override {
    cuda_.reset();
    for (void* p : mem_) softcuda::free(p);
    EXPECT_EQ(softcuda::allocationsAlive(), 0);
    softcuda::uninstall();
  }
  // A device copy of `host`.
  template <class T>
  T* onDevice(const std::vector<T>& host) {
    mem_.push_back(softcuda::alloc(0, std::max<size_t>(1, host.size() * sizeof(T))));
    std::memcpy(mem_.back(), host.data(), host.size() * sizeof(T));
    return static_cast<T*>(mem_.back());
  }
  template <class T>
  void expectSameBits(const std::vector<T>& host, const T* device, const char* what) {
    cuda_->synchronize();
    ASSERT_EQ(std::memcmp(host.data(), device, host.size() * sizeof(T)), 0) << what;
  }
  GradientKernels& host() { return *kernels::hostKernels(); }
  void cscSteps(const std::vector<size_t>& sizes, std::vector<float> g, std::vector<float> v,
                std::vector<float> u, float m);
  std::unique_ptr<kernels::CudaKernels> cuda_;
  std::vector<void*> mem_;
};

TEST_F(HostAndCudaKernels, NarrowWidenAndNonFiniteAgreeBitForBit) {
  auto x = randomFloats(1000, 7, -70000.0f, 70000.0f);  // beyond float16's range too
  x[5] = std::numeric_limits<float>::quiet_NaN();
  for (DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<uint16_t> hw(x.size());
    uint16_t* dw = onDevice(hw);
    host().narrow(hw.data(), x.data(), x.size(), wire, 0.37f, nullptr);
    cuda_->narrow(dw, onDevice(x), x.size(), wire, 0.37f, nullptr);
    expectSameBits(hw, dw, "narrow");
    std::vector<float> hb(x.size());
    float* db = onDevice(hb);
    host().widen(hb.data(), hw.data(), x.size(), wire, 1.9f);
    cuda_->widen(db, dw, x.size(), wire, 1.9f);
    expectSameBits(hb, db, "widen");
    EXPECT_EQ(host().nonFinite(hw.data(), 1000, wire), cuda_->nonFinite(dw, 1000, wire));
    EXPECT_EQ(host().nonFinite(hw.data(), 5, wire), cuda_->nonFinite(dw, 5, wire));
  }
  EXPECT_TRUE(cuda_->nonFinite(onDevice(x), x.size(), DataType::kFloat32));
  EXPECT_FALSE(cuda_->nonFinite(onDevice(x), 5, DataType::kFloat32));
}

TEST_F(HostAndCudaKernels, ScaleAgreesBitForBit) {
  auto x = randomFloats(3000, 13, -3e38f, 3e38f);  // products beyond float32 too
  x[7] = std::numeric_limits<float>::denorm_min();
  x[8] = std::numeric_limits<float>::quiet_NaN();
  for (float k : {0.125f, 1.0f / 3.0f, 3.7f}) {
    std::vector<float> h = x;
    float* d = onDevice(x);
    host().scale(h.data(), h.size(), k);
    cuda_->scale(d, x.size(), k);
    expectSameBits(h, d, "scale");
  }
}

// Every CSC step on both, with tensors of `sizes` and `g`, `v`, `u` as the
// bucket's data: the results must be the same bits.
void HostAndCudaKernels::cscSteps(const std::vector<size_t>& sizes, std::vector<float> g,
                                  std::vector<float> v, std::vector<float> u, float m) {
  const size_t n = g.size(), chunk = 50, chunks = kernels::numChunks(n, chunk), k = 6;
  float *dg = onDevice(g), *dv = onDevice(v), *du = onDevice(u);
  auto hb = bucketOver(sizes, g.data(), v.data(), u.data(), chunk);
  auto db = bucketOver(sizes, dg, dv, du, chunk);
  ASSERT_EQ(host().stagingElements(n), 0u);
  ASSERT_EQ(cuda_->stagingElements(n), n);
  db.staged.g = onDevice(std::vector<float>(n));
  db.staged.v = onDevice(std::vector<float>(n));
  db.staged.u = onDevice(std::vector<float>(n));
  std::vector<float> hn(chunks);
  float* dn = onDevice(hn);
  host().accumulateChunkNorms(hb, m, hn.data());
  cuda_->accumulateChunkNorms(db, m, dn);
  expectSameBits(hn, dn, "norms");
  std::vector<uint32_t> hi(k);
  uint32_t* di = onDevice(hi);
  const size_t temp = cuda_->topChunksTempBytes(chunks);
  void* dt = onDevice(std::vector<char>(temp));
  host().topChunks(hn.data(), chunks, k, hi.data(), nullptr, 0);
  cuda_->topChunks(dn, chunks, k, di, dt, temp);
  expectSameBits(hi, di, "top chunks");
  std::vector<float> hp(k * chunk);
  float* dp = onDevice(hp);
  host().gatherChunks(hp.data(), hb, hi.data(), k);
  cuda_->gatherChunks(dp, db, di, k);
  expectSameBits(hp, dp, "gather");
  host().scatterChunks(hb, hp.data(), hi.data(), k, true);
  cuda_->scatterChunks(db, dp, di, k, true);
  expectSameBits(g, dg, "scatter: gradient");
  expectSameBits(v, dv, "scatter: residual");
  expectSameBits(u, du, "scatter: velocity");
}

TEST_F(HostAndCudaKernels, CscStepsAgreeBitForBit) {
  // Tensors cut at chunk boundaries: any data, the same float32 sums.
  cscSteps({150, 0, 300, 551}, randomFloats(1001, 8), randomFloats(1001, 9), randomFloats(1001, 10),
           0.9f);
  // Chunks spanning tensors: the host sums a chunk's parts, the GPU the
  // whole chunk, so integer data (and an exact momentum) keeps every sum
  // exact in any order.
  cscSteps({7, 130, 3000, 64, 1}, integerFloats(3202, 11), integerFloats(3202, 12),
           integerFloats(3202, 13), 0.5f);
}

TEST_F(HostAndCudaKernels, BatchedCopyAndZeroAgree) {
  auto a = randomFloats(300, 11);
  std::vector<float> hb(300, 0.0f);
  float *da = onDevice(a), *db = onDevice(hb);
  host().copy({{a.data(), hb.data() + 100, 400}, {a.data() + 200, hb.data(), 200}});
  cuda_->copy({{da, db + 100, 400}, {da + 200, db, 200}});
  expectSameBits(hb, db, "copy");
  host().zero(hb.data() + 10, 40);
  cuda_->zero(db + 10, 40);
  expectSameBits(hb, db, "zero");
}

}  // namespace
}  // namespace gflow
