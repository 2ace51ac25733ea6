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
  refused("gflow-model 3 alpha=1 beta=1 gamma=1", "not a gflow cost model");
  refused("gflow-model 2 alpha=1 beta=1 gamma=1", "local_alpha= and local_beta= come with");
  refused("gflow-model 1 alpha=1 beta=1 gamma=1 local_alpha=1 local_beta=1", "come with version 2");
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

constexpr double kLA = 2e-6, kLB = 0.1e-9;  // shared memory: 2 us, 10 GB/s

CostModel::Params withLocal() {
  CostModel::Params p{kA, kB, kG};
  p.hasLocal = true;
  p.localAlpha = kLA;
  p.localBeta = kLB;
  return p;
}

// H hosts of L ranks: a step between partners on one host costs the local
// parameters, one across hosts L beta (the host's L ranks share its NIC);
// the ring leaves each host by one edge.
TEST(CostModel, RanksThatShareAHostShareItsNic) {
  const CostModel m(withLocal());
  const double n = 1 << 20;
  const CostModel::Layout l{4, 2};  // 8 ranks
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kRecursiveDoubling, 1 << 20, l),
                   (kLA + n * (kLB + kG)) + 2 * (kA + n * (2 * kB + kG)));
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kHalvingDoubling, 1 << 20, l),
                   (2 * kLA + n / 2 * (2 * kLB + kG)) + (2 * kA + n / 4 * (4 * kB + kG)) +
                       (2 * kA + n / 8 * (4 * kB + kG)));
  EXPECT_DOUBLE_EQ(m.predict(Algorithm::kRing, 1 << 20, l),
                   m.predict(Algorithm::kRing, 1 << 20, 8));
  // One rank per host: the flat forms.
  for (Algorithm a : CostModel::algorithms()) {
    EXPECT_DOUBLE_EQ(m.predict(a, 1 << 20, CostModel::Layout{8, 1}), m.predict(a, 1 << 20, 8));
  }
}

TEST(CostModel, TheHierarchicalCompositionIsLocalPhasesAndASharedCrossPhase) {
  const CostModel m(withLocal());
  const double n = 1 << 20;
  const CostModel::Layout l{4, 2};
  // One segment: the local reduce-scatter and allgather, then 2 allreduces
  // of n/2 across 4 hosts through one NIC each (the fastest form, 2 beta).
  const double local = 2 * kLA + n / 2 * (2 * kLB + kG);
  const CostModel shared({kA, 2 * kB, kG});
  double cross = 1e9;
  for (Algorithm a : CostModel::algorithms())
    cross = std::min(cross, shared.predict(a, 1 << 19, 4));
  EXPECT_DOUBLE_EQ(m.predictHierarchical(1 << 20, l, 8 << 20), local + cross);
  // Four segments overlap: the slower phase sets the pace after the first.
  const double localSeg = 2 * kLA + n / 8 * (2 * kLB + kG);
  double crossSeg = 1e9;
  for (Algorithm a : CostModel::algorithms()) {
    crossSeg = std::min(crossSeg, shared.predict(a, 1 << 17, 4));
  }
  EXPECT_DOUBLE_EQ(m.predictHierarchical(1 << 20, l, 256 << 10),
                   localSeg + crossSeg + 3 * std::max(localSeg, crossSeg));
  // Without local parameters, or on one host, there is none.
  EXPECT_TRUE(std::isinf(CostModel({kA, kB, kG}).predictHierarchical(1 << 20, l, 8 << 20)));
  EXPECT_TRUE(std::isinf(m.predictHierarchical(1 << 20, CostModel::Layout{1, 8}, 8 << 20)));
  EXPECT_FALSE(CostModel({kA, kB, kG}).fastest(1 << 20, l, 8 << 20).hierarchical);
}

TEST(CostModel, LocalParametersAreFittedAndReadBack) {
  const CostModel truth(withLocal());
  std::vector<CostModel::Sample> s;
  for (int L : {2, 4, 8}) {
    for (uint64_t b = 4 << 10; b <= (16u << 20); b *= 4) {
      const double Ld = L, n = static_cast<double>(b);
      s.push_back(
          {Algorithm::kAuto, b, L, 2 * (Ld - 1) * kLA + (Ld - 1) / Ld * n * (2 * kLB + kG)});
    }
  }
  const CostModel fitted = CostModel({kA, kB, kG}).withLocal(s);
  EXPECT_TRUE(fitted.params().hasLocal);
  EXPECT_NEAR(fitted.params().localAlpha, kLA, kLA * 1e-6);
  EXPECT_NEAR(fitted.params().localBeta, kLB, kLB * 1e-6);
  EXPECT_DOUBLE_EQ(fitted.params().alpha, kA);  // the rest is kept
  const CostModel back = CostModel::parse(fitted.text(), "test");
  EXPECT_TRUE(back.params().hasLocal);
  EXPECT_NEAR(back.params().localBeta, kLB, kLB * 1e-6);
  EXPECT_THROW(CostModel({kA, kB, kG}).withLocal({s[0]}), Error);
}

Route allreduceRoute(const RoutePolicy& p, uint64_t bytes, int ranks,
                     const Capabilities& caps = Capabilities{}) {
  OpDesc d;
  d.kind = OpKind::kAllreduce;
  d.dtype = DataType::kUInt8;
  d.count = bytes;
  return p.choose(d, ranks, caps, nullptr);
}

// Across equal hosts, a model with local parameters weighs the
// hierarchical composition against the flat algorithms. On 3 hosts of 4
// (12 ranks: a fold for rd and hd, 22 ring steps) a large allreduce is
// hierarchical, and a 4 KiB one flat recursive doubling (the composition
// adds 6 local steps and a fold across 3 hosts). Without local parameters
// the composition is taken as before.
TEST(CostModel, AcrossHostsTheModelChoosesBetweenFlatAndHierarchical) {
  Capabilities caps;
  caps.hierarchical = caps.uniform = true;
  caps.segmentBytes = 8 << 20;
  const RoutePolicy byModel("", "test", {}, CostModel(withLocal()));
  caps.hosts = 3;
  caps.perHost = 4;
  EXPECT_EQ(allreduceRoute(byModel, 64u << 20, 12, caps).path, Path::kHierarchical);
  const Route small = allreduceRoute(byModel, 4 << 10, 12, caps);
  EXPECT_EQ(small.path, Path::kNetwork);
  EXPECT_EQ(small.algo, Algorithm::kRecursiveDoubling);
  caps.hosts = 4;
  caps.perHost = 2;
  const RoutePolicy flatOnly("", "test", {}, CostModel({kA, kB, kG}));
  EXPECT_EQ(allreduceRoute(flatOnly, 4 << 10, 8, caps).path, Path::kHierarchical);
  EXPECT_EQ(allreduceRoute(RoutePolicy("", "test"), 4 << 10, 8, caps).path, Path::kHierarchical);
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
