// GradientReducer::rebuild: on a new communicator the reducer keeps this
// rank's error-feedback residuals (qint8 wire) and CSC residuals, so a run
// that rebuilds between steps gives the same bits as one that never does,
// and a fresh reducer (residuals lost) does not; a rebuild after a shrink
// reduces over the survivors; the automatic wire's choices carry over.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "gflow/gflow.h"
#include "gflow/reducer.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

float input(int rank, int step, size_t i) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000003 + step * 7919 + i));
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
}

// Three steps of one reducer on `comm`; `change` before step 2: 0 none,
// 1 rebuild on a split of `comm`, 2 a new reducer on it. Returns the step-2
// result.
std::vector<float> run(const std::shared_ptr<Communicator>& comm, const ReducerOptions& o,
                       int change) {
  std::vector<float> a(3000), b(700);
  auto reducer = std::make_unique<GradientReducer>(
      comm, std::vector<Tensor>{tensor(a.data(), a.size()), tensor(b.data(), b.size())}, o);
  std::shared_ptr<Communicator> next = comm;
  for (int step = 0; step < 3; ++step) {
    if (step == 2 && change > 0) {
      next = comm->split(0, comm->rank());
      if (change == 1) {
        reducer->rebuild(next);
      } else {
        reducer = std::make_unique<GradientReducer>(
            next, std::vector<Tensor>{tensor(a.data(), a.size()), tensor(b.data(), b.size())}, o);
      }
    }
    for (size_t i = 0; i < a.size(); ++i) a[i] = input(comm->rank(), step, i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = input(comm->rank(), step, 5000 + i);
    reducer->ready(1);
    reducer->ready(0);
    reducer->wait();
  }
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class ReducerRebuild : public ::testing::TestWithParam<const char*> {};

TEST_P(ReducerRebuild, KeepsThisRanksResiduals) {
  ReducerOptions o;
  o.fusionThreshold = 4096;
  if (std::string(GetParam()) == "qint8") {
    o.wire = DataType::kQInt8;
  } else {
    o.sparse.density = 0.25;
    o.sparse.chunk = 64;
  }
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> kept(kRanks), rebuilt(kRanks), fresh(kRanks);
  auto world = testing::makeWorld(kRanks);
  testing::forEachRank(world, [&](Communicator& c) {
    auto self = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
    kept[c.rank()] = run(self, o, 0);
    rebuilt[c.rank()] = run(self, o, 1);
    fresh[c.rank()] = run(self, o, 2);
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(rebuilt[r], kept[r]) << "rank " << r;
    EXPECT_NE(fresh[r], kept[r]) << "rank " << r << ": residuals should matter here";
  }
}

INSTANTIATE_TEST_SUITE_P(, ReducerRebuild, ::testing::Values("qint8", "csc"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

TEST(ReducerRebuildShrink, ReducesOverTheSurvivors) {
  auto world = testing::makeWorld(4);
  // Destroyed after every thread ended (one destroyed while a peer still
  // finishes the last op would fail that peer).
  std::vector<std::vector<float>> grads(4, std::vector<float>(1000));
  std::vector<std::unique_ptr<GradientReducer>> reducers(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float>& g = grads[r];
      reducers[r] = std::make_unique<GradientReducer>(
          world[r], std::vector<Tensor>{tensor(g.data(), g.size())});
      std::shared_ptr<Communicator> s = world[r]->shrink({3});
      if (r == 3) {
        EXPECT_FALSE(s);
        return;
      }
      reducers[r]->rebuild(s);
      std::fill(g.begin(), g.end(), float(r));
      reducers[r]->ready(0);
      reducers[r]->wait();
      EXPECT_EQ(g[0], 1.0f) << "rank " << r << ": the average of 0, 1 and 2";
    });
  }
  for (auto& t : threads) t.join();
}

// The automatic wire's choices outlive a rebuild, and a reducer created on
// the new communicator (a joiner's) takes them up from rank 0: after two
// float32 steps the probe runs bfloat16, which every rank keeps.
TEST(ReducerRebuildAutoWire, SurvivorsKeepTheirWiresAndANewReducerTakesThemUp) {
  ReducerOptions o;
  o.fusionThreshold = 4096;
  o.autoWire.enabled = true;
  o.autoWire.candidates = {DataType::kFloat32, DataType::kBFloat16};
  o.autoWire.warmupSteps = 0;
  o.autoWire.probeSteps = 2;
  o.autoWire.period = 100;
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> results(kRanks);
  auto world = testing::makeWorld(kRanks);
  testing::forEachRank(world, [&](Communicator& c) {
    auto self = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
    std::vector<float> a(3000), b(700);
    const std::vector<Tensor> grads{tensor(a.data(), a.size()), tensor(b.data(), b.size())};
    auto reducer = std::make_unique<GradientReducer>(self, grads, o);
    auto step = [&](int n) {
      for (size_t i = 0; i < a.size(); ++i) a[i] = input(c.rank(), n, i);
      for (size_t i = 0; i < b.size(); ++i) b[i] = input(c.rank(), n, 5000 + i);
      reducer->ready(1);
      reducer->ready(0);
      reducer->wait();
    };
    step(0);
    step(1);
    const std::vector<DataType> probed = reducer->wires();
    ASSERT_EQ(probed, std::vector<DataType>(probed.size(), DataType::kBFloat16));
    std::shared_ptr<Communicator> next = c.split(0, c.rank());
    if (c.rank() < 2) {
      reducer->rebuild(next);
    } else {
      reducer = std::make_unique<GradientReducer>(next, grads, o);  // the newcomer
    }
    EXPECT_EQ(reducer->wires(), probed) << "rank " << c.rank();
    step(2);
    results[c.rank()] = a;
    results[c.rank()].insert(results[c.rank()].end(), b.begin(), b.end());
  });
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[2], results[0]);
}

}  // namespace
}  // namespace gflow
