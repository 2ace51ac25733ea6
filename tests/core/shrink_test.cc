// Communicator::shrink with ranks as threads, on every host path: after a
// rank is lost (its communicator destroyed mid-job), the survivors' verdict
// names it, shrink() renumbers them in order, and the new communicator
// reduces exactly; the caller's own exclusions; a second rank lost after
// the verdict, counted out at the deadline; the argument checks (tests/faults: the same with
// processes and SIGKILL).
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "gflow/gflow.h"
#include "testing/paths.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using testing::OnPaths;
using testing::WorldPath;
using World = std::vector<std::shared_ptr<Communicator>>;

// Runs body(rank) on one thread per rank of `world`; a gflow::Error or other
// exception escaping it fails the test, naming the rank. Communicators a
// body makes go into `kept` (destroyed after every thread ended: a rank that
// destroys its communicator while a peer still finishes the last op fails
// that peer).
World kept;
std::mutex keptMutex;
void keep(std::shared_ptr<Communicator> c) {
  std::lock_guard<std::mutex> lock(keptMutex);
  kept.push_back(std::move(c));
}

void onEachRank(const World& world, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < world.size(); ++r) {
    threads.emplace_back([&body, r] {
      try {
        body(static_cast<int>(r));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << " threw: " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  kept.clear();
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

class Shrink : public OnPaths {};

TEST_P(Shrink, SurvivorsOfALostRankContinueRenumberedInOrder) {
  Options o;
  o.timeout = milliseconds(5000);
  World w = world(o);
  const int victim = 1;
  std::vector<int> survivors;
  for (int r = 0; r < n(); ++r) {
    if (r != victim) survivors.push_back(r);
  }
  onEachRank(w, [&](int r) {
    std::vector<float> v(1024, 1.0f);
    w[r]->allreduce(tensor(v.data(), v.size()));
    if (r == victim) {
      w[r].reset();  // lost: its connections close mid-job
      return;
    }
    const int culprit = culpritOf([&] {
      for (int i = 0; i < 100; ++i) w[r]->allreduce(tensor(v.data(), v.size()));
    });
    ASSERT_EQ(culprit, victim) << "rank " << r;
    std::shared_ptr<Communicator> s = w[r]->shrink();
    ASSERT_TRUE(s);
    keep(s);
    EXPECT_EQ(s->size(), n() - 1);
    EXPECT_EQ(s->rank(), r < victim ? r : r - 1);
    // The old communicator stays failed with its verdict.
    EXPECT_EQ(culpritOf([&] { w[r]->barrier(); }), victim);
    expectExactSum(*s, r, survivors);
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
    keep(s);
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
    keep(t);
    EXPECT_EQ(t->rank(), r - 2);
    expectExactSum(*t, r, std::vector<int>(kept.begin() + 1, kept.end()));
  });
}

TEST_P(Shrink, ARankLostAfterTheVerdictIsCountedOutByTheDeadline) {
  Options o;
  o.timeout = milliseconds(2000);
  World w = world(o);
  const int first = 1, second = n() - 1;
  onEachRank(w, [&](int r) {
    std::vector<float> v(256, 1.0f);
    w[r]->allreduce(tensor(v.data(), v.size()));
    if (r == first) {
      w[r].reset();
      return;
    }
    ASSERT_EQ(culpritOf([&] {
                for (int i = 0; i < 100; ++i) w[r]->allreduce(tensor(v.data(), v.size()));
              }),
              first);
    if (r == second) {  // lost after the verdict, before it shrinks
      w[r].reset();
      return;
    }
    std::shared_ptr<Communicator> s = w[r]->shrink();
    ASSERT_TRUE(s);
    keep(s);
    EXPECT_EQ(s->size(), n() - 2);
    std::vector<int> left;
    for (int q = 0; q < n(); ++q) {
      if (q != first && q != second) left.push_back(q);
    }
    expectExactSum(*s, r, left);
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
