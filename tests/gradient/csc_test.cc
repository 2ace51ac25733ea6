// GradientReducer with mixed-precision compression and coarse-grained
// sparse communication (CSC), ranks as threads. CSC runs against an exact
// reference simulation (integer-valued gradients: every norm, sum and
// residual is exact in float32, so the chunks picked must match too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "gflow/gflow.h"
#include "gflow/reducer.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;

std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

// Gradient of rank r, step s, element i of the flat model: small integers,
// with whole chunks of zeros so that the norms differ.
float grad(int r, int s, size_t i) {
  const size_t h =
      (i * 2654435761u + static_cast<size_t>(s) * 97 + static_cast<size_t>(r) * 13) % 1000;
  if (h < 300) return 0.0f;
  return static_cast<float>(static_cast<int>(h % 7) - 3);
}

// The reference: residual per rank, chunk norms summed over ranks, top k by
// (norm desc, index asc) per bucket of `bucketElems` consecutive elements.
struct Reference {
  int ranks;
  size_t n, chunk, bucketElems;
  double density;
  uint64_t warmup;
  float momentum;
  std::vector<std::vector<double>> residual, velocity;
  Reference(int ranks_, size_t n_, size_t chunk_, size_t bucket_, double d, uint64_t w, float m)
      : ranks(ranks_),
        n(n_),
        chunk(chunk_),
        bucketElems(bucket_),
        density(d),
        warmup(w),
        momentum(m),
        residual(ranks_, std::vector<double>(n_)),
        velocity(residual) {}
  // The summed result of step s (what every rank's gradient becomes).
  std::vector<double> step(int s) {
    for (int r = 0; r < ranks; ++r) {
      for (size_t i = 0; i < n; ++i) {
        velocity[r][i] = momentum * velocity[r][i] + grad(r, s, i);
        residual[r][i] += momentum > 0 ? velocity[r][i] : grad(r, s, i);
      }
    }
    std::vector<double> out(n, 0.0);
    for (size_t b0 = 0; b0 < n; b0 += bucketElems) {
      const size_t len = std::min(bucketElems, n - b0);
      const size_t chunks = (len + chunk - 1) / chunk;
      size_t k = static_cast<uint64_t>(s) < warmup
                     ? chunks
                     : std::clamp<size_t>(static_cast<size_t>(std::ceil(density * double(chunks))),
                                          1, chunks);
      std::vector<std::pair<double, size_t>> norms;
      for (size_t c = 0; c < chunks; ++c) {
        double norm = 0;
        for (int r = 0; r < ranks; ++r) {
          for (size_t i = b0 + c * chunk; i < std::min(b0 + len, b0 + (c + 1) * chunk); ++i) {
            norm += std::fabs(residual[r][i]);
          }
        }
        norms.emplace_back(-norm, c);
      }
      std::sort(norms.begin(), norms.end());
      for (size_t j = 0; j < k; ++j) {
        const size_t c = norms[j].second;
        for (size_t i = b0 + c * chunk; i < std::min(b0 + len, b0 + (c + 1) * chunk); ++i) {
          for (int r = 0; r < ranks; ++r) {
            out[i] += residual[r][i];
            residual[r][i] = 0;
            if (k < chunks) velocity[r][i] = 0;  // masking, unless every chunk is sent
          }
        }
      }
    }
    return out;
  }
};

struct CscCase {
  double density;
  float momentum;
  uint64_t warmup;
};

class CscExact : public ::testing::TestWithParam<CscCase> {};

TEST_P(CscExact, MatchesTheReferenceStepByStep) {
  const CscCase p = GetParam();
  const int ranks = 3, steps = 5;
  // Four float32 tensors, 4096 elements in all; 8 KiB buckets (2048 floats)
  // of 64-element chunks. Gradients are views into one buffer per rank.
  const std::vector<size_t> sizes = {1000, 1048, 1500, 548};
  const size_t n = 4096, chunk = 64;
  Reference ref(ranks, n, chunk, 2048, p.density, p.warmup, p.momentum);
  std::vector<std::vector<double>> expected;
  for (int s = 0; s < steps; ++s) expected.push_back(ref.step(s));
  testing::runRanks(ranks, [&](Communicator& c) {
    std::vector<float> flat(n);
    std::vector<Tensor> t;
    size_t at = 0;
    for (size_t sz : sizes) {
      t.push_back(tensor(flat.data() + at, sz));
      at += sz;
    }
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    // CSC plans buckets of threshold / density bytes: two buckets of 8 KiB.
    o.fusionThreshold = static_cast<uint64_t>(2048 * 4 * p.density);
    o.cycleTime = milliseconds(0);
    o.sparse.density = p.density;
    o.sparse.chunk = chunk;
    o.sparse.momentum = p.momentum;
    o.sparse.warmupSteps = p.warmup;
    GradientReducer r(borrow(c), t, o);
    ASSERT_EQ(r.buckets().size(), 2u);
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < n; ++i) flat[i] = grad(c.rank(), s, i);
      for (size_t i = t.size(); i-- > 0;) r.ready(i);
      r.wait();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(flat[i], static_cast<float>(expected[s][i]))
            << "rank " << c.rank() << " step " << s << " element " << i;
      }
    }
    const ReducerStats st = r.stats();
    EXPECT_EQ(st.sparseChunks, uint64_t(steps) * 64);
    if (p.density == 1.0) {
      EXPECT_EQ(st.sparseChunksSent, st.sparseChunks);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(, CscExact,
                         ::testing::Values(CscCase{0.1, 0, 0}, CscCase{0.25, 0, 2},
                                           CscCase{1.0, 0, 0}, CscCase{0.1, 0.5f, 1}),
                         [](const ::testing::TestParamInfo<CscCase>& i) {
                           return "d" + std::to_string(int(i.param.density * 100)) + "_m" +
                                  std::to_string(int(i.param.momentum * 10)) + "_w" +
                                  std::to_string(i.param.warmup);
                         });

TEST(Csc, TenPercentSendsAtMostTwelvePercentOfTheBytes) {
  Options base;
  base.algorithm = "ring";  // TCP: per-peer byte counters
  testing::runRanks(
      4,
      [](Communicator& c) {
        std::vector<float> g(1 << 18);
        auto run = [&](double density, DataType wire) {
          ReducerOptions o;
          o.fusionThreshold = 1 << 20;
          o.sparse.density = density;
          o.sparse.chunk = 256;
          o.wire = wire;
          GradientReducer r(borrow(c), {tensor(g.data(), g.size())}, o);
          const uint64_t before = r.communicator().stats().bytesSent();
          for (int s = 0; s < 3; ++s) {
            for (size_t i = 0; i < g.size(); ++i) g[i] = grad(c.rank(), s, i);
            r.ready(0);
            r.wait();
          }
          return r.communicator().stats().bytesSent() - before;
        };
        const double dense = double(run(0.0, DataType::kFloat32));
        const double csc = double(run(0.1, DataType::kFloat32));
        const double csc16 = double(run(0.1, DataType::kFloat16));
        EXPECT_LE(csc / dense, 0.12) << csc << " / " << dense;
        EXPECT_LE(csc16 / dense, 0.07) << csc16 << " / " << dense;
      },
      base);
}

TEST(ReducerCompression, Float16WireWithinBoundAndNonFiniteReported) {
  testing::runRanks(3, [](Communicator& c) {
    std::vector<float> a(3000), b(77);
    std::vector<int32_t> ints(50, c.rank() + 1);
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.wire = DataType::kFloat16;
    o.fusionThreshold = 4096;
    GradientReducer r(
        borrow(c),
        {tensor(a.data(), a.size()), Tensor(ints.data(), ints.size(), DataType::kInt32),
         tensor(b.data(), b.size())},
        o);
    for (size_t i = 0; i < a.size(); ++i) a[i] = 0.001f * float(i) + float(c.rank());
    for (size_t i = 0; i < b.size(); ++i) b[i] = -0.5f * float(i);
    for (size_t i = 0; i < 3; ++i) r.ready(i);
    r.wait();
    EXPECT_FALSE(r.nonFinite());
    const double u = std::ldexp(1.0, -11);
    for (size_t i = 0; i < a.size(); ++i) {
      const double exact = 3 * 0.001 * double(i) + 3.0;
      ASSERT_LE(std::fabs(a[i] - exact), 4 * u * exact + 1e-4) << i;
    }
    EXPECT_EQ(b[76], -0.5f * 76 * 3);
    EXPECT_EQ(ints[49], 6);  // int32 travels as int32, exactly
    // Overflow of the wire type: reported on every rank.
    std::fill(a.begin(), a.end(), 40000.0f);
    for (size_t i = 0; i < 3; ++i) r.ready(i);
    r.wait();
    EXPECT_TRUE(r.nonFinite());
  });
}

TEST(ReducerCompression, CscWithCycleTimeRoundsAndFloat16) {
  // Negotiated rounds cut different buckets than fixed ones; CSC must still
  // send each element's accumulated value exactly once: with density 1 and
  // integer gradients the result is the exact sum.
  testing::runRanks(3, [](Communicator& c) {
    std::vector<std::vector<float>> g(6, std::vector<float>(700));
    std::vector<Tensor> t;
    for (auto& v : g) t.push_back(tensor(v.data(), v.size()));
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.cycleTime = milliseconds(1);
    o.fusionThreshold = 3000;
    o.wire = DataType::kFloat16;
    o.sparse.density = 1.0;
    o.sparse.chunk = 100;
    GradientReducer r(borrow(c), t, o);
    for (int s = 0; s < 3; ++s) {
      for (size_t k = 0; k < g.size(); ++k) {
        for (size_t i = 0; i < 700; ++i) g[k][i] = grad(c.rank(), s, k * 700 + i);
      }
      for (size_t k = 0; k < g.size(); ++k) r.ready(c.rank() == 1 ? g.size() - 1 - k : k);
      r.wait();
      for (size_t k = 0; k < g.size(); ++k) {
        for (size_t i = 0; i < 700; ++i) {
          float want = 0;
          for (int q = 0; q < 3; ++q) want += grad(q, s, k * 700 + i);
          ASSERT_EQ(g[k][i], want) << "step " << s << " tensor " << k << " element " << i;
        }
      }
    }
  });
}

TEST(ReducerCompression, AStepWithInfClearsTheCscResidual) {
  testing::runRanks(2, [](Communicator& c) {
    std::vector<float> g(1000);
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.sparse.density = 0.1;
    o.sparse.chunk = 100;
    GradientReducer r(borrow(c), {tensor(g.data(), g.size())}, o);
    // Step 0: chunk 3 is the largest and carries an inf on rank 1; the other
    // chunks stay in the residual.
    for (size_t i = 0; i < g.size(); ++i) g[i] = float(i / 100 + 1);
    if (c.rank() == 1) g[350] = INFINITY;
    r.ready(0);
    r.wait();
    EXPECT_TRUE(r.nonFinite());
    // Step 1: had the residual been kept, chunk 9 (10 + 10 from step 0, plus
    // this step's 1) would win; cleared, the winner is this step's largest.
    for (size_t i = 0; i < g.size(); ++i) g[i] = i / 100 == 4 ? 5.0f : 1.0f;
    r.ready(0);
    r.wait();
    EXPECT_FALSE(r.nonFinite());
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], i / 100 == 4 ? 10.0f : 0.0f) << i;
  });
}

TEST(ReducerCompression, AvgOnAFloat16WireDoesNotOverflowWhenTheSumWould) {
  testing::runRanks(4, [](Communicator& c) {
    std::vector<float> g(500, 20000.0f);  // sum 80000 > 65504, avg 20000
    ReducerOptions o;
    o.op = ReduceOp::kAvg;
    o.wire = DataType::kFloat16;
    GradientReducer r(borrow(c), {tensor(g.data(), g.size())}, o);
    r.ready(0);
    r.wait();
    EXPECT_FALSE(r.nonFinite());
    EXPECT_EQ(g[499], 20000.0f);
    std::vector<float> v(10, 20000.0f);
    AllreduceOptions ao;
    ao.op = ReduceOp::kAvg;
    ao.wire = DataType::kFloat16;
    EXPECT_FALSE(c.allreduce(tensor(v.data(), v.size()), ao).nonFinite);
    EXPECT_EQ(v[9], 20000.0f);
  });
}

TEST(ReducerCompression, DifferentSettingsAcrossRanksAreAMismatch) {
  auto errs = testing::runRanksCollect(2, [](Communicator& c) {
    std::vector<float> a(100);
    ReducerOptions o;
    o.sparse.density = c.rank() == 0 ? 0.1 : 0.2;
    GradientReducer r(borrow(c), {tensor(a.data(), a.size())}, o);
  });
  for (auto& e : errs) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kMismatch);
      EXPECT_NE(std::string(err.what()).find("wire/CSC settings"), std::string::npos) << err.what();
    }
  }
}

}  // namespace
}  // namespace gflow
