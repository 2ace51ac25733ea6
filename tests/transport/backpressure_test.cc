// Back-pressure: data that arrives before its receive is posted is staged up
// to GFLOW_UNEXPECTED_LIMIT per peer; past that the socket is left unread
// until the receive is posted. Results must be the same either way.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "common/params.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

class Backpressure : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    setenv("GFLOW_UNEXPECTED_LIMIT", "64K", 1);
    params::resetCacheForTesting();
  }
  void TearDown() override {
    unsetenv("GFLOW_UNEXPECTED_LIMIT");
    params::resetCacheForTesting();
  }
};

TEST_P(Backpressure, DataForTheNextOpArrivesWhileStillInThisOne) {
  Options o;
  o.algorithm = GetParam();
  testing::runRanks(
      3,
      [](Communicator& c) {
        for (int round = 0; round < 3; ++round) {
          // Op A: broadcast from rank 1 along 1 -> 2 -> 0, acknowledged by rank 0.
          // Rank 0 is late, so rank 1 sits in A while rank 2 has finished it and
          // already sends rank 1 its data for op B: more than the limit.
          int32_t token = c.rank() == 1 ? 7 + round : 0;
          if (c.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(150));
          c.broadcast(tensor(&token, 1), 1);
          ASSERT_EQ(token, 7 + round);
          std::vector<float> v(300000, static_cast<float>(c.rank() + round));
          c.allreduce(tensor(v.data(), v.size()));
          for (size_t i = 0; i < v.size(); i += 997) ASSERT_EQ(v[i], 3.0f + 3 * round);
        }
      },
      o);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Backpressure, ::testing::Values("rd", "ring"));

}  // namespace
}  // namespace gflow
