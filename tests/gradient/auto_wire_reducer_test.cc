// GradientReducer with the automatic wire (ReducerOptions::autoWire,
// GFLOW_WIRE=auto), and WireChooser, ranks as threads: the schedule (dense warm-up, a probe
// of every candidate, decisions), the same wire for every bucket on every
// rank in every step, results bitwise identical and within the bound of the
// step's wire against a float64 reference, the inf/NaN guard, and the
// settings that are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "gflow/gflow.h"
#include "gflow/reducer.h"
#include "testing/ranks.h"
#include "testing/scoped_env.h"

namespace gflow {
namespace {

std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

const std::vector<size_t> kSizes = {3, 200, 5000, 70, 129, 700, 3000};

float input(int rank, int step, size_t t, size_t i) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000003 + step * 7919 + t * 131 + i));
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
}

// |error| of one averaged value with |inputs| <= 1 on `wire` (N ranks),
// docs/compression.md. A quantized step also delivers the residual of the
// last quantized step, which may have been on the coarser qint4: at most
// one qint4 step per rank.
double bound(DataType wire, int n) {
  if (wire == DataType::kFloat32) return 1e-6;
  if (wire == DataType::kFloat16) return n * std::ldexp(1.0, -10);
  if (wire == DataType::kBFloat16) return n * std::ldexp(1.0, -7);
  auto h = [](double q) { return 1.0 / (2 * q) + std::ldexp(1.0, -20); };
  const double here = h(wire == DataType::kQInt8 ? 127.0 : 7.0);
  return n * (here + h(7.0)) / (1 - (n - 1) * here);
}

ReducerOptions autoOptions() {
  ReducerOptions o;
  o.fusionThreshold = 4096;  // several buckets, one of the int tensor
  o.autoWire.enabled = true;
  o.autoWire.candidates = {DataType::kFloat32, DataType::kBFloat16, DataType::kQInt8,
                           DataType::kQInt4};
  o.autoWire.warmupSteps = 2;
  o.autoWire.probeSteps = 1;
  o.autoWire.period = 2;
  o.autoWire.reprobe = 1;  // probe, decide, probe, ...: every wire every few steps
  return o;
}

struct Grads {
  std::vector<std::vector<float>> f;
  std::vector<int32_t> ints = std::vector<int32_t>(10);
  Grads() {
    for (size_t n : kSizes) f.emplace_back(n);
  }
  std::vector<Tensor> tensors() {
    std::vector<Tensor> t;
    for (auto& v : f) t.push_back(tensor(v.data(), v.size()));
    t.push_back(tensor(ints.data(), ints.size()));
    return t;
  }
  void fill(int rank, int step) {
    for (size_t t = 0; t < f.size(); ++t) {
      for (size_t i = 0; i < f[t].size(); ++i) f[t][i] = input(rank, step, t, i);
    }
    std::fill(ints.begin(), ints.end(), 3 * rank);
  }
};

TEST(AutoWireReducer, EveryRankTakesTheSameWiresAndEveryStepIsWithinItsWiresBound) {
  constexpr int kRanks = 3, kSteps = 16;
  // [rank][step]: the wires of the step and its results.
  std::vector<std::vector<std::vector<DataType>>> wires(kRanks);
  std::vector<std::vector<std::vector<std::vector<float>>>> results(kRanks);
  testing::runRanks(kRanks, [&](Communicator& c) {
    Grads g;
    GradientReducer red(borrow(c), g.tensors(), autoOptions());
    const auto buckets = red.buckets();
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<DataType> w = red.wires();
      ASSERT_EQ(w.size(), buckets.size());
      wires[c.rank()].push_back(w);
      g.fill(c.rank(), step);
      for (size_t k = g.f.size() + 1; k-- > 0;) red.ready(k);  // reverse, as backward
      red.wait();
      EXPECT_FALSE(red.nonFinite());
      EXPECT_EQ(g.ints[9], 3);  // (0 + 3 + 6) / 3, exact on its own bucket
      for (size_t b = 0; b < buckets.size(); ++b) {
        for (size_t t : buckets[b]) {
          if (t >= g.f.size()) continue;
          for (size_t i = 0; i < g.f[t].size(); ++i) {
            double exact = 0;
            for (int r = 0; r < kRanks; ++r) exact += input(r, step, t, i);
            exact /= kRanks;
            ASSERT_LE(std::fabs(g.f[t][i] - exact), bound(w[b], kRanks))
                << "step " << step << " wire " << toString(w[b]) << " tensor " << t;
          }
        }
      }
      results[c.rank()].push_back(g.f);
    }
    EXPECT_GT(red.stats().wireChanges, 0u);
  });
  for (int r = 1; r < kRanks; ++r) {
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_EQ(wires[r][step], wires[0][step]) << "rank " << r << " step " << step;
      for (size_t t = 0; t < kSizes.size(); ++t) {
        ASSERT_EQ(std::memcmp(results[r][step][t].data(), results[0][step][t].data(),
                              kSizes[t] * sizeof(float)),
                  0)
            << "rank " << r << " step " << step << " tensor " << t;
      }
    }
  }
  // Warm-up (1 step, then the probe's float32 stage), then one step on each
  // other candidate; the int32 bucket travels as itself.
  const std::vector<DataType> probe = {DataType::kFloat32, DataType::kFloat32, DataType::kBFloat16,
                                       DataType::kQInt8, DataType::kQInt4};
  for (size_t step = 0; step < probe.size(); ++step) {
    for (DataType w : wires[0][step]) {
      if (w != DataType::kInt32) {
        EXPECT_EQ(w, probe[step]) << "step " << step;
      }
    }
  }
  EXPECT_NE(std::count(wires[0].back().begin(), wires[0].back().end(), DataType::kInt32), 0);
}

TEST(AutoWireReducer, AnInfOrNaNStepWidensEveryLossyBucketOnEveryRank) {
  constexpr int kRanks = 2;
  testing::runRanks(kRanks, [&](Communicator& c) {
    Grads g;
    ReducerOptions o = autoOptions();
    o.autoWire.reprobe = 0;
    GradientReducer red(borrow(c), g.tensors(), o);
    for (int step = 0; step < 7; ++step) {
      const std::vector<DataType> w = red.wires();
      g.fill(c.rank(), step);
      if (step == 3 && c.rank() == 1) g.f[2][17] = INFINITY;  // the qint8 probe step
      for (size_t k = 0; k <= g.f.size(); ++k) red.ready(k);
      red.wait();
      EXPECT_EQ(red.nonFinite(), step == 3);
      // Step 3 widened every bucket to bfloat16 and capped it there, so
      // the qint4 probe stage (step 4) and the steps after stay bfloat16 or
      // wider (the cap holds for 3 decisions).
      for (size_t b = 0; b < w.size() && step >= 4; ++b) {
        if (w[b] == DataType::kInt32) continue;
        if (step == 4) {
          EXPECT_EQ(w[b], DataType::kBFloat16) << "bucket " << b;
        }
        EXPECT_FALSE(isQuantized(w[b])) << "step " << step << " bucket " << b;
      }
    }
  });
}

TEST(AutoWireReducer, GFLOW_WIRE_AutoTurnsItOnAndAnExplicitWireWins) {
  testing::ScopedEnv env("GFLOW_WIRE", "auto");
  testing::ScopedEnv warm("GFLOW_WIRE_AUTO_WARMUP", "3");
  testing::runRanks(2, [&](Communicator& c) {
    std::vector<float> a(300);
    GradientReducer red(borrow(c), {tensor(a.data(), a.size())});
    for (int step = 0; step < 3; ++step) {
      EXPECT_EQ(red.wires(), std::vector<DataType>{DataType::kFloat32});
      red.ready(0);
      red.wait();
    }
    EXPECT_EQ(red.wires(), std::vector<DataType>{DataType::kBFloat16});  // the default list's
    ReducerOptions o;
    o.wire = DataType::kQInt8;
    GradientReducer fixed(borrow(c), {tensor(a.data(), a.size())}, o);
    EXPECT_EQ(fixed.wires(), std::vector<DataType>{DataType::kQInt8});
  });
}

TEST(AutoWireReducer, GFLOW_WIRE_AUTO_CANDIDATESIsAListOfWireNames) {
  ReducerOptions o;
  o.autoWire.enabled = true;
  o.autoWire.warmupSteps = 0;
  o.autoWire.probeSteps = 1;
  {  // the environment is the process's: set outside the rank threads
    testing::ScopedEnv env("GFLOW_WIRE_AUTO_CANDIDATES", " float32 , qint8");
    testing::runRanks(2, [&](Communicator& c) {
      std::vector<float> a(300);
      GradientReducer red(borrow(c), {tensor(a.data(), a.size())}, o);
      red.ready(0);
      red.wait();
      EXPECT_EQ(red.wires(), std::vector<DataType>{DataType::kQInt8});  // the probe's 2nd stage
    });
  }
  testing::ScopedEnv env("GFLOW_WIRE_AUTO_CANDIDATES", "float32,qint3");
  testing::runRanks(2, [&](Communicator& c) {
    std::vector<float> a(300);
    try {
      GradientReducer red(borrow(c), {tensor(a.data(), a.size())}, o);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("GFLOW_WIRE_AUTO_CANDIDATES='float32,qint3'"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(AutoWireReducer, SettingsItCannotHonourAreRefusedOnEveryRank) {
  struct Case {
    const char* what;
    std::function<void(ReducerOptions&)> set;
  };
  const std::vector<Case> cases = {
      {"cycle time", [](ReducerOptions& o) { o.cycleTime = std::chrono::milliseconds(5); }},
      {"CSC", [](ReducerOptions& o) { o.sparse.density = 0.1; }},
      {"both set", [](ReducerOptions& o) { o.wire = DataType::kQInt8; }},
      {"widest first",
       [](ReducerOptions& o) {
         o.autoWire.candidates = {DataType::kQInt8, DataType::kFloat16};
       }},
      {"float32, float16", [](ReducerOptions& o) { o.autoWire.candidates = {DataType::kInt32}; }},
      {"listed twice",
       [](ReducerOptions& o) {
         o.autoWire.candidates = {DataType::kQInt8, DataType::kQInt8};
       }},
      {"does not apply", [](ReducerOptions& o) { o.op = ReduceOp::kProd; }},
      {"period must be", [](ReducerOptions& o) { o.autoWire.period = 0; }},
  };
  for (const Case& k : cases) {
    testing::runRanks(2, [&](Communicator& c) {
      std::vector<float> a(300);
      ReducerOptions o;
      o.autoWire.enabled = true;
      k.set(o);
      try {
        GradientReducer red(borrow(c), {tensor(a.data(), a.size())}, o);
        ADD_FAILURE() << k.what << ": no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
        EXPECT_NE(std::string(e.what()).find(k.what), std::string::npos) << e.what();
      }
    });
  }
}

TEST(AutoWireReducer, RanksThatDisagreeOnTheAutomaticWireAreAMismatch) {
  testing::runRanks(2, [&](Communicator& c) {
    std::vector<float> a(300);
    ReducerOptions o;
    o.autoWire.enabled = c.rank() == 0;
    try {
      GradientReducer red(borrow(c), {tensor(a.data(), a.size())}, o);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
    }
  });
}

// WireChooser: the same schedule and agreement for callers that issue each
// bucket's allreduce themselves (gflow.torch's auto hook), here with
// Communicator::allreduce(AllreduceOptions) and a residual per bucket.
TEST(WireChooserTest, RanksIssuingTheirOwnAllreducesGetTheSameWiresAndTheGuard) {
  constexpr int kRanks = 2, kSteps = 10;
  std::vector<std::vector<std::vector<DataType>>> wires(kRanks);
  testing::runRanks(kRanks, [&](Communicator& c) {
    AutoWireOptions o = autoOptions().autoWire;
    o.reprobe = 0;
    WireChooser chooser(borrow(c), 3, o, {"a", "b", "c"});
    std::vector<std::vector<float>> x(3, std::vector<float>(1000)), r(3);
    for (auto& v : r) v.assign(1000, 0.0f);
    for (int step = 0; step < kSteps; ++step) {
      wires[c.rank()].push_back(chooser.wires());
      bool nonFinite = false;
      for (size_t b = 0; b < 3; ++b) {
        for (size_t i = 0; i < 1000; ++i) x[b][i] = input(c.rank(), step, b, i);
        if (step == 3 && b == 1 && c.rank() == 1) x[b][7] = NAN;  // the qint8 stage
        AllreduceOptions a;
        a.op = ReduceOp::kAvg;
        a.wire = chooser.wire(b);
        if (isQuantized(a.wire)) a.residual = tensor(r[b].data(), 1000);
        chooser.ready(b);
        nonFinite = c.allreduce(tensor(x[b].data(), 1000), a).nonFinite || nonFinite;
        chooser.done(b);
      }
      EXPECT_EQ(nonFinite, step == 3);
      chooser.finishStep(nonFinite, [&] { return std::vector<double>{0.1, 0.1, 0.1}; });
    }
    EXPECT_EQ(chooser.steps(), static_cast<uint64_t>(kSteps));
    EXPECT_THROW(chooser.ready(3), Error);
  });
  EXPECT_EQ(wires[1], wires[0]);
  // The probe, whose qint4 stage (step 4) the NaN at step 3 capped at
  // bfloat16, as every step after it (for 3 decisions).
  const std::vector<DataType> probe = {DataType::kFloat32, DataType::kFloat32, DataType::kBFloat16,
                                       DataType::kQInt8, DataType::kBFloat16};
  for (size_t step = 0; step < probe.size(); ++step) {
    EXPECT_EQ(wires[0][step], std::vector<DataType>(3, probe[step])) << "step " << step;
  }
  for (size_t step = 5; step < 8; ++step) {
    for (DataType w : wires[0][step]) EXPECT_FALSE(isQuantized(w)) << "step " << step;
  }
}

TEST(WireChooserTest, BadArgumentsAreInvalidArgument) {
  testing::runRanks(1, [&](Communicator& c) {
    AutoWireOptions o;
    o.candidates = {DataType::kQInt4, DataType::kFloat32};
    EXPECT_THROW(WireChooser(borrow(c), 2, o), Error);
    EXPECT_THROW(WireChooser(borrow(c), 2, {}, {"only one"}), Error);
    EXPECT_THROW(WireChooser(nullptr, 2), Error);
  });
}

}  // namespace
}  // namespace gflow
