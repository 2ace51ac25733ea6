// Several sockets per peer: messages from GFLOW_STRIPE_MIN up are striped
// across them; results and ordering must not change, for any message size
// relative to the stripe boundaries.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/params.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

class Striping : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    setenv("GFLOW_STRIPE_MIN", "4096", 1);
    params::resetCacheForTesting();
  }
  void TearDown() override {
    unsetenv("GFLOW_STRIPE_MIN");
    params::resetCacheForTesting();
  }
};

TEST_P(Striping, EverySizeAroundStripeBoundaries) {
  Options o;
  o.algorithm = GetParam();
  o.tcp.socketsPerPeer = 4;
  testing::runRanks(
      3,
      [](Communicator& c) {
        for (size_t count : {size_t(1), size_t(1023), size_t(1024), size_t(1025), size_t(2048),
                             size_t(3072), size_t(12288), size_t(100001)}) {
          for (int rep = 0; rep < 3; ++rep) {
            std::vector<int32_t> v(count);
            for (size_t i = 0; i < count; ++i)
              v[i] = static_cast<int32_t>(i % 101) + c.rank() + rep;
            c.allreduce(tensor(v.data(), count));
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(v[i], 3 * static_cast<int32_t>(i % 101) + 3 + 3 * rep) << count << " " << i;
            }
          }
        }
        c.barrier();
      },
      o);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Striping, ::testing::Values("rd", "ring"));

}  // namespace
}  // namespace gflow
