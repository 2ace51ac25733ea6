// The cost model (backend/cost_model.h): predictions are the alpha-beta-
// gamma forms, computed here by hand; a fit recovers the parameters that
// made its samples, and is never negative; a model file reads back what
// was written and is refused, naming the field, when malformed; and a
// route policy with a model takes the algorithm it predicts fastest,
// unless a threshold that was set or a rule says otherwise.
#include "backend/cost_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include "backend/route_policy.h"
#include "gflow/error.h"

namespace gflow::backend {
namespace {

using ::testing::HasSubstr;

constexpr double kA = 20e-6, kB = 1e-9, kG = 0.25e-9;  // 20 us, 1 GB/s, 4 GB/s

TEST(CostModel, PredictionsAreTheAlphaBetaGammaForms) {
  const CostModel m({kA, kB, kG});
  const double n = 1 << 20;
  // 8 ranks: a power of two, no fold.
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kRing, 1 << 20, 8),
                   14 * kA + 2 * 7.0 / 8 * n * kB + 7.0 / 8 * n * kG);
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kRecursiveDoubling, 1 << 20, 8),
                   3 * (kA + n * kB + n * kG));
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kHalvingDoubling, 1 << 20, 8),
                   6 * kA + 2 * 7.0 / 8 * n * kB + 7.0 / 8 * n * kG);
  // 6 ranks: 4 take part, 2 fold in before and out after.
  const double fold = 2 * kA + 2 * n * kB + n * kG;
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kRecursiveDoubling, 1 << 20, 6),
                   2 * (kA + n * kB + n * kG) + fold);
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kHalvingDoubling, 1 << 20, 6),
                   4 * kA + 2 * 3.0 / 4 * n * kB + 3.0 / 4 * n * kG + fold);
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kRing, 1 << 20, 1), 0);
  EXPECT_TRUE(std::isinf(m.predict(Algorithm::kChain, 1 << 20, 8)));
}

// Latency-bound sizes take recursive doubling, bandwidth-bound ones the
// ring or halving-doubling, and where the switch lies depends on N.
TEST(CostModel, TheFastestDependsOnSizeAndWorldSize) {
  const CostModel m({kA, kB, kG});
  EXPECT_EQ(m.fastest(4 << 10, 8), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(m.fastest(64 << 20, 8), Algorithm::kHalvingDoubling);  // fewer latencies, same bytes
  EXPECT_EQ(m.fastest(64 << 20, 6), Algorithm::kRing);             // no fold
  // At 512 ranks the ring's 1022 latencies cost 20 ms: halving-doubling
  // wins where the ring would on a few ranks.
  EXPECT_EQ(m.fastest(16 << 20, 3), Algorithm::kRing);
  EXPECT_EQ(m.fastest(16 << 20, 512), Algorithm::kHalvingDoubling);
  EXPECT_EQ(m.fastest(4 << 10, 512), Algorithm::kRecursiveDoubling);
}

std::vector<CostModel::Sample> samplesOf(const CostModel& m, int ranks, double noise) {
  std::vector<CostModel::Sample> s;
  int k = 0;
  for (Algorithm a : CostModel::algorithms()) {
    for (uint64_t b = 4 << 10; b <= (16u << 20); b *= 4) {
      const double wobble = 1 + noise * ((k++ % 3) - 1);  // -noise, 0, +noise
      s.push_back({a, b, ranks, m.predict(a, b, ranks) * wobble});
    }
  }
  return s;
}

TEST(CostModel, AFitRecoversTheParametersThatMadeItsSamples) {
  const CostModel truth({kA, kB, kG});
  for (int ranks : {4, 6, 16}) {
    const CostModel::Params p = CostModel::fit(samplesOf(truth, ranks, 0)).params();
    EXPECT_NEAR(p.alpha, kA, kA * 1e-6) << ranks;
    EXPECT_NEAR(p.beta, kB, kB * 1e-6) << ranks;
    EXPECT_NEAR(p.gamma, kG, kG * 1e-6) << ranks;
  }
  // With 5% noise the fitted model still predicts within 10%.
  const CostModel noisy = CostModel::fit(samplesOf(truth, 8, 0.05));
  for (const CostModel::Sample& s : samplesOf(truth, 8, 0)) {
    EXPECT_NEAR(noisy.predict(s.algo, s.bytes, 8) / s.seconds, 1.0, 0.10);
  }
}

TEST(CostModel, AFitIsNeverNegativeAndNeedsEnoughSamples) {
  // Times that a negative gamma would fit best: gamma is 0 instead.
  std::vector<CostModel::Sample> s = samplesOf(CostModel({kA, kB, 0}), 4, 0);
  for (CostModel::Sample& x : s) {
    if (x.algo == Algorithm::kRecursiveDoubling) x.seconds *= 0.9;
  }
  const CostModel::Params p = CostModel::fit(s).params();
  EXPECT_GE(p.alpha, 0);
  EXPECT_GE(p.beta, 0);
  EXPECT_GE(p.gamma, 0);
  try {
    CostModel::fit({s[0], s[1]});
    FAIL() << "two samples fitted three parameters";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.detail(), HasSubstr("2 usable samples"));
  }
}

TEST(CostModel, AModelReadsBackAndAMalformedOneIsRefusedNamingWhatIsWrong) {
  const CostModel m({kA, kB, kG});
  const CostModel back = CostModel::parse(m.text() + " fitted_on=8\n", "test");
  EXPECT_DOUBLE_EQ(back.params().alpha, kA);
  EXPECT_DOUBLE_EQ(back.params().beta, kB);
  EXPECT_DOUBLE_EQ(back.params().gamma, kG);
  auto refused = [](const std::string& text, const std::string& what) {
    try {
      CostModel::parse(text, "GFLOW_MODEL=x");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_THAT(e.detail(), HasSubstr("GFLOW_MODEL=x")) << text;
      EXPECT_THAT(e.detail(), HasSubstr(what)) << text;
    }
  };
  refused("", "not a gflow cost model");
  refused("gflow-model 2 alpha=1 beta=1 gamma=1", "not a gflow cost model");
  refused("gflow-model 1 alpha=1 beta=1", "needs alpha=, beta= and gamma=");
  refused("gflow-model 1 alpha=-1 beta=1 gamma=1", "'alpha=-1' is not a finite number");
  refused("gflow-model 1 alpha=nan beta=1 gamma=1", "'alpha=nan'");
  refused("gflow-model 1 alpha=1 beta=1 gamma=1 delta=2", "unknown field 'delta=2'");
  try {
    CostModel::load("/nonexistent/model");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.detail(), HasSubstr("GFLOW_MODEL=/nonexistent/model: cannot read the file"));
  }
}

Route allreduceRoute(const RoutePolicy& p, uint64_t bytes, int ranks) {
  OpDesc d;
  d.kind = OpKind::kAllreduce;
  d.dtype = DataType::kUInt8;
  d.count = bytes;
  return p.choose(d, ranks, Capabilities{}, nullptr);
}

TEST(CostModel, ThePolicyTakesTheModelsFastestUnlessSetOtherwise) {
  const CostModel m({kA, kB, kG});
  const RoutePolicy byModel("", "test", {}, m);
  for (int ranks : {3, 8, 512}) {
    for (uint64_t b : {4u << 10, 1u << 20, 16u << 20, 64u << 20}) {
      EXPECT_EQ(allreduceRoute(byModel, b, ranks).algo, m.fastest(b, ranks)) << ranks << " " << b;
    }
  }
  // Without a model: the default thresholds (16 MiB on 512 ranks: ring).
  EXPECT_EQ(allreduceRoute(RoutePolicy("", "test"), 32u << 20, 512).algo, Algorithm::kRing);
  EXPECT_EQ(allreduceRoute(byModel, 32u << 20, 512).algo, Algorithm::kHalvingDoubling);
  // A threshold that was set, or a rule, decides instead.
  const RoutePolicy thresholds("", "test", {uint64_t{1}, uint64_t{2}}, m);
  EXPECT_EQ(allreduceRoute(thresholds, 4 << 10, 512).algo, Algorithm::kRing);
  const RoutePolicy rule("ring", "test", {}, m);
  EXPECT_EQ(allreduceRoute(rule, 4 << 10, 512).algo, Algorithm::kRing);
}

}  // namespace
}  // namespace gflow::backend
