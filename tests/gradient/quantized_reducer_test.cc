// GradientReducer with a quantized wire (qint8, qint4): fixed buckets and
// cycle-time rounds over tensors of every size (tiny ones whose bucket is
// smaller than one block included), every rank the same bits, within the
// bound of docs/compression.md; error feedback carries what quantizing lost
// into the next step, per tensor, across buckets whose blocks straddle
// tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "gflow/gflow.h"
#include "gflow/reducer.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

double quantMax(DataType wire) {
  return wire == DataType::kQInt8 ? 127.0 : 7.0;
}

const std::vector<size_t> kSizes = {3, 1, 200, 5000, 70, 129, 2, 700};

struct Grads {
  std::vector<std::vector<float>> f;
  std::vector<int32_t> ints = std::vector<int32_t>(10);
  std::vector<Tensor> tensors() {
    std::vector<Tensor> t;
    for (auto& v : f) t.push_back(tensor(v.data(), v.size()));
    t.push_back(tensor(ints.data(), ints.size()));  // travels dense
    return t;
  }
};

float input(int rank, int step, size_t t, size_t i) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000003 + step * 7919 + t * 131 + i));
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
}

struct Mode {
  DataType wire;
  int cycleMs;  // 0: fixed buckets
};

class QuantizedReducerModes : public ::testing::TestWithParam<Mode> {};

TEST_P(QuantizedReducerModes, WithinTheBoundAndBitwiseIdenticalOnEveryRank) {
  const Mode m = GetParam();
  constexpr int kRanks = 3, kSteps = 4;
  std::vector<std::vector<std::vector<float>>> results(kRanks);
  testing::runRanks(kRanks, [&](Communicator& c) {
    Grads g;
    for (size_t n : kSizes) g.f.emplace_back(n);
    ReducerOptions o;
    o.wire = m.wire;
    o.fusionThreshold = 1024;  // several buckets, some smaller than a block
    o.cycleTime = std::chrono::milliseconds(m.cycleMs);
    GradientReducer red(borrow(c), g.tensors(), o);
    for (int step = 0; step < kSteps; ++step) {
      for (size_t t = 0; t < g.f.size(); ++t) {
        for (size_t i = 0; i < g.f[t].size(); ++i) g.f[t][i] = input(c.rank(), step, t, i);
      }
      std::fill(g.ints.begin(), g.ints.end(), 3 * c.rank());
      for (size_t k = g.f.size() + 1; k-- > 0;) red.ready(k);  // reverse order, as backward
      red.wait();
      EXPECT_FALSE(red.nonFinite());
      EXPECT_EQ(g.ints[9], 3);  // (0 + 3 + 6) / 3: exact
      // |x| <= 1: A <= 1 for every block; the residuals carried in add at
      // most one more quantization step per rank (docs/compression.md).
      const double h = 1.0 / (2 * quantMax(m.wire)) + std::ldexp(1.0, -20);
      const double bound = 2 * kRanks * h / (1 - (kRanks - 1) * h);
      for (size_t t = 0; t < g.f.size(); ++t) {
        for (size_t i = 0; i < g.f[t].size(); ++i) {
          double exact = 0;
          for (int r = 0; r < kRanks; ++r) exact += input(r, step, t, i);
          exact /= kRanks;
          ASSERT_LE(std::fabs(g.f[t][i] - exact), bound) << "tensor " << t << " element " << i;
        }
      }
      if (step == kSteps - 1) results[c.rank()] = g.f;
    }
  });
  for (int r = 1; r < kRanks; ++r) {
    for (size_t t = 0; t < kSizes.size(); ++t) {
      ASSERT_EQ(std::memcmp(results[r][t].data(), results[0][t].data(), kSizes[t] * 4), 0)
          << "rank " << r << " tensor " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, QuantizedReducerModes,
                         ::testing::Values(Mode{DataType::kQInt8, 0}, Mode{DataType::kQInt4, 0},
                                           Mode{DataType::kQInt8, 5}, Mode{DataType::kQInt4, 5}),
                         [](const ::testing::TestParamInfo<Mode>& i) {
                           return std::string(toString(i.param.wire)) +
                                  (i.param.cycleMs ? "_cycle" : "_fixed");
                         });

// One rank (no inner nodes): with feedback the results of T steps add up to
// T times the gradients within one quantization step, in every tensor of
// a fused bucket; without it the error grows with T.
TEST(QuantizedReducer, ErrorFeedbackKeepsTheSumOverStepsExact) {
  testing::runRanks(1, [](Communicator& c) {
    constexpr int kSteps = 40;
    for (bool feedback : {true, false}) {
      Grads g;
      for (size_t n : {100, 150, 90}) g.f.emplace_back(n);  // one bucket; blocks straddle tensors
      ReducerOptions o;
      o.wire = DataType::kQInt4;
      o.errorFeedback = feedback;
      GradientReducer red(borrow(c), g.tensors(), o);
      std::vector<std::vector<double>> sums(g.f.size());
      double worst = 0;
      for (int step = 0; step < kSteps; ++step) {
        for (size_t t = 0; t < g.f.size(); ++t) {
          for (size_t i = 0; i < g.f[t].size(); ++i) g.f[t][i] = i == 0 ? 1.0f : 0.3f;
          sums[t].resize(g.f[t].size());
        }
        for (size_t k = 0; k <= g.f.size(); ++k) red.ready(k);
        red.wait();
        for (size_t t = 0; t < g.f.size(); ++t) {
          for (size_t i = 0; i < g.f[t].size(); ++i) sums[t][i] += g.f[t][i];
        }
      }
      for (size_t t = 0; t < g.f.size(); ++t) {
        for (size_t i = 0; i < g.f[t].size(); ++i) {
          const double exact = kSteps * (i == 0 ? 1.0 : 0.3);
          worst = std::max(worst, std::fabs(sums[t][i] - exact));
        }
      }
      if (feedback) {
        EXPECT_LE(worst, 1.0 / 7);
      } else {
        EXPECT_GT(worst, 2.0 / 7);
      }
    }
  });
}

TEST(QuantizedReducer, ProdOnAQuantizedWireIsRefused) {
  const auto outcomes = testing::runRanksOutcomes(2, [](Communicator& c) {
    std::vector<float> v(10);
    ReducerOptions o;
    o.wire = DataType::kQInt8;
    o.op = ReduceOp::kProd;
    GradientReducer red(borrow(c), {tensor(v.data(), v.size())}, o);
  });
  for (const testing::Outcome& o : outcomes) {
    EXPECT_EQ(o.code, ErrorCode::kInvalidArgument) << o.what;
    EXPECT_NE(o.what.find("prod does not apply to a qint8 wire"), std::string::npos) << o.what;
  }
}

}  // namespace
}  // namespace gflow
