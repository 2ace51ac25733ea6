// Options::tcp and Options::verbs reach the transports: each field set there
// wins over its GFLOW_* variable (the tests check the transports' own
// validation of the value that arrived, and that a valid one runs).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gflow/gflow.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "testing/soft_verbs.h"

namespace gflow {
namespace {

namespace sv = testing::softverbs;
using testing::errorOf;

// Every rank's creation fails with kInvalidArgument whose text has `what`.
void expectEveryRankRefuses(const Options& o, const std::string& what) {
  auto errs = testing::runRanksCollect(
      2, [](Communicator&) {}, o);
  for (auto& e : errs) {
    ASSERT_TRUE(e) << "creation succeeded";
    const Error err = errorOf(e);
    EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument) << err.what();
    EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
  }
}

TEST(TransportOptions, TcpSocketsPerPeerComesFromOptions) {
  Options bad;
  bad.tcp.socketsPerPeer = 100;
  expectEveryRankRefuses(bad, "GFLOW_SOCKETS_PER_PEER=100 must be between 1 and 64");

  Options good;
  good.tcp.socketsPerPeer = 3;
  good.tcp.stripeMinBytes = 4096;
  good.algorithm = "ring";
  testing::runRanks(
      3,
      [](Communicator& c) {
        std::vector<float> v(300000, static_cast<float>(c.rank() + 1));
        c.allreduce(tensor(v.data(), v.size()));
        for (float x : v) ASSERT_EQ(x, 6.0f);
      },
      good);
}

TEST(TransportOptions, VerbsFieldsComeFromOptions) {
  sv::Config cfg;
  cfg.devices = 1;
  cfg.roce = true;
  sv::Installed dev(cfg);
  Options o;
  o.transport = "verbs";

  Options slots = o;
  slots.verbs.eagerSlots = 1;
  expectEveryRankRefuses(slots, "GFLOW_IB_EAGER_SLOTS=1 must be between 2 and 4096");

  Options hca = o;
  hca.verbs.hca = "=no_such_hca";
  expectEveryRankRefuses(hca, "GFLOW_IB_HCA='=no_such_hca'");

  Options gid = o;
  gid.verbs.gidIndex = 999;
  expectEveryRankRefuses(gid, "GFLOW_IB_GID_INDEX=999 is not a valid GID index");

  Options retry = o;
  retry.verbs.retryCount = 9;
  expectEveryRankRefuses(retry, "GFLOW_IB_RETRY_CNT=9 must be 0-7");

  Options fine = o;
  fine.verbs.qpsPerPeer = 1;
  fine.verbs.eagerBytes = 1024;
  testing::runRanks(
      2,
      [](Communicator& c) {
        std::vector<int32_t> v(5000, c.rank() + 1);
        c.allreduce(tensor(v.data(), v.size()));
        for (int32_t x : v) ASSERT_EQ(x, 3);
      },
      fine);
}

}  // namespace
}  // namespace gflow
