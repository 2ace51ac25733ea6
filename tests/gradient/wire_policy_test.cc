// WirePolicy (the automatic wire's decisions) on synthetic measurements:
// the schedule (warm-up, probe stages, periods, re-probes), the pick against
// a brute-force search over every assignment of wires, the trial that keeps
// a pick only when the measured step agrees, the agreement's layout (costs:
// the least any rank measured), and the guard (inf/NaN and residual growth
// widen a lossy bucket, which stays capped for a while).
#include "gradient/wire_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace gflow::gradient {
namespace {

const std::vector<DataType> kAll = {DataType::kFloat32, DataType::kBFloat16, DataType::kQInt8,
                                    DataType::kQInt4};

WirePolicyConfig config(uint64_t warmup = 4, uint64_t period = 3, uint64_t reprobe = 0) {
  WirePolicyConfig c;
  c.candidates = kAll;
  c.warmupSteps = warmup;
  c.probeSteps = 2;
  c.period = period;
  c.reprobe = reprobe;
  c.slack = 0.02;
  c.holdPeriods = 2;
  return c;
}

size_t levelOf(DataType w) {
  return static_cast<size_t>(std::find(kAll.begin(), kAll.end(), w) - kAll.begin());
}

// A step whose costs depend on each bucket's wire: cost(bucket, level).
using CostFn = std::function<double(size_t, size_t)>;
// The measured step time of an assignment (default: the simulation's model
// plus 50 ms of forward).
using StepFn = std::function<double(const std::vector<size_t>&)>;

std::vector<size_t> levels(const WirePolicy& p) {
  std::vector<size_t> out;
  for (size_t b = 0; b < p.numBuckets(); ++b) out.push_back(levelOf(p.wire(b)));
  return out;
}

double stepEnd(const std::vector<size_t>& lv, const std::vector<double>& ready, double wait,
               const CostFn& cost);

StepSample sample(const WirePolicy& p, const std::vector<double>& ready, double wait,
                  const CostFn& cost, const StepFn& real = nullptr) {
  StepSample s;
  s.ready = ready;
  s.wait = wait;
  for (size_t b = 0; b < p.numBuckets(); ++b) s.cost.push_back(cost(b, levelOf(p.wire(b))));
  s.step = real ? real(levels(p)) : 0.050 + stepEnd(levels(p), ready, wait, cost);
  return s;
}

// Steps until a decision is due, then one rank's decision (no residuals).
void runToDecision(WirePolicy& p, const std::vector<double>& ready, double wait, const CostFn& cost,
                   std::vector<double> residuals = {}, const StepFn& real = nullptr) {
  for (int guard = 0; guard < 1000 && !p.agreementDue(); ++guard) {
    p.record(sample(p, ready, wait, cost, real), false);
  }
  ASSERT_TRUE(p.agreementDue());
  p.decide(p.window(residuals));
}

// The independent reference: the step's end for `lv`, and the fastest end
// over every assignment.
double stepEnd(const std::vector<size_t>& lv, const std::vector<double>& ready, double wait,
               const CostFn& cost) {
  double t = 0;
  for (size_t b = 0; b < lv.size(); ++b) t = std::max(t, ready[b]) + cost(b, lv[b]);
  return std::max(t, wait);
}

double bestEnd(size_t buckets, const std::vector<double>& ready, double wait, const CostFn& cost) {
  double best = INFINITY;
  std::vector<size_t> lv(buckets, 0);
  for (size_t code = 0; code < static_cast<size_t>(std::pow(4, buckets)); ++code) {
    for (size_t b = 0, c = code; b < buckets; ++b, c /= 4) lv[b] = c % 4;
    best = std::min(best, stepEnd(lv, ready, wait, cost));
  }
  return best;
}

TEST(WirePolicy, WarmsUpDenseThenProbesEveryCandidateThenDecides) {
  WirePolicy p(config(/*warmup=*/4), {true, true, false});
  const CostFn cost = [](size_t, size_t) { return 0.001; };
  std::vector<DataType> seen;
  for (int step = 0; step < 10; ++step) {
    seen.push_back(p.wire(0));
    EXPECT_EQ(p.wire(1), p.wire(0));
    EXPECT_FALSE(p.agreementDue());
    p.record(sample(p, {0, 0, 0}, 0, cost), false);
  }
  // Warm-up: 4 float32 steps (the last 2 are the probe's first stage), then
  // 2 steps per candidate; the decision is due after step 9.
  const std::vector<DataType> want = {kAll[0], kAll[0], kAll[0], kAll[0], kAll[1],
                                      kAll[1], kAll[2], kAll[2], kAll[3], kAll[3]};
  EXPECT_EQ(seen, want);
  EXPECT_TRUE(p.agreementDue());
}

TEST(WirePolicy, ASlowLinkNarrowsWhatBackwardCannotHideAndKeepsEarlyBucketsWide) {
  // Costs as a 1 Gbit/s link would give them: proportional to the bytes,
  // plus a little codec time; backward makes a bucket ready every 10 ms.
  const std::vector<double> ready = {0.000, 0.010, 0.020, 0.030, 0.040};
  const double wait = 0.041;
  const double width[] = {1.0, 0.5, 0.258, 0.133};
  const CostFn cost = [&](size_t, size_t k) { return 0.020 * width[k] + (k ? 0.0005 : 0.0); };
  WirePolicy p(config(), std::vector<bool>(5, true));
  runToDecision(p, ready, wait, cost);  // the probe; then the pick's trial period
  runToDecision(p, ready, wait, cost);
  const std::vector<size_t> got = levels(p);
  const double best = bestEnd(5, ready, wait, cost);
  EXPECT_LE(stepEnd(got, ready, wait, cost), best * 1.02 + 1e-12);
  // Nothing can be widened by one level and still fit.
  for (size_t b = 0; b < got.size(); ++b) {
    if (got[b] == 0) continue;
    std::vector<size_t> wider = got;
    --wider[b];
    EXPECT_GT(stepEnd(wider, ready, wait, cost), best * 1.02) << "bucket " << b;
  }
  // Hidden behind backward: 16 bits or wider; the last one is exposed:
  // quantized. Levels never narrow from one bucket to a later one here.
  EXPECT_LE(got[0], 1u);
  EXPECT_GE(got[4], 2u);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
}

TEST(WirePolicy, AFastLinkWhereTheCodecCostsMoreKeepsFloat32) {
  const CostFn cost = [](size_t, size_t k) { return 0.001 * (1 + k); };
  WirePolicy p(config(), std::vector<bool>(3, true));
  runToDecision(p, {0, 0, 0}, 0, cost);
  EXPECT_EQ(levels(p), std::vector<size_t>(3, 0));
}

TEST(WirePolicy, APickThatTheMeasuredStepDoesNotConfirmGivesWayToTheFastestUniformWire) {
  // The simulation says: float32 on the early bucket is hidden. The
  // measured steps say otherwise (the cores are shared): any mix is slow.
  const std::vector<double> ready = {0.000, 0.030};
  const double width[] = {1.0, 0.5, 0.258, 0.133};
  const CostFn cost = [&](size_t, size_t k) { return 0.020 * width[k] + (k ? 0.0005 : 0.0); };
  const StepFn real = [&](const std::vector<size_t>& lv) {
    const bool uniform = lv[0] == lv[1];
    return uniform ? 0.100 + 0.040 * width[lv[0]] : 0.200;
  };
  WirePolicy p(config(4, 3, /*reprobe=*/2), std::vector<bool>(2, true));
  runToDecision(p, ready, 0.031, cost, {}, real);  // the probe
  const std::vector<size_t> trial = levels(p);
  ASSERT_NE(trial[0], trial[1]);  // a per-bucket pick, on trial
  runToDecision(p, ready, 0.031, cost, {}, real);
  EXPECT_EQ(levels(p), std::vector<size_t>(2, 3));  // qint4 everywhere: the fastest uniform
  runToDecision(p, ready, 0.031, cost, {}, real);   // a period; then the next probe
  runToDecision(p, ready, 0.031, cost, {}, real);
  EXPECT_EQ(levels(p), std::vector<size_t>(2, 3));  // the same pick is not tried again
}

TEST(WirePolicy, APickTheMeasuredStepConfirmsIsKept) {
  const std::vector<double> ready = {0.000, 0.030};
  const double width[] = {1.0, 0.5, 0.258, 0.133};
  const CostFn cost = [&](size_t, size_t k) { return 0.020 * width[k] + (k ? 0.0005 : 0.0); };
  WirePolicy p(config(), std::vector<bool>(2, true));
  runToDecision(p, ready, 0.031, cost);
  const std::vector<size_t> trial = levels(p);
  ASSERT_NE(trial[0], trial[1]);
  runToDecision(p, ready, 0.031, cost);
  EXPECT_EQ(levels(p), trial);
  runToDecision(p, ready, 0.031, cost);
  EXPECT_EQ(levels(p), trial);
}

TEST(WirePolicy, AgreementTakesTheLeastCostAnyRankMeasuredAndTheLatestReadiness) {
  // Rank A waited for a late peer (cost 50 ms on float32); rank B did not.
  WirePolicy a(config(), {true}), b(config(), {true});
  const CostFn slowA = [](size_t, size_t k) { return k == 0 ? 0.050 : 0.010; };
  const CostFn fastB = [](size_t, size_t k) { return k == 0 ? 0.002 : 0.010; };
  while (!a.agreementDue()) {
    a.record(sample(a, {0.001}, 0.001, slowA), false);
    b.record(sample(b, {0.003}, 0.004, fastB), false);
  }
  std::vector<double> va = a.window({}), vb = b.window({});
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) va[i] = std::max(va[i], vb[i]);
  a.decide(va);
  b.decide(va);
  EXPECT_EQ(a.wire(0), DataType::kFloat32);
  EXPECT_EQ(b.wire(0), a.wire(0));
  // ready 3 ms + float32's 2 ms, later than the 4 ms wait.
  EXPECT_NEAR(a.simulate({0}), 0.005, 1e-9);
}

TEST(WirePolicy, InfOrNaNWidensEveryLossyBucketAndCapsItForSomePeriods) {
  const CostFn cost = [](size_t, size_t k) { return 0.010 - 0.002 * k; };
  WirePolicy p(config(4, 3), {true, true, false});
  runToDecision(p, {0, 0, 0}, 0, cost);
  ASSERT_EQ(p.wire(0), DataType::kQInt4);
  const std::vector<WireChange> changes = p.record(sample(p, {0, 0, 0}, 0, cost), true);
  ASSERT_EQ(changes.size(), 2u);  // the float32-only bucket 2 is not choosable
  EXPECT_EQ(changes[0].to, DataType::kQInt8);
  EXPECT_EQ(changes[0].reason, "inf/NaN in the result");
  EXPECT_EQ(p.wire(0), DataType::kQInt8);
  EXPECT_EQ(p.wire(2), DataType::kFloat32);
  // Capped at qint8 for holdPeriods (2) calm decisions, then it narrows.
  std::vector<DataType> after;
  for (int d = 0; d < 4; ++d) {
    runToDecision(p, {0, 0, 0}, 0, cost);
    after.push_back(p.wire(0));
  }
  EXPECT_EQ(after, (std::vector<DataType>{DataType::kQInt8, DataType::kQInt8, DataType::kQInt4,
                                          DataType::kQInt4}));
}

TEST(WirePolicy, AResidualThatOutgrowsItsGradientWidensThatBucket) {
  const CostFn cost = [](size_t, size_t k) { return 0.010 - 0.002 * k; };
  WirePolicy p(config(), {true, true});
  runToDecision(p, {0, 0}, 0, cost);
  ASSERT_EQ(p.wire(1), DataType::kQInt4);
  runToDecision(p, {0, 0}, 0, cost, {0.3, 1.5});
  EXPECT_EQ(p.wire(0), DataType::kQInt4);
  EXPECT_EQ(p.wire(1), DataType::kQInt8);
}

TEST(WirePolicy, ReprobesEveryCandidateAfterReprobePeriods) {
  const CostFn cost = [](size_t, size_t k) { return 0.010 - 0.002 * k; };
  WirePolicy p(config(/*warmup=*/2, /*period=*/2, /*reprobe=*/2), {true});
  runToDecision(p, {0}, 0, cost);  // decision 1, after the first probe
  EXPECT_EQ(p.wire(0), DataType::kQInt4);
  runToDecision(p, {0}, 0, cost);  // 2
  EXPECT_EQ(p.wire(0), DataType::kQInt4);
  runToDecision(p, {0}, 0, cost);  // 3: a probe instead, from float32
  EXPECT_EQ(p.wire(0), DataType::kFloat32);
  std::vector<DataType> probe;
  while (!p.agreementDue()) {
    probe.push_back(p.wire(0));
    p.record(sample(p, {0}, 0, cost), false);
  }
  EXPECT_EQ(probe, (std::vector<DataType>{kAll[0], kAll[0], kAll[1], kAll[1], kAll[2], kAll[2],
                                          kAll[3], kAll[3]}));
}

// state() and restore(): a fresh policy that restores another's state goes
// on exactly as that one does, a rejected pick included.
TEST(WirePolicyState, ARestoredPolicyGoesOnAsTheOriginal) {
  const std::vector<double> ready = {0.000, 0.030};
  const double width[] = {1.0, 0.5, 0.258, 0.133};
  const CostFn cost = [&](size_t, size_t k) { return 0.020 * width[k] + (k ? 0.0005 : 0.0); };
  const StepFn real = [&](const std::vector<size_t>& lv) {
    return lv[0] == lv[1] ? 0.100 + 0.040 * width[lv[0]] : 0.200;
  };
  WirePolicy p(config(4, 3, /*reprobe=*/2), std::vector<bool>(2, true));
  runToDecision(p, ready, 0.031, cost, {}, real);        // the probe: a pick on trial
  runToDecision(p, ready, 0.031, cost, {}, real);        // rejected
  p.record(sample(p, ready, 0.031, cost, real), false);  // within a period
  WirePolicy q(config(4, 3, 2), std::vector<bool>(2, true));
  ASSERT_NE(q.state(), p.state());
  ASSERT_TRUE(q.restore(p.state()));
  EXPECT_EQ(q.state(), p.state());
  for (int decision = 0; decision < 4; ++decision) {
    runToDecision(p, ready, 0.031, cost, {}, real);
    runToDecision(q, ready, 0.031, cost, {}, real);
    ASSERT_EQ(levels(q), levels(p)) << decision;
    ASSERT_EQ(q.state(), p.state()) << decision;
  }
}

TEST(WirePolicyState, AStateThatDoesNotFitIsRefusedAndChangesNothing) {
  WirePolicy p(config(), std::vector<bool>(3, true));
  const CostFn cost = [](size_t, size_t) { return 0.001; };
  runToDecision(p, {0, 0, 0}, 0, cost);
  const std::vector<double> before = p.state();
  WirePolicy other(config(), std::vector<bool>(2, true));  // another bucket count
  EXPECT_FALSE(p.restore(other.state()));
  std::vector<double> cut = before;
  cut.pop_back();
  EXPECT_FALSE(p.restore(cut));
  std::vector<double> longer = before;
  longer.push_back(0);
  EXPECT_FALSE(p.restore(longer));
  std::vector<double> badLevel = before;
  badLevel[4] = 7;  // level_[0]: only 4 candidates
  EXPECT_FALSE(p.restore(badLevel));
  std::vector<double> huge = before;
  huge[3] = 1e18;  // level_'s length
  EXPECT_FALSE(p.restore(huge));
  std::vector<double> nan = before;
  nan.back() = std::nan("");  // windowSteps_... and any double field: finite only
  EXPECT_FALSE(p.restore(nan));
  EXPECT_FALSE(p.restore({}));
  EXPECT_EQ(p.state(), before);
}

}  // namespace
}  // namespace gflow::gradient
