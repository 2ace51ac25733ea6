// Wire conversions (kernels/convert.h) and CSC kernels (kernels/sparse.h)
// against independent references: narrowing with a scale is one float32
// multiply then one round-to-nearest-even to the 16-bit type, on every ISA
// this CPU runs; the inf/NaN scan; the residual update with its L1 norm and
// the top chunks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/convert.h"
#include "kernels/reduce.h"
#include "kernels/sparse.h"

namespace gflow::kernels {
namespace {

// Reference float -> float16 / bfloat16, round to nearest even, from the
// bit patterns (shares no code with src/kernels).
uint16_t refHalf(float f) {
  if (std::isnan(f)) return 0x7e00;
  const bool neg = std::signbit(f);
  double a = std::fabs(static_cast<double>(f));
  const uint16_t sign = neg ? 0x8000 : 0;
  if (a >= 65520.0) return sign | 0x7c00;  // rounds to inf
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // Quantum: 2^(e-11) for normals, 2^-24 for subnormals.
  const int q = std::max(e - 11, -24);
  const double n = std::nearbyint(std::ldexp(a, -q));  // current rounding mode: to even
  const double v = std::ldexp(n, q);
  if (v == 0) return sign;
  int ve;
  std::frexp(v, &ve);
  if (ve - 1 < -14) return sign | static_cast<uint16_t>(std::ldexp(v, 24));  // subnormal
  const auto exp = static_cast<uint16_t>(ve - 1 + 15);
  const auto mant = static_cast<uint16_t>(std::ldexp(v, -(ve - 1) + 10) - 1024);
  return sign | static_cast<uint16_t>(exp << 10) | mant;
}

uint16_t refBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40);
  const uint32_t lsb = (x >> 16) & 1;
  return static_cast<uint16_t>((x + 0x7fff + lsb) >> 16);
}

std::vector<float> interestingFloats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          0.1f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          1e-8f,
                          -3e-7f,
                          6.1e-5f,
                          1e30f,
                          -1e30f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min()};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-30, 20);
  for (int i = 0; i < 5000; ++i) v.push_back(std::ldexp(u(rng), ex(rng)));
  return v;
}

class ConvertTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    saved_ = activeIsa();
    if (!setIsa(GetParam())) GTEST_SKIP() << "CPU lacks " << toString(GetParam());
  }
  void TearDown() override { setIsa(saved_); }
  Isa saved_ = Isa::kBaseline;
};

TEST_P(ConvertTest, NarrowWithScaleIsOneMultiplyThenOneRounding) {
  const std::vector<float> x = interestingFloats();
  for (float scale : {1.0f, 0.25f, 1.0f / 3.0f, 1000.0f}) {
    for (DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
      std::vector<uint16_t> out(x.size());
      narrow(out.data(), x.data(), x.size(), wire, scale);
      for (size_t i = 0; i < x.size(); ++i) {
        const float scaled = x[i] * scale;
        const uint16_t want = wire == DataType::kFloat16 ? refHalf(scaled) : refBfloat16(scaled);
        if (std::isnan(scaled)) {
          const uint16_t mask = wire == DataType::kFloat16 ? 0x7c00 : 0x7f80;
          ASSERT_EQ(out[i] & mask, mask) << i;
          continue;
        }
        ASSERT_EQ(out[i], want) << toString(wire) << " x=" << x[i] << " scale=" << scale;
      }
      // Widening back with a scale: exact widening, one multiply.
      std::vector<float> back(x.size());
      widen(back.data(), out.data(), out.size(), wire, 2.0f);
      for (size_t i = 0; i < x.size(); i += 7) {
        const float w = wire == DataType::kFloat16 ? halfToFloat(out[i]) : bfloat16ToFloat(out[i]);
        if (!std::isnan(w)) {
          ASSERT_EQ(back[i], w * 2.0f) << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, ConvertTest, ::testing::Values(Isa::kBaseline, Isa::kAvx2, Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& i) { return toString(i.param); });

// The scan runs in blocks of 256 elements, then a tail: sizes and positions
// on both sides of a block's edge.
TEST(NonFinite, FindsInfAndNanAnywhereInEveryFloatType) {
  for (size_t n : {1u, 7u, 64u, 255u, 256u, 257u, 1001u, 4099u}) {
    for (size_t at : {size_t(0), n / 2, n - 1, size_t(255), size_t(256), size_t(3840)}) {
      if (at >= n) continue;
      std::vector<float> f(n, 1.5f);
      std::vector<double> d(n, -2.0);
      std::vector<uint16_t> h(n, 0x3c00), b(n, 0x3f80);
      EXPECT_FALSE(anyNonFinite(f.data(), n, DataType::kFloat32));
      EXPECT_FALSE(anyNonFinite(d.data(), n, DataType::kFloat64));
      EXPECT_FALSE(anyNonFinite(h.data(), n, DataType::kFloat16));
      EXPECT_FALSE(anyNonFinite(b.data(), n, DataType::kBFloat16));
      f[at] = std::numeric_limits<float>::quiet_NaN();
      d[at] = -std::numeric_limits<double>::infinity();
      h[at] = 0xfc00;  // -inf
      b[at] = 0x7fc1;  // NaN
      EXPECT_TRUE(anyNonFinite(f.data(), n, DataType::kFloat32));
      EXPECT_TRUE(anyNonFinite(d.data(), n, DataType::kFloat64));
      EXPECT_TRUE(anyNonFinite(h.data(), n, DataType::kFloat16));
      EXPECT_TRUE(anyNonFinite(b.data(), n, DataType::kBFloat16));
    }
  }
  const uint16_t maxHalf = 0x7bff;
  EXPECT_FALSE(anyNonFinite(&maxHalf, 1, DataType::kFloat16));
  const int32_t i = -1;
  EXPECT_FALSE(anyNonFinite(&i, 1, DataType::kInt32));
}

TEST(Sparse, AccumulateReturnsTheL1NormOfTheNewResidual) {
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 100u, 1001u}) {
    std::vector<float> v(n), u(n), g(n);
    for (size_t i = 0; i < n; ++i) {
      v[i] = (i % 3 == 0 ? -1.0f : 0.5f) * float(i % 11);
      u[i] = float(i % 5) - 2.0f;
      g[i] = float(i % 7) - 3.0f;
    }
    std::vector<float> v2 = v, u2 = u;
    double want = 0, wantM = 0;
    for (size_t i = 0; i < n; ++i) want += std::fabs(double(v[i]) + g[i]);
    EXPECT_EQ(accumulateL1(v.data(), g.data(), n), static_cast<float>(want)) << n;  // exact: halves
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], v2[i] + g[i]);
    for (size_t i = 0; i < n; ++i) wantM += std::fabs(double(v2[i]) + (0.5 * u2[i] + g[i]));
    std::vector<float> v3 = v2;
    EXPECT_EQ(accumulateMomentumL1(v3.data(), u2.data(), g.data(), 0.5f, n),
              static_cast<float>(wantM))
        << n;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(u2[i], 0.5f * u[i] + g[i]);
      ASSERT_EQ(v3[i], v2[i] + u2[i]);
    }
  }
}

// Eight lanes, each summing its elements in order, folded as
// ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)): the bits every device must give.
float eightLaneL1(const std::vector<float>& v) {
  float acc[8] = {};
  for (size_t i = 0; i < v.size(); ++i) acc[i % 8] += std::fabs(v[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Values whose sums round: the vectorised lanes must give the scalar
// reference's bits, not only a close sum.
TEST(Sparse, AccumulateGivesTheBitsOfEightOrderedLanes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  auto value = [&] { return std::ldexp(mantissa(rng), exponent(rng)); };
  std::vector<size_t> sizes = {1000, 4099};
  for (size_t n = 1; n <= 40; ++n) sizes.push_back(n);
  for (size_t n : sizes) {
    std::vector<float> v(n), u(n), g(n);
    for (size_t i = 0; i < n; ++i) v[i] = value(), u[i] = value(), g[i] = value();
    std::vector<float> want(n), wantU(n), wantM(n);
    for (size_t i = 0; i < n; ++i) {
      want[i] = v[i] + g[i];
      wantU[i] = 0.9f * u[i] + g[i];
      wantM[i] = v[i] + wantU[i];
    }
    std::vector<float> got = v, gotV = v, gotU = u;
    EXPECT_EQ(accumulateL1(got.data(), g.data(), n), eightLaneL1(want)) << n;
    EXPECT_EQ(got, want) << n;
    EXPECT_EQ(accumulateMomentumL1(gotV.data(), gotU.data(), g.data(), 0.9f, n), eightLaneL1(wantM))
        << n;
    EXPECT_EQ(gotV, wantM) << n;
    EXPECT_EQ(gotU, wantU) << n;
    // The moving twins: the same bits, and the gradient left zero.
    const std::vector<float> zeros(n, 0.0f);
    std::vector<float> moved = v, g1 = g;
    EXPECT_EQ(moveL1(moved.data(), g1.data(), n), eightLaneL1(want)) << n;
    EXPECT_EQ(moved, want) << n;
    EXPECT_EQ(g1, zeros) << n;
    std::vector<float> movedV = v, movedU = u, g2 = g;
    EXPECT_EQ(moveMomentumL1(movedV.data(), movedU.data(), g2.data(), 0.9f, n), eightLaneL1(wantM))
        << n;
    EXPECT_EQ(movedV, wantM) << n;
    EXPECT_EQ(movedU, wantU) << n;
    EXPECT_EQ(g2, zeros) << n;
  }
}

TEST(Sparse, TopChunksTiesToTheLowerIndexNanFirstAscending) {
  const std::vector<float> n = {1, 5, 3, 5, std::numeric_limits<float>::quiet_NaN(), 0, 5};
  EXPECT_EQ(topChunks(n.data(), n.size(), 3), (std::vector<size_t>{1, 3, 4}));
  EXPECT_EQ(topChunks(n.data(), n.size(), 1), (std::vector<size_t>{4}));
  EXPECT_EQ(topChunks(n.data(), n.size(), 0).size(), 0u);
  EXPECT_EQ(topChunks(n.data(), n.size(), 99).size(), n.size());
  const std::vector<float> flat(10, 2.0f);
  EXPECT_EQ(topChunks(flat.data(), flat.size(), 2), (std::vector<size_t>{0, 1}));
}

}  // namespace
}  // namespace gflow::kernels
