// Per-link traffic (Stats, PeerStats::sameHost; allreduce_bw's link columns
// read the same counters): on two hosts of two ranks, what each rank sent to
// each peer over one allreduce equals the algorithm's analytic bytes within
// 1%, on both ends of every link.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

constexpr int kRanks = 4;

// sent[r][p]: bytes rank r sent to p during one allreduce of `bytes`, as r's
// bytesSent and as p's bytesReceived from r; hostOf: {0, 0, 1, 1}.
struct Traffic {
  std::vector<std::vector<double>> sent, received;
  std::vector<std::vector<bool>> sameHost;
};

Traffic measure(const std::string& algorithm, const std::string& transport, size_t bytes,
                size_t hierSegment = 0) {
  Options o;
  o.algorithm = algorithm;
  o.transport = transport;
  if (hierSegment) o.tuning.hierSegmentBytes = hierSegment;
  Traffic t;
  t.sent.assign(kRanks, std::vector<double>(kRanks, 0));
  t.received = t.sent;
  t.sameHost.assign(kRanks, std::vector<bool>(kRanks, false));
  auto world = testing::makeWorldWith(kRanks, testing::onHosts({0, 0, 1, 1}, o));
  testing::forEachRank(world, [&](Communicator& c) {
    std::vector<float> v(bytes / sizeof(float), 1.0f);
    c.allreduce(Tensor(v.data(), v.size(), DataType::kFloat32));  // connections and warm-up
    c.barrier();
    const Stats before = c.stats();
    c.allreduce(Tensor(v.data(), v.size(), DataType::kFloat32));
    const Stats after = c.stats();
    ASSERT_EQ(v[0], static_cast<float>(kRanks * kRanks));  // 1 -> 4 -> 16
    const int r = c.rank();
    for (int p = 0; p < kRanks; ++p) {
      t.sent[r][p] = static_cast<double>(after.peers[p].bytesSent - before.peers[p].bytesSent);
      t.received[p][r] =
          static_cast<double>(after.peers[p].bytesReceived - before.peers[p].bytesReceived);
      t.sameHost[r][p] = after.peers[p].sameHost;
    }
    c.barrier();  // the peers' reads of this rank's buffers are counted
  });
  return t;
}

void expectNear(double got, double want, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), 0.01 * want + 1)
      << what << ": " << got << " bytes, want " << want;
}

// The flat ring r -> r+1: each rank sends 2(N-1)/N of the buffer to its
// successor and nothing to anyone else; 0->1 and 2->3 stay on their host,
// 1->2 and 3->0 cross.
TEST(LinkBytes, RingOnTwoHostsMatchesTheAnalyticBytes) {
  for (const char* transport : {"tcp"}) {
    const size_t s = 1 << 20;
    const Traffic t = measure("ring", transport, s);
    for (int r = 0; r < kRanks; ++r) {
      for (int p = 0; p < kRanks; ++p) {
        EXPECT_EQ(t.sameHost[r][p], r / 2 == p / 2) << r << "->" << p;
        if (p == r) continue;
        const double want = p == (r + 1) % kRanks ? 1.5 * s : 0;
        const std::string what = std::to_string(r) + "->" + std::to_string(p);
        expectNear(t.sent[r][p], want, "sent " + what);
        expectNear(t.received[r][p], want, "received " + what);
      }
    }
  }
}

// Hierarchical: a local reduce-scatter (S/2 to the host's other rank), the
// cross allreduce of that half with the same local rank on the other host
// (S/2 over the network on 2 hosts), a local allgather (S/2 again). With
// 1 MiB segments, 4 MiB is cut into 4 pipelined segments; the bytes stay
// the same.
TEST(LinkBytes, HierarchicalOnTwoHostsMatchesTheAnalyticBytes) {
  for (size_t s : {size_t{1} << 20, size_t{4} << 20}) {
    const Traffic t = measure("hier", "tcp", s, size_t{1} << 20);
    for (int r = 0; r < kRanks; ++r) {
      const int local = r ^ 1, cross = (r + 2) % kRanks;
      for (int p = 0; p < kRanks; ++p) {
        if (p == r) continue;
        const double want = p == local ? 1.0 * s : p == cross ? 0.5 * s : 0;
        const std::string what =
            std::to_string(r) + "->" + std::to_string(p) + " at " + std::to_string(s);
        expectNear(t.sent[r][p], want, "sent " + what);
        expectNear(t.received[r][p], want, "received " + what);
      }
    }
  }
}

TEST(LinkBytes, OneHostPeersAreSameHost) {
  testing::runRanks(3, [](Communicator& c) {
    const Stats s = c.stats();
    for (const PeerStats& p : s.peers) EXPECT_TRUE(p.sameHost);
    EXPECT_EQ(s.networkBytesSent(), 0u);
  });
}

}  // namespace
}  // namespace gflow
