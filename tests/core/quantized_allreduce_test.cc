// Allreduce of float32 data on a block-quantized wire (qint8, qint4):
// against a float64 reference and the error bound of docs/compression.md on
// every algorithm; all ranks bitwise identical; the bytes on the wire;
// error feedback through AllreduceOptions::residual; inf/NaN; bad options;
// the compressed steps staging blocks that straddle spans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/compressed_allreduce.h"
#include "gflow/gflow.h"
#include "kernels/host_kernels.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

double quantMax(DataType wire) {
  return wire == DataType::kQInt8 ? 127.0 : 7.0;
}

// docs/compression.md: with h = 1/(2Q) + 2^-20 and A the sum over ranks of
// the block's largest prescaled magnitude, every value of the block is
// within N h A / (1 - (N-1) h) (+ N 2^-120) of the exact sum.
double blockBound(DataType wire, int n, double a) {
  const double h = 1.0 / (2.0 * quantMax(wire)) + std::ldexp(1.0, -20);
  return n * h * a / (1.0 - (n - 1) * h) + n * std::ldexp(1.0, -120);
}

// Gradient-like values whose magnitude changes from block to block, with a
// few outliers.
std::vector<float> inputs(int rank, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(777 + rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float scale = std::ldexp(1.0f, static_cast<int>((i / kQuantBlock) % 9) - 4);
    v[i] = d(rng) * scale * (i % 97 == 0 ? 20.0f : 1.0f);
  }
  return v;
}

struct Case {
  int ranks;
  const char* algo;  // "" = default (shared memory on one host), "ring", "rd", "hd"
  DataType wire;
};

// Every rank's result within the bound of the float64 reference (sum, avg
// or max of `in` with the prescale, undone by postscale = 1/prescale), and
// every rank the same bits.
void expectWithinTheBound(const std::vector<std::vector<float>>& in,
                          const std::vector<std::vector<float>>& results, DataType wire,
                          ReduceOp op, float prescale) {
  const int N = static_cast<int>(in.size());
  const size_t n = in[0].size();
  // avg runs as a sum with 1/N folded into the prescale.
  const double p = op == ReduceOp::kAvg ? double(prescale) / N : double(prescale);
  for (int r = 0; r < N; ++r) ASSERT_EQ(results[r].size(), n) << "rank " << r;
  for (size_t b = 0; b * kQuantBlock < n; ++b) {
    const size_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
    double a = 0;
    for (int r = 0; r < N; ++r) {
      double m = 0;
      for (size_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(in[r][i] * p));
      a += m;
    }
    const double bound = blockBound(wire, N, a) / prescale;
    for (size_t i = lo; i < hi; ++i) {
      double exact = op == ReduceOp::kMax ? -INFINITY : 0.0;
      for (int r = 0; r < N; ++r) {
        const double x = in[r][i];
        exact = op == ReduceOp::kMax ? std::max(exact, x) : exact + x;
      }
      if (op == ReduceOp::kAvg) exact /= N;
      ASSERT_LE(std::fabs(results[0][i] - exact), bound + 1e-6 * std::fabs(exact))
          << "element " << i << " op " << toString(op) << " prescale " << prescale;
      for (int r = 1; r < N; ++r) {
        ASSERT_EQ(std::memcmp(&results[r][i], &results[0][i], 4), 0) << "rank " << r;
      }
    }
  }
}

// Runs allreduce(in[rank], o) on every rank of `base`'s world.
std::vector<std::vector<float>> runQuantized(const std::vector<std::vector<float>>& in,
                                             const AllreduceOptions& o, const Options& base) {
  std::vector<std::vector<float>> results(in.size());
  testing::runRanks(
      static_cast<int>(in.size()),
      [&](Communicator& comm) {
        std::vector<float> v = in[comm.rank()];
        EXPECT_FALSE(comm.allreduce(tensor(v.data(), v.size()), o).nonFinite);
        results[comm.rank()] = v;
      },
      base);
  return results;
}

class QuantizedAllreduce : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizedAllreduce, WithinTheBoundAndBitwiseIdenticalOnEveryRank) {
  const Case c = GetParam();
  const size_t n = 40 * kQuantBlock + 37;  // a short last block
  Options base;
  base.algorithm = c.algo;
  std::vector<std::vector<float>> in;
  for (int r = 0; r < c.ranks; ++r) in.push_back(inputs(r, n));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    for (float prescale : {1.0f, 0.25f}) {
      AllreduceOptions o;
      o.op = op;
      o.wire = c.wire;
      o.prescale = prescale;
      o.postscale = 1.0f / prescale;
      expectWithinTheBound(in, runQuantized(in, o, base), c.wire, op, prescale);
    }
  }
}

// Buffers of 0.07 and 1.1 MB of blocks: the shared-memory backend's slot
// path and its single-copy path (forced on for every size and rank count:
// "shm1"), and the ring's pipelined chunks, cut blocks too.
TEST(Quantized, LargeBuffersOnSharedMemoryAndTheRing) {
  for (const char* algo : {"", "shm1", "ring"}) {
    for (int ranks : {2, 4}) {
      for (size_t n : {size_t{65536} + 77, size_t{1} << 20}) {
        std::vector<std::vector<float>> in;
        for (int r = 0; r < ranks; ++r) in.push_back(inputs(r, n));
        Options base;
        base.algorithm = std::string(algo) == "ring" ? "ring" : "";
        base.shm.singleCopy = std::string(algo) == "shm1" ? "1K-1G" : "off";
        AllreduceOptions o;
        o.op = ReduceOp::kAvg;
        o.wire = DataType::kQInt8;
        SCOPED_TRACE(std::string(algo) + " " + std::to_string(ranks) + " ranks, " +
                     std::to_string(n) + " values");
        expectWithinTheBound(in, runQuantized(in, o, base), o.wire, o.op, 1.0f);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    , QuantizedAllreduce,
    ::testing::Values(Case{2, "", DataType::kQInt8}, Case{3, "", DataType::kQInt4},
                      Case{4, "", DataType::kQInt8}, Case{3, "ring", DataType::kQInt8},
                      Case{4, "ring", DataType::kQInt4}, Case{4, "rd", DataType::kQInt8},
                      Case{5, "ring", DataType::kQInt4}, Case{4, "hd", DataType::kQInt4},
                      Case{5, "hd", DataType::kQInt8}, Case{8, "ring", DataType::kQInt8}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(i.param.algo[0] ? i.param.algo : "auto") + "_n" +
             std::to_string(i.param.ranks) + "_" + toString(i.param.wire);
    });

// Several (simulated) hosts: the hierarchical path reduces blocks within
// each host, across the hosts, and back; the same bound and bits.
TEST(Quantized, HierarchicalPathWithinTheBound) {
  const std::vector<int> hostOf = {0, 0, 1, 1, 1};
  const int N = static_cast<int>(hostOf.size());
  const size_t n = 30 * kQuantBlock + 3;
  std::vector<std::vector<float>> in, results(N);
  for (int r = 0; r < N; ++r) in.push_back(inputs(r, n));
  auto world = testing::makeWorldWith(N, testing::onHosts(hostOf));
  testing::forEachRank(world, [&](Communicator& c) {
    std::vector<float> v = in[c.rank()];
    AllreduceOptions o;
    o.wire = DataType::kQInt4;
    c.allreduce(tensor(v.data(), v.size()), o);
    EXPECT_GT(c.stats().hierarchicalOps, 0u);
    results[c.rank()] = v;
  });
  expectWithinTheBound(in, results, DataType::kQInt4, ReduceOp::kSum, 1.0f);
}

// Reproducible mode gives the same bits whatever cuts the data (the bound
// holds as above: any fixed tree has N - 1 inner nodes).
TEST(Quantized, ReproducibleModeIsBitwiseStable) {
  for (int ranks : {3, 4}) {
    std::vector<std::vector<float>> runs;
    for (const char* algo : {"", "ring"}) {
      Options o;
      o.algorithm = algo;
      o.reproducible = true;
      std::vector<float> out;
      testing::runRanks(
          ranks,
          [&](Communicator& comm) {
            std::vector<float> v = inputs(comm.rank(), 3000);
            AllreduceOptions ao;
            ao.wire = DataType::kQInt8;
            comm.allreduce(tensor(v.data(), v.size()), ao);
            if (comm.rank() == 0) out = v;
          },
          o);
      runs.push_back(out);
    }
    EXPECT_EQ(runs[0], runs[1]) << ranks << " ranks";
  }
}

TEST(Quantized, BytesOnTheWireAreAQuarterAndAnEighth) {
  Options o;
  o.algorithm = "ring";  // over TCP: per-peer byte counters
  testing::runRanks(
      3,
      [](Communicator& c) {
        std::vector<float> v(1 << 20, 1.0f);
        uint64_t before = c.stats().bytesSent();
        c.allreduce(tensor(v.data(), v.size()));
        const uint64_t dense = c.stats().bytesSent() - before;
        for (auto [wire, cap] : {std::pair{DataType::kQInt8, 0.27}, {DataType::kQInt4, 0.14}}) {
          std::fill(v.begin(), v.end(), 1.0f);
          AllreduceOptions q;
          q.wire = wire;
          before = c.stats().bytesSent();
          c.allreduce(tensor(v.data(), v.size()), q);
          const uint64_t sent = c.stats().bytesSent() - before;
          EXPECT_LE(double(sent), cap * double(dense)) << toString(wire) << sent << " vs " << dense;
          EXPECT_EQ(v[12345], 3.0f) << toString(wire);  // all ones: exact at every hop
        }
      },
      o);
}

// One rank (no inner nodes): over T steps the results add up to T times the
// input plus the residual's start minus its end, so the error of the sum
// stays within one quantization step however long it runs; without the
// residual it grows with T.
TEST(Quantized, ErrorFeedbackCarriesWhatQuantizingLost) {
  testing::runRanks(1, [](Communicator& c) {
    const size_t n = 2 * kQuantBlock + 5;
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = i % kQuantBlock == 0 ? 1.0f : 0.3f + 0.001f * (i % 17);
    constexpr int kSteps = 64;
    for (DataType wire : {DataType::kQInt8, DataType::kQInt4}) {
      std::vector<double> withSum(n, 0.0), withoutSum(n, 0.0);
      std::vector<float> residual(n, 0.0f);
      for (int t = 0; t < kSteps; ++t) {
        std::vector<float> a = x, b = x;
        AllreduceOptions o;
        o.wire = wire;
        c.allreduce(tensor(b.data(), n), o);
        o.residual = tensor(residual.data(), n);
        c.allreduce(tensor(a.data(), n), o);
        for (size_t i = 0; i < n; ++i) {
          withSum[i] += a[i];
          withoutSum[i] += b[i];
        }
      }
      const double step = 1.0 / quantMax(wire);  // the block's max is 1
      double worstWithout = 0;
      for (size_t i = 0; i < n; ++i) {
        const double exact = double(kSteps) * x[i];
        ASSERT_LE(std::fabs(withSum[i] + residual[i] - exact), kSteps * 1e-6) << i;
        ASSERT_LE(std::fabs(withSum[i] - exact), step) << toString(wire) << " element " << i;
        worstWithout = std::max(worstWithout, std::fabs(withoutSum[i] - exact));
      }
      EXPECT_GT(worstWithout, 4 * step) << toString(wire);  // what the feedback prevents
    }
  });
}

TEST(Quantized, InfAndNanMakeTheirBlockNanOnEveryRank) {
  testing::runRanks(3, [](Communicator& c) {
    std::vector<float> v(3 * kQuantBlock, 1.0f);
    if (c.rank() == 1) v[kQuantBlock + 7] = INFINITY;
    std::vector<float> residual(v.size(), 0.3f);
    AllreduceOptions o;
    o.wire = DataType::kQInt4;
    o.residual = tensor(residual.data(), residual.size());
    EXPECT_TRUE(c.allreduce(tensor(v.data(), v.size()), o).nonFinite);
    for (size_t i = 0; i < v.size(); ++i) {
      if (i / kQuantBlock == 1) {
        ASSERT_TRUE(std::isnan(v[i])) << i;  // the whole block, on every rank
        // The poisoned block's residual is dropped, not kept as NaN.
        if (c.rank() == 1) {
          ASSERT_EQ(residual[i], 0.0f) << i;
        }
      } else {
        ASSERT_NEAR(v[i], 3.9f, 1e-5f) << i;  // (1 + 0.3) x 3
      }
      ASSERT_TRUE(std::isfinite(residual[i])) << i;
    }
  });
}

TEST(Quantized, BadOptionsAreInvalid) {
  auto check = [](const std::function<void(Communicator&)>& fn, const std::string& what) {
    for (const testing::Outcome& o : testing::runRanksOutcomes(2, fn)) {
      EXPECT_EQ(o.code, ErrorCode::kInvalidArgument) << o.what;
      EXPECT_NE(o.what.find(what), std::string::npos) << o.what;
    }
  };
  check(
      [](Communicator& c) {
        std::vector<float> v(10);
        AllreduceOptions o;
        o.op = ReduceOp::kProd;
        o.wire = DataType::kQInt8;
        c.allreduce(tensor(v.data(), v.size()), o);
      },
      "reduce op prod does not apply to qint8");
  check(
      [](Communicator& c) {
        std::vector<float> v(10), r(10);
        AllreduceOptions o;
        o.wire = DataType::kFloat16;
        o.residual = tensor(r.data(), r.size());
        c.allreduce(tensor(v.data(), v.size()), o);
      },
      "needs float32 data on a qint8 or qint4 wire");
  check(
      [](Communicator& c) {
        std::vector<float> v(10), r(9);
        AllreduceOptions o;
        o.wire = DataType::kQInt4;
        o.residual = tensor(r.data(), r.size());
        c.allreduce(tensor(v.data(), v.size()), o);
      },
      "residual must be float32 with inout's count (10)");
  check(
      [](Communicator& c) {
        std::vector<float> v(10);
        AllreduceOptions o;
        o.wire = DataType::kQInt4;
        o.residual = tensor(v.data() + 2, 8);
        c.allreduce(tensor(v.data(), 8), o);
      },
      "must not overlap");
}

// Blocks that straddle spans: the steps gather the spans (and their
// residuals) into one range, quantize it as a whole, and scatter back.
TEST(CompressedSteps, QuantizedBlocksMayStraddleSpans) {
  std::vector<float> a(100), b(200);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.01f * float(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -0.02f * float(i);
  std::vector<float> ra(a.size(), 0.0f), rb(b.size(), 0.0f);
  std::vector<float> whole(a);
  whole.insert(whole.end(), b.begin(), b.end());
  std::vector<float> wholeResidual(whole.size(), 0.0f);
  const DataType wire = DataType::kQInt8;
  const size_t bytes = internal::WireFormat{wire}.wireBytes(whole.size());
  std::vector<uint8_t> got(bytes), want(bytes);
  internal::CompressedAllreduce c;
  c.format = internal::WireFormat{wire, 2.0f, 0.5f};
  c.worldSize = 1;
  c.wire = got.data();
  c.count = whole.size();
  c.spans = {internal::WireSpan{a.data(), a.size(), 0, ra.data()},
             internal::WireSpan{b.data(), b.size(), a.size(), rb.data()}};
  const internal::FusedSteps s = internal::compressedSteps(std::move(c));
  EXPECT_EQ(s.buffer.count, 3u);  // 300 values: 3 blocks
  EXPECT_EQ(s.buffer.dtype, wire);
  s.before();
  // The same as quantizing the whole range at once.
  kernels::hostKernels()->narrow(want.data(), whole.data(), whole.size(), wire, 2.0f,
                                 wholeResidual.data());
  EXPECT_EQ(got, want);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(ra[i], wholeResidual[i]) << i;
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(rb[i], wholeResidual[a.size() + i]) << i;
  s.after();
  std::vector<float> back(whole.size());
  kernels::hostKernels()->widen(back.data(), want.data(), back.size(), wire, 0.5f);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], back[i]) << i;
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], back[a.size() + i]) << i;
}

}  // namespace
}  // namespace gflow
