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
    unsetenv("GFLOW_STRIPE_CHUNK");
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

// Units of 4 KiB (GFLOW_STRIPE_CHUNK) over three sockets: a message is cut
// into many frames, taken by whichever socket drained first; every
// algorithm still gives exact results around the unit boundaries.
TEST_P(Striping, SmallUnitsOddSizesAreExact) {
  setenv("GFLOW_STRIPE_CHUNK", "4096", 1);
  params::resetCacheForTesting();
  Options o;
  o.algorithm = GetParam();
  o.tcp.socketsPerPeer = 3;
  testing::runRanks(
      3,
      [](Communicator& c) {
        for (size_t count : {size_t(1), size_t(1023), size_t(1025), size_t(3071), size_t(12289),
                             size_t(100003), size_t(262147)}) {
          std::vector<int32_t> v(count);
          for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i % 97) * (c.rank() + 1);
          c.allreduce(tensor(v.data(), count));
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(v[i], 6 * static_cast<int32_t>(i % 97)) << count << " " << i;
          }
          std::vector<int32_t> b(count, c.rank() == 2 ? 11 : 0);
          c.broadcast(tensor(b.data(), count), 2);
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(b[i], 11) << count << " " << i;
        }
        c.barrier();
      },
      o);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Striping, ::testing::Values("rd", "ring"));

}  // namespace
}  // namespace gflow
