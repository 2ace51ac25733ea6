// Allreduce with AllreduceOptions: float32 data on a float16/bfloat16 wire,
// against a float64 reference and the error bound of docs/compression.md;
// all ranks bitwise identical; bytes on the wire halved; inf/NaN reported.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/compressed_allreduce.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

// Unit roundoff and the absolute error of one rounding near zero.
double unitRoundoff(DataType wire) {
  return wire == DataType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}
double underflowError(DataType wire) {
  return wire == DataType::kFloat16 ? std::ldexp(1.0, -25) : std::ldexp(1.0, -134);
}

std::vector<float> inputs(int rank, size_t n, float magnitude) {
  std::mt19937 rng(static_cast<uint32_t>(1234 + rank));
  std::normal_distribution<float> d(0.0f, magnitude);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Case {
  int ranks;
  const char* algo;  // "" = default (shared memory on one host), "ring", "rd", "hd"
  DataType wire;
};

class Compressed : public ::testing::TestWithParam<Case> {};

TEST_P(Compressed, WithinTheBoundAndBitwiseIdenticalOnEveryRank) {
  const Case c = GetParam();
  const size_t n = 5003;
  Options base;
  base.algorithm = c.algo;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    for (float prescale : {1.0f, 0.25f}) {
      std::vector<std::vector<float>> results(c.ranks);
      testing::runRanks(
          c.ranks,
          [&](Communicator& comm) {
            std::vector<float> v = inputs(comm.rank(), n, 3.0f);
            AllreduceOptions o;
            o.op = op;
            o.wire = c.wire;
            o.prescale = prescale;
            o.postscale = 1.0f / prescale;
            EXPECT_FALSE(comm.allreduce(tensor(v.data(), v.size()), o).nonFinite);
            results[comm.rank()] = v;
          },
          base);
      for (int r = 0; r < c.ranks; ++r) ASSERT_EQ(results[r].size(), n) << "rank " << r;
      const double u = unitRoundoff(c.wire), eta = underflowError(c.wire);
      std::vector<std::vector<float>> in;
      for (int r = 0; r < c.ranks; ++r) in.push_back(inputs(r, n, 3.0f));
      for (size_t i = 0; i < n; ++i) {
        double exact = 0, mag = 0;
        for (int r = 0; r < c.ranks; ++r) {
          const double x = in[r][i];
          exact += x;
          mag += std::fabs(x);
        }
        const int N = c.ranks;
        // avg runs as a sum with 1/N folded into the prescale.
        double bound = (N + 1) * u * mag + N * eta / prescale;
        if (op == ReduceOp::kAvg) {
          exact /= N;
          bound = (N + 1) * u * mag / N + N * N * eta / prescale;
        }
        bound += 1e-6 * std::fabs(exact);  // the float32 pre/postscale multiplies
        ASSERT_LE(std::fabs(results[0][i] - exact), bound)
            << "element " << i << " op " << toString(op) << " prescale " << prescale;
        for (int r = 1; r < N; ++r) {
          ASSERT_EQ(std::memcmp(&results[r][i], &results[0][i], 4), 0) << "rank " << r;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    , Compressed,
    ::testing::Values(Case{2, "", DataType::kFloat16}, Case{3, "", DataType::kFloat16},
                      Case{4, "", DataType::kBFloat16}, Case{3, "ring", DataType::kFloat16},
                      Case{4, "ring", DataType::kBFloat16}, Case{4, "rd", DataType::kFloat16},
                      Case{5, "ring", DataType::kFloat16}, Case{4, "hd", DataType::kBFloat16},
                      Case{5, "hd", DataType::kFloat16}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(i.param.algo[0] ? i.param.algo : "auto") + "_n" +
             std::to_string(i.param.ranks) + "_" + toString(i.param.wire);
    });

TEST(Compression, HalvesTheBytesOnTheWire) {
  Options o;
  o.algorithm = "ring";  // over TCP: per-peer byte counters
  testing::runRanks(
      3,
      [](Communicator& c) {
        std::vector<float> v(1 << 20, 1.0f);
        const uint64_t b0 = c.stats().bytesSent();
        c.allreduce(tensor(v.data(), v.size()));
        const uint64_t dense = c.stats().bytesSent() - b0;
        AllreduceOptions f16;
        f16.wire = DataType::kFloat16;
        c.allreduce(tensor(v.data(), v.size()), f16);
        const uint64_t half = c.stats().bytesSent() - b0 - dense;
        EXPECT_GT(dense, (1u << 20) * 4u);  // ring: 2 (N-1)/N of 4 MiB
        EXPECT_LE(double(half), 0.51 * double(dense)) << half << " vs " << dense;
        EXPECT_GE(double(half), 0.49 * double(dense));
        EXPECT_EQ(v[12345], 9.0f);  // 1 -> 3 -> 9, exact in float16
      },
      o);
}

TEST(Compression, ReportsInfAndNanOnEveryRank) {
  testing::runRanks(4, [](Communicator& c) {
    AllreduceOptions o;
    o.wire = DataType::kFloat16;
    // float16 overflow: 4 x 30000 > 65504.
    std::vector<float> big(100, 30000.0f);
    EXPECT_TRUE(c.allreduce(tensor(big.data(), big.size()), o).nonFinite);
    EXPECT_TRUE(std::isinf(big[0]));
    // Prescale keeps it in range; postscale restores the magnitude.
    std::fill(big.begin(), big.end(), 30000.0f);
    o.prescale = 0.25f;
    o.postscale = 4.0f;
    EXPECT_FALSE(c.allreduce(tensor(big.data(), big.size()), o).nonFinite);
    EXPECT_EQ(big[99], 120000.0f);
    // A NaN on one rank only, async.
    std::vector<float> v(1000, 1.0f);
    if (c.rank() == 2) v[500] = std::nanf("");
    AllreduceOptions plain;
    plain.wire = DataType::kBFloat16;
    Work w = c.allreduceAsync(tensor(v.data(), v.size()), plain);
    w.wait();
    EXPECT_TRUE(w.nonFinite());
    EXPECT_TRUE(std::isnan(v[500]));
    // float32 without compression is checked too.
    std::vector<float> f(10, 1.0f);
    if (c.rank() == 0) f[3] = INFINITY;
    EXPECT_TRUE(c.allreduce(tensor(f.data(), f.size()), AllreduceOptions{}).nonFinite);
    // A plain op carries no flag.
    Work plainOp = c.allreduceAsync(tensor(f.data() + 4, 1), ReduceOp::kSum);
    plainOp.wait();
    EXPECT_FALSE(plainOp.nonFinite());
  });
}

TEST(Compression, DefaultOptionsWorkOnEveryDtype) {
  testing::runRanks(2, [](Communicator& c) {
    std::vector<double> d(10, 1.5);
    std::vector<int32_t> i(10, 3);
    std::vector<uint16_t> h(10, 0x3c00);  // float16 1.0
    EXPECT_FALSE(
        c.allreduce(Tensor(d.data(), d.size(), DataType::kFloat64), AllreduceOptions{}).nonFinite);
    EXPECT_FALSE(
        c.allreduce(Tensor(i.data(), i.size(), DataType::kInt32), AllreduceOptions{}).nonFinite);
    AllreduceOptions same;
    same.wire = DataType::kFloat16;  // the data's own type: no conversion
    c.allreduce(Tensor(h.data(), h.size(), DataType::kFloat16), same);
    EXPECT_EQ(d[9], 3.0);
    EXPECT_EQ(i[9], 6);
    EXPECT_EQ(h[9], 0x4000);  // 2.0
  });
}

TEST(Compression, BadOptionsAreInvalidAndDisagreementIsAMismatch) {
  auto errs = testing::runRanksCollect(2, [](Communicator& c) {
    std::vector<int32_t> v(10);
    AllreduceOptions o;
    o.wire = DataType::kFloat16;
    c.allreduce(Tensor(v.data(), v.size(), DataType::kInt32), o);
  });
  for (auto& e : errs) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument) << err.what();
      EXPECT_NE(std::string(err.what()).find("wire type float16 for int32 data"), std::string::npos)
          << err.what();
    }
  }
  auto mixed = testing::runRanksCollect(2, [](Communicator& c) {
    std::vector<float> v(1000, 1.0f);
    AllreduceOptions o;
    if (c.rank() == 1) o.wire = DataType::kFloat16;
    c.allreduce(tensor(v.data(), v.size()), o);
  });
  for (auto& e : mixed) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kMismatch) << err.what();
    }
  }
}

// The one compressed allreduce's steps, without a collective between them
// (a world of one: the wire holds what this rank narrowed): spans narrowed
// at their wire offsets with the prescale (avg's 1/N folded in, the op a
// sum), the wire scanned before widening, widened with the postscale.
TEST(CompressedSteps, NarrowAtTheSpansScanThenWidenWithTheScales) {
  std::vector<float> a = {1.0f, -2.0f, 0.5f}, b = {8.0f, 3.0f};
  const std::vector<float> a0 = a, b0 = b;
  std::vector<uint16_t> wire(6, 0xffff);  // element 3 belongs to no span
  auto flag = std::make_shared<std::atomic<bool>>(false);
  internal::CompressedAllreduce c;
  c.format = internal::WireFormat{DataType::kFloat16, 2.0f, 3.0f};
  c.op = ReduceOp::kAvg;
  c.worldSize = 4;
  c.wire = wire.data();
  c.count = wire.size();
  c.spans = {internal::WireSpan{a.data(), a.size(), 0}, internal::WireSpan{b.data(), b.size(), 4}};
  c.nonFinite = flag;
  const internal::FusedSteps s = internal::compressedSteps(std::move(c));
  EXPECT_EQ(s.op, ReduceOp::kSum);
  EXPECT_EQ(s.buffer.data, wire.data());
  EXPECT_EQ(s.buffer.count, 6u);
  EXPECT_EQ(s.buffer.dtype, DataType::kFloat16);
  s.before();
  // float16 bits of x * 2 / 4 = x / 2 (all exact): 0.5, -1, 0.25 | 4, 1.5.
  const std::vector<uint16_t> want = {0x3800, 0xbc00, 0x3400, 0xffff, 0x4400, 0x3e00};
  EXPECT_EQ(wire, want);
  wire[3] = 0;  // a finite value outside the spans
  s.after();
  EXPECT_FALSE(flag->load());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], a0[i] / 2 * 3) << i;
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], b0[i] / 2 * 3) << i;
  // The scan covers the whole wire, and runs on the reduced wire values.
  wire[3] = 0x7c00;  // +inf
  s.after();
  EXPECT_TRUE(flag->load());
}

}  // namespace
}  // namespace gflow
