// Options::tcp and Options::verbs reach the transports: each field set there
// wins over its GFLOW_* variable (the tests check the transports' own
// validation of the value that arrived, and that a valid one runs).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gflow/gflow.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "testing/scoped_env.h"
#include "testing/soft_verbs.h"
#include "transport/contract.h"
#include "transport/engine.h"
#include "transport/wait_policy.h"

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

// Options::progress.unexpectedLimitBytes bounds what a peer sends ahead of
// the receives, over GFLOW_UNEXPECTED_LIMIT (TCP: by back-pressure).
TEST(TransportOptions, UnexpectedLimitComesFromOptions) {
  testing::ScopedEnv limit("GFLOW_UNEXPECTED_LIMIT", "256M");
  ProgressOptions progress;
  progress.unexpectedLimitBytes = 64 << 10;
  constexpr int kMsgs = 24;
  constexpr size_t kBytes = 48 << 10;  // one fits the limit, two do not
  const transport::Envelope env{{1, 2, 3}};
  const Deadline deadline = Deadline::after(std::chrono::seconds(60));
  uint64_t mostStaged = 0;
  auto body = [&](transport::Context& c) {
    c.beginGroup(1, env);
    const int peer = 1 - c.rank();
    std::vector<std::vector<char>> bufs(kMsgs, std::vector<char>(kBytes));
    if (c.rank() == 0) {
      std::vector<transport::RequestPtr> sends;
      for (int i = 0; i < kMsgs; ++i)
        sends.push_back(c.isend(peer, bufs[i].data(), kBytes, transport::Tag{1, uint64_t(i)}, env));
      for (auto& r : sends) c.wait(r, deadline);
      return;
    }
    // Waiting for the first message reads the flood that piled up behind it.
    auto r0 = c.irecv(peer, bufs[0].data(), kBytes, transport::Tag{1, 0}, env);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c.wait(r0, deadline);
    auto& engine = dynamic_cast<transport::Engine&>(c);
    for (int i = 1; i < kMsgs; ++i) {
      mostStaged = std::max(mostStaged, engine.stagedBytes(peer));
      c.wait(c.irecv(peer, bufs[i].data(), kBytes, transport::Tag{1, uint64_t(i)}, env), deadline);
    }
  };
  EXPECT_TRUE(testing::expectNoErrors(
      testing::runContexts("tcp", 2, body, std::chrono::milliseconds(60000), progress)));
  EXPECT_GT(mostStaged, 0u);
  EXPECT_LE(mostStaged, uint64_t{64} << 10);
}

// Options::progress.spinUs wins over GFLOW_SPIN_US.
TEST(TransportOptions, SpinComesFromOptions) {
  testing::ScopedEnv spin("GFLOW_SPIN_US", "7");
  transport::ContextOptions o;
  o.size = 2;
  EXPECT_EQ(transport::WaitPolicy::choose(o).spin, std::chrono::microseconds(7));
  o.progress.spinUs = 3;
  EXPECT_EQ(transport::WaitPolicy::choose(o).spin, std::chrono::microseconds(3));
  o.progress.spinUs = 0;
  EXPECT_EQ(transport::WaitPolicy::choose(o).spin, std::chrono::microseconds(0));
}

}  // namespace
}  // namespace gflow
