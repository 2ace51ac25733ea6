// Verbs connections on demand (GFLOW_CONNECT=lazy, verbs_context.h) on the
// software device: a rank opens queue pairs only to the peers its ops
// name; the pair's records go through the store without either op thread
// waiting on the other; the completion queue grows as peers are opened;
// a peer that refuses the connection says why; the results are exact.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "gflow/gflow.h"
#include "testing/contexts.h"
#include "testing/on_demand.h"
#include "testing/ranks.h"
#include "testing/soft_verbs.h"
#include "transport/verbs/verbs_context.h"

namespace gflow {
namespace {

namespace sv = testing::softverbs;
using std::chrono::milliseconds;

Options lazyVerbs(const std::string& algorithm) {
  return testing::onDemand("verbs", algorithm);
}

using testing::allreduceExactly;

TEST(VerbsOnDemand, ARankOpensQueuePairsOnlyToThePeersItsAlgorithmUses) {
  sv::Installed dev;
  const int n = 16;
  for (const char* algorithm : {"ring", "rd", "hd"}) {
    std::vector<std::set<int>> peers(n);
    testing::runRanks(
        n,
        [&](Communicator& c) {
          allreduceExactly(c, 3);       // eager
          allreduceExactly(c, 300000);  // rendezvous
          const Stats s = c.stats();
          for (int p = 0; p < n; ++p) {
            if (s.peers[p].connections > 0) peers[c.rank()].insert(p);
          }
          c.barrier();
        },
        lazyVerbs(algorithm));
    testing::expectPeersOf(algorithm, peers);
  }
}

// Twelve ranks, each sending to every other: more peers than the first
// completion queue holds (it grows), every pair's records crossing.
TEST(VerbsOnDemand, AllToAllConnectsEveryPairAndGrowsTheCompletionQueue) {
  sv::Installed dev;
  const int n = 12;
  testing::runRanks(
      n,
      [&](Communicator& c) {
        // Pairwise exchanges in ascending peer order (the lower rank of a
        // pair sends first): blocking sends cannot deadlock.
        for (int p = 0; p < n; ++p) {
          if (p == c.rank()) continue;
          const size_t count = (p + c.rank()) % 2 ? 7 : 70000;
          std::vector<int32_t> out(count, c.rank() * 100 + p), in(count, -1);
          const Tensor o(out.data(), count, DataType::kInt32),
              i(in.data(), count, DataType::kInt32);
          if (c.rank() < p) {
            c.send(o, p);
            c.recv(i, p);
          } else {
            c.recv(i, p);
            c.send(o, p);
          }
          for (int32_t v : in) ASSERT_EQ(v, p * 100 + c.rank()) << "from " << p;
        }
        const Stats s = c.stats();
        for (int p = 0; p < n; ++p) {
          if (p != c.rank()) {
            EXPECT_GT(s.peers[p].connections, 0) << "peer " << p;
          }
        }
        c.barrier();
      },
      lazyVerbs("ring"));
}

// A rank that only looks for a peer's messages (arrived(), as a receive
// from any source does) connects when the sender asks it to.
TEST(VerbsOnDemand, AReceiverThatOnlyLooksConnectsWhenTheSenderAsks) {
  sv::Installed dev;
  const transport::Envelope env{{1, 2, 3}};
  testing::expectNoErrors(testing::runContexts(
      "verbs_lazy", 2,
      [&](transport::Context& c) {
        c.beginGroup(1, env);
        if (c.rank() == 0) {
          char b = 42;
          c.wait(c.isend(1, &b, 1, {1, 0}, env), Deadline::after(milliseconds(10000)));
          return;
        }
        const Deadline d = Deadline::after(milliseconds(10000));
        while (!c.arrived(0, {1, 0})) {
          ASSERT_FALSE(d.expired()) << "the message never arrived";
          c.poll();
        }
        char b = 0;
        c.wait(c.irecv(0, &b, 1, {1, 0}, env), d);
        EXPECT_EQ(b, 42);
      },
      milliseconds(10000)));
}

// A small send completes before its receiver has named the sender: rank 0
// sends to rank 3, then joins a barrier in which they are not partners;
// rank 3 receives only after it. Rank 3, waiting in the barrier, answers
// rank 0's request to connect, and its ring takes the message.
TEST(VerbsOnDemand, ASmallSendCompletesBeforeTheReceiverNamesTheSender) {
  sv::Installed dev;
  testing::runRanks(
      8,
      [&](Communicator& c) {
        std::vector<int32_t> v(100, c.rank() == 0 ? 7 : -1);
        const Tensor t(v.data(), v.size(), DataType::kInt32);
        if (c.rank() == 0) c.send(t, 3);
        c.barrier();
        if (c.rank() == 3) {
          c.recv(t, 0);
          for (int32_t x : v) ASSERT_EQ(x, 7);
        }
      },
      lazyVerbs("ring"));
}

// A receive from any source connects only to the rank that sends, not to
// every rank: rank 0's peers are creation's ring neighbours (1, 7), the
// sender (5), and at most the barrier's partners after it (2, 4, 6).
TEST(VerbsOnDemand, AReceiveFromAnySourceConnectsOnlyToTheSender) {
  sv::Installed dev;
  testing::runRanks(
      8,
      [&](Communicator& c) {
        int32_t v = c.rank();
        const Tensor t(&v, 1, DataType::kInt32);
        if (c.rank() == 5) c.send(t, 0);
        if (c.rank() == 0) {
          EXPECT_EQ(c.recv(t, P2POp::kAnySource), 5);
          EXPECT_EQ(v, 5);
          const Stats s = c.stats();
          EXPECT_GT(s.peers[5].connections, 0);
          EXPECT_EQ(s.peers[3].connections, 0);
        }
        c.barrier();
      },
      lazyVerbs("ring"));
}

// A peer that has gone before answering this rank's request to connect:
// the wait fails at its deadline and says the pair never connected.
TEST(VerbsOnDemand, APeerThatNeverNamesThisRankIsReportedNotConnected) {
  sv::Installed dev;
  const transport::Envelope env{{1, 2, 3}};
  auto errs = testing::runContexts(
      "verbs_lazy", 2,
      [&](transport::Context& c) {
        if (c.rank() == 1) return;
        c.beginGroup(1, env);
        char b = 0;
        c.wait(c.irecv(1, &b, 1, {1, 0}, env), Deadline::after(milliseconds(1500)));
      },
      milliseconds(1500));
  const Error e = testing::errorOf(errs[0]);
  EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  EXPECT_EQ(e.peer(), 1) << e.what();
  EXPECT_NE(std::string(e.what()).find("not connected"), std::string::npos) << e.what();
}

// A higher rank that fails while its pair is still connecting refuses the
// connection with its error: the lower rank fails with that error's code,
// naming it, instead of waiting for its deadline.
TEST(VerbsOnDemand, ARankThatFailsWhileConnectingRefusesWithItsError) {
  sv::Installed dev;
  const transport::Envelope env{{1, 2, 3}};
  auto errs = testing::runContexts(
      "verbs_lazy", 2,
      [&](transport::Context& c) {
        c.beginGroup(1, env);
        char b = 0;
        if (c.rank() == 1) {
          c.isend(0, &b, 1, {1, 0}, env);  // opens rank 0, waits for its record
          c.notifyPeers(Error(ErrorCode::kMismatch, "the test's failure"));
          return;
        }
        std::this_thread::sleep_for(milliseconds(200));
        c.wait(c.irecv(1, &b, 1, {1, 0}, env), Deadline::after(milliseconds(20000)));
      },
      milliseconds(20000));
  const Error e = testing::errorOf(errs[0]);
  EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
  EXPECT_EQ(e.peer(), 1) << e.what();
  EXPECT_NE(std::string(e.what()).find("the test's failure"), std::string::npos) << e.what();
}

// Ranks whose verbs settings differ: the higher rank finds out from the
// lower rank's record and refuses, and the lower rank reads why.
TEST(VerbsOnDemand, ARefusedConnectionSaysWhyOnBothSides) {
  sv::Installed dev;
  const transport::Envelope env{{1, 2, 3}};
  std::vector<std::exception_ptr> errs(2);
  testing::onThreads(2, [&](int rank, const std::shared_ptr<Store>& store) {
    transport::ContextOptions o;
    o.rank = rank;
    o.size = 2;
    o.store = store;
    o.prefix = "t/";
    o.timeout = std::chrono::seconds(10);
    o.connect = "lazy";
    o.verbs.eagerSlots = rank == 0 ? 16 : 32;
    try {
      auto c = transport::createContext("verbs", o);
      c->beginGroup(1, env);
      // Each sends and waits to receive: only the connection ends either.
      char out = 1, in = 0;
      c->isend(1 - rank, &out, 1, {1, 0}, env);
      c->wait(c->irecv(1 - rank, &in, 1, {1, 0}, env), Deadline::after(milliseconds(10000)));
    } catch (...) {
      errs[rank] = std::current_exception();
    }
  });
  for (int r = 0; r < 2; ++r) {
    const Error e = testing::errorOf(errs[r]);
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << "rank " << r << ": " << e.what();
    EXPECT_EQ(e.peer(), 1 - r) << "rank " << r << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("GFLOW_IB_EAGER_SLOTS 16 vs 32"), std::string::npos)
        << "rank " << r << ": " << e.what();
  }
  EXPECT_NE(std::string(testing::errorOf(errs[0]).what()).find("refused"), std::string::npos);
}

}  // namespace
}  // namespace gflow
