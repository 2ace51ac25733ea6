// The hierarchical backend's phase worker (backend/hierarchical/phase_worker.h):
// every phase runs on one long-lived thread that is not the caller's, in the
// order started; wait() rethrows what a phase threw and the worker goes on;
// a worker that never ran a phase starts no thread. The hierarchical
// allreduce that uses it is checked against exact sums in
// hierarchical_test.cc (segments pipelined) and straggler_test.cc.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend/hierarchical/phase_worker.h"

namespace gflow::backend {
namespace {

TEST(PhaseWorker, EveryPhaseRunsOnOneThreadOfItsOwnInOrder) {
  PhaseWorker w;
  std::set<std::thread::id> threads;
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) {
    w.start([&, i] {
      threads.insert(std::this_thread::get_id());
      order.push_back(i);
    });
    EXPECT_TRUE(w.pending());
    w.wait();
    EXPECT_FALSE(w.pending());
  }
  ASSERT_EQ(threads.size(), 1u) << "one long-lived thread runs every phase";
  EXPECT_NE(*threads.begin(), std::this_thread::get_id());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(PhaseWorker, WaitRethrowsWhatAPhaseThrewAndTheWorkerGoesOn) {
  PhaseWorker w;
  w.start([] { throw std::runtime_error("phase failed"); });
  EXPECT_THROW(w.wait(), std::runtime_error);
  bool ran = false;
  w.start([&] { ran = true; });
  EXPECT_NO_THROW(w.wait());
  EXPECT_TRUE(ran);
  EXPECT_NO_THROW(w.wait()) << "nothing pending: returns at once";
}

TEST(PhaseWorker, AWorkerThatRanNothingEndsAtOnce) {
  PhaseWorker w;
  EXPECT_FALSE(w.pending());
  EXPECT_NO_THROW(w.wait());
}

}  // namespace
}  // namespace gflow::backend
