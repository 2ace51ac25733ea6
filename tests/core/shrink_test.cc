// Communicator::shrink with ranks as threads, on every host path: after a
// rank is lost (its communicator destroyed mid-job), the survivors' verdict
// names it, shrink() renumbers them in order, and the new communicator
// reduces exactly; the caller's own exclusions; a second rank lost after
// the verdict, counted out at the deadline; the argument checks (tests/faults: the same with
// processes and SIGKILL).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "gflow/gflow.h"
#include "testing/paths.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using testing::OnPaths;
using testing::WorldPath;
using World = std::vector<std::shared_ptr<Communicator>>;

using testing::keepUntilThreadsEnd;

// body(rank) on one thread per rank of `world` (testing::runThreads).
void onEachRank(const World& world, const std::function<void(int)>& body) {
  testing::runThreads(static_cast<int>(world.size()), body);
}

// Every rank of `c` contributes (its old rank + 1) * (i + 1) at element i;
// the result must be the exact sum over `oldRanks`.
void expectExactSum(Communicator& c, int oldRank, const std::vector<int>& oldRanks) {
  constexpr size_t kCount = 100000;  // large enough for the pipelined paths
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) v[i] = float((oldRank + 1) * (i % 97 + 1));
  c.allreduce(tensor(v.data(), v.size()));
  double weight = 0;
  for (int r : oldRanks) weight += r + 1;
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(v[i], float(weight * double(i % 97 + 1))) << "element " << i;
  }
}

// The rank that raises `fn`'s gflow::Error as its culprit (-2: none raised).
int culpritOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.peer();
  }
  return -2;
}

class Shrink : public OnPaths {
 protected:
  // Two pretend hosts: a rank blocked in the local phase on the lost rank
  // can be blamed by its cross-host peers (docs/elastic.md, "Not done
  // yet"); attendance still gives one membership, which is what is checked.
  bool exactVerdict() const { return std::get<0>(GetParam()) != WorldPath::kTwoHosts; }

  // Rank r's part in losing `victim` between two ops: every rank runs one
  // allreduce; the victim destroys its communicator once all have finished
  // it (not while a peer still finishes it), and the others run on until
  // they fail. Returns the culprit a survivor's error names (checked to be
  // the victim where the verdict is exact), or -1 on the victim.
  int loseBetweenOps(World& w, int r, int victim, std::atomic<int>& done) {
    std::vector<float> v(1024, 1.0f);
    w[r]->allreduce(tensor(v.data(), v.size()));
    ++done;
    if (r == victim) {
      while (done.load() < n()) std::this_thread::yield();
      w[r].reset();
      return -1;
    }
    const int culprit = culpritOf([&] {
      for (int i = 0; i < 100; ++i) w[r]->allreduce(tensor(v.data(), v.size()));
    });
    EXPECT_GE(culprit, 0) << "rank " << r;
    if (exactVerdict()) {
      EXPECT_EQ(culprit, victim) << "rank " << r;
    }
    return culprit;
  }
};

// The members of `s` (their old ranks, in the new order), checked: in
// increasing order (renumbered in order), this rank at its new rank, none
// of `gone`; then an exact sum over them.
void expectShrunkWorld(Communicator& s, int oldRank, const std::vector<int>& gone) {
  int32_t mine = oldRank;
  std::vector<int32_t> olds(static_cast<size_t>(s.size()));
  s.allgather(tensor(&mine, 1), tensor(olds.data(), olds.size()));
  EXPECT_EQ(olds[static_cast<size_t>(s.rank())], oldRank);
  for (size_t i = 1; i < olds.size(); ++i) EXPECT_LT(olds[i - 1], olds[i]);
  for (int g : gone) EXPECT_EQ(std::count(olds.begin(), olds.end(), g), 0) << "rank " << g;
  expectExactSum(s, oldRank, std::vector<int>(olds.begin(), olds.end()));
}

TEST_P(Shrink, SurvivorsOfALostRankContinueRenumberedInOrder) {
  Options o;
  o.timeout = milliseconds(5000);
  World w = world(o);
  const int victim = 1;
  std::atomic<int> done{0};  // ranks past the first allreduce
  onEachRank(w, [&](int r) {
    const int culprit = loseBetweenOps(w, r, victim, done);
    if (r == victim) return;
    ASSERT_GE(culprit, 0);
    std::shared_ptr<Communicator> s = w[r]->shrink();
    if (!exactVerdict() && !s) return;  // counted out by differing verdicts
    ASSERT_TRUE(s);
    keepUntilThreadsEnd(s);
    if (exactVerdict()) {
      EXPECT_EQ(s->size(), n() - 1);
      EXPECT_EQ(s->rank(), r < victim ? r : r - 1);
    }
    // The old communicator stays failed with its verdict.
    EXPECT_EQ(culpritOf([&] { w[r]->barrier(); }), culprit);
    expectShrunkWorld(*s, r, {victim});
    s->barrier();
  });
}

TEST_P(Shrink, TheCallerExcludesRanksOfAHealthyCommunicator) {
  World w = world();
  const std::vector<int> dropped{0, n() - 1};
  std::vector<int> kept;
  for (int r = 1; r < n() - 1; ++r) kept.push_back(r);
  onEachRank(w, [&](int r) {
    std::shared_ptr<Communicator> s = w[r]->shrink(dropped);
    if (r == 0 || r == n() - 1) {
      EXPECT_FALSE(s) << "rank " << r << " is excluded";
      return;
    }
    ASSERT_TRUE(s);
    keepUntilThreadsEnd(s);
    EXPECT_EQ(s->size(), n() - 2);
    EXPECT_EQ(s->rank(), r - 1);
    expectExactSum(*s, r, kept);
    // Shrinking again, the first rank of the new numbering.
    std::shared_ptr<Communicator> t = s->shrink({0});
    if (r == 1) {
      EXPECT_FALSE(t);
      return;
    }
    ASSERT_TRUE(t);
    keepUntilThreadsEnd(t);
    EXPECT_EQ(t->rank(), r - 2);
    expectExactSum(*t, r, std::vector<int>(kept.begin() + 1, kept.end()));
  });
}

TEST_P(Shrink, ARankLostAfterTheVerdictIsCountedOutByTheDeadline) {
  Options o;
  o.timeout = milliseconds(2000);
  World w = world(o);
  const int first = 1, second = n() - 1;
  std::atomic<int> done{0};  // ranks past the first allreduce
  onEachRank(w, [&](int r) {
    const int culprit = loseBetweenOps(w, r, first, done);
    if (r == first) return;
    ASSERT_GE(culprit, 0);
    if (r == second) {  // lost after the verdict, before it shrinks
      w[r].reset();
      return;
    }
    std::shared_ptr<Communicator> s = w[r]->shrink();
    if (!exactVerdict() && !s) return;
    ASSERT_TRUE(s);
    keepUntilThreadsEnd(s);
    if (exactVerdict()) {
      EXPECT_EQ(s->size(), n() - 2);
    }
    expectShrunkWorld(*s, r, {first, second});
  });
}

INSTANTIATE_TEST_SUITE_P(, Shrink,
                         ::testing::Values(testing::PathParam{WorldPath::kShm, 4},
                                           testing::PathParam{WorldPath::kNetwork, 4},
                                           testing::PathParam{WorldPath::kTwoHosts, 4},
                                           testing::PathParam{WorldPath::kVerbs, 3}),
                         testing::pathName);

TEST(ShrinkArguments, NamesWhatIsWrong) {
  World w = testing::makeWorld(2);
  onEachRank(w, [&](int r) {
    try {
      w[r]->shrink();
      ADD_FAILURE() << "shrink() of a healthy communicator without exclusions returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("has not failed"), std::string::npos) << e.what();
    }
    try {
      w[r]->shrink({2});
      ADD_FAILURE() << "shrink({2}) of 2 ranks returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
    // Neither call touched the communicator.
    std::vector<float> v(8, 1.0f);
    w[r]->allreduce(tensor(v.data(), v.size()));
    EXPECT_EQ(v[0], 2.0f);
  });
}

}  // namespace
}  // namespace gflow
