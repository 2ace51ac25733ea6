// Connections on demand (GFLOW_CONNECT=lazy, tcp/inbound.h): a rank
// connects only to the peers its ops use, when an op first needs them;
// pairs whose ranks dial each other at once end up with one connection;
// a peer that has gone is named; the results are exact.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "gflow/gflow.h"
#include "testing/contexts.h"
#include "testing/on_demand.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;

Options lazy(const std::string& algorithm) {
  return testing::onDemand("tcp", algorithm);
}

using testing::allreduceExactly;

// The peers each rank of a world of n has connections to after its
// creation and one allreduce by `algorithm`, read before a barrier (so no
// rank has left yet).
std::vector<std::set<int>> peersAfter(const std::string& algorithm, int n) {
  std::vector<std::set<int>> peers(n);
  testing::runRanks(
      n,
      [&](Communicator& c) {
        allreduceExactly(c, 4099);
        const Stats s = c.stats();
        for (int p = 0; p < n; ++p) {
          if (s.peers[p].connections > 0) peers[c.rank()].insert(p);
        }
        c.barrier();
      },
      lazy(algorithm));
  return peers;
}

TEST(TcpOnDemand, ARankConnectsOnlyToThePeersItsAlgorithmUses) {
  const int n = 16;
  for (const char* algorithm : {"ring", "rd", "hd"}) {
    testing::expectPeersOf(algorithm, peersAfter(algorithm, n));
  }
}

TEST(TcpOnDemand, EveryPairDiallingAtOnceEndsWithOneConnectionEach) {
  // All-to-all: every rank needs every other at the same moment, so most
  // pairs dial each other at once (the higher rank's dial wins).
  const int n = 8;
  for (int round = 0; round < 3; ++round) {
    testing::runRanks(
        n,
        [&](Communicator& c) {
          std::vector<int32_t> in(n * 3), out(n * 3, -1);
          for (int p = 0; p < n; ++p) {
            for (int j = 0; j < 3; ++j) in[p * 3 + j] = c.rank() * 100 + p * 10 + j;
          }
          c.alltoall(Tensor(in.data(), in.size(), DataType::kInt32),
                     Tensor(out.data(), out.size(), DataType::kInt32));
          for (int p = 0; p < n; ++p) {
            for (int j = 0; j < 3; ++j) ASSERT_EQ(out[p * 3 + j], p * 100 + c.rank() * 10 + j);
          }
          const auto res = c.stats().resources;
          EXPECT_EQ(res.peersConnected, static_cast<uint64_t>(n - 1));
          EXPECT_EQ(res.connections, static_cast<uint64_t>(n - 1));
          allreduceExactly(c, 1000);
        },
        lazy("ring"));
  }
}

TEST(TcpOnDemand, APointToPointMessageConnectsItsPairOnly) {
  testing::runRanks(
      6,
      [&](Communicator& c) {
        std::vector<int32_t> v(1000);
        const int other = c.rank() == 1 ? 4 : 1;
        // Not partners in creation's exchanges (not ring neighbours); rank 1
        // dials, possibly while rank 4 is still being created.
        if (c.rank() == 1) {
          EXPECT_EQ(c.stats().peers[other].connections, 0u);
        }
        if (c.rank() == 1) {
          std::iota(v.begin(), v.end(), 7);
          c.send(Tensor(v.data(), v.size(), DataType::kInt32), 4);
        } else if (c.rank() == 4) {
          std::this_thread::sleep_for(milliseconds(200));  // the sender dials first
          c.recv(Tensor(v.data(), v.size(), DataType::kInt32), 1);
          for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<int32_t>(i + 7));
        }
        // Read before the barrier: no rank has left and closed yet.
        if (c.rank() == 1 || c.rank() == 4) {
          EXPECT_EQ(c.stats().peers[other].connections, 1u);
        }
        c.barrier();
      },
      lazy("ring"));
}

TEST(TcpOnDemand, APeerThatHasGoneIsNamedWhenItIsFirstNeeded) {
  const transport::Envelope env{{1, 2, 3}};
  auto errors = testing::runContexts(
      "tcp_lazy", 3,
      [&](transport::Context& c) {
        if (c.rank() == 2) return;  // its context closes: nobody listens for it
        std::this_thread::sleep_for(milliseconds(300));
        std::vector<char> b(64);
        c.beginGroup(1, env);
        c.wait(c.isend(2, b.data(), b.size(), {1, 0}, env), Deadline::after(milliseconds(10000)));
      },
      milliseconds(10000));
  EXPECT_FALSE(errors[2]);
  for (int r = 0; r < 2; ++r) {
    const Error e = testing::errorOf(errors[r]);
    EXPECT_EQ(e.code(), ErrorCode::kPeerLost) << e.what();
    EXPECT_EQ(e.context().peer, 2) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 2 could not be connected"), std::string::npos)
        << e.what();
  }
}

// A rank that published its address and then went (its port refuses) is
// the culprit everywhere during the full mesh's setup: the rank that dials
// it fails peer_lost naming it (after 2 s of refusals, not at the
// deadline), and the rank that waits to be dialled by that one reads its
// report and names the same rank.
TEST(TcpOnDemand, ARankThatLeftDuringSetupIsNamedByEveryone) {
  std::vector<std::exception_ptr> errs(3);
  testing::onThreads(3, [&](int rank, const std::shared_ptr<Store>& store) {
    if (rank == 1) {  // published, then gone: nothing listens there
      store->setString("t/tcp/addr/1", "127.0.0.1:1");
      return;
    }
    transport::ContextOptions o;
    o.rank = rank;
    o.size = 3;
    o.store = store;
    o.prefix = "t/";
    o.timeout = std::chrono::seconds(20);
    o.connect = "all";
    try {
      transport::createContext("tcp", o);
    } catch (...) {
      errs[rank] = std::current_exception();
    }
  });
  for (int r : {0, 2}) {
    const Error e = testing::errorOf(errs[r]);
    EXPECT_EQ(e.code(), ErrorCode::kPeerLost) << "rank " << r << ": " << e.what();
    EXPECT_EQ(e.peer(), 1) << "rank " << r << ": " << e.what();
  }
}

TEST(TcpOnDemand, RanksThatConnectDifferentlyAreToldWhy) {
  auto world = [](int r) {
    Options o = lazy("ring");
    o.connect = r == 0 ? "all" : "lazy";
    o.timeout = std::chrono::seconds(3);
    return o;
  };
  std::vector<std::exception_ptr> errs(2);
  testing::onThreads(2, [&](int rank, const std::shared_ptr<Store>& store) {
    Options o = world(rank);
    o.rank = rank;
    o.size = 2;
    o.store = store;
    try {
      auto c = Communicator::create(o);
    } catch (...) {
      errs[rank] = std::current_exception();
    }
  });
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(errs[r]) << "rank " << r << " was created";
  const Error e = testing::errorOf(errs[1]);
  EXPECT_NE(std::string(e.what()).find("GFLOW_CONNECT"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace gflow
