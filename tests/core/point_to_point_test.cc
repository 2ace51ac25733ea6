// send, recv and sendRecv with ranks as threads, against exact references:
// every dtype and size on every host path a world can take (point-to-point
// always runs over the network transport: TCP with shared memory on or off,
// two pretend hosts, verbs on the software RDMA device), per-tag ordering,
// any source, interleaving with collectives that other ranks run alone,
// exchanges far beyond the unexpected-data limit, and the errors: mismatch,
// timeout naming the peer, bad arguments.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "gflow/gflow.h"
#include "testing/paths.h"
#include "testing/ranks.h"
#include "testing/values.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

using testing::WorldPath;

// A value that tells sender, receiver, message and element apart, as `t`.
double valueOf(int from, int to, int msg, size_t i, DataType t) {
  if (t == DataType::kBool) return double((from + to + msg + i) % 2);
  if (t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2 || t == DataType::kInt8 ||
      t == DataType::kUInt8) {
    return double((from * 7 + to * 3 + msg * 5 + i) % 16);
  }
  return double(from * 1000 + to * 100 + msg * 10 + static_cast<int>(i % 7));
}

std::vector<char> filled(int from, int to, int msg, size_t count, DataType t) {
  std::vector<char> v(count * dataTypeSize(t) + 1, 0x5a);
  for (size_t i = 0; i < count; ++i)
    testing::setValue(v.data(), i, t, valueOf(from, to, msg, i, t));
  return v;
}

void expectFrom(const std::vector<char>& got, int from, int to, int msg, size_t count, DataType t) {
  ASSERT_EQ(got, filled(from, to, msg, count, t))
      << toString(t) << " count " << count << " from " << from << " to " << to << " msg " << msg;
}

class PointToPoint : public testing::OnPaths {};

// A ring of sendRecv (each rank to the next, from the previous) and pairs of
// blocking send/recv in both orders, for every dtype and sizes from 0 to
// beyond the verbs eager size and the TCP fragment size.
TEST_P(PointToPoint, EveryDtypeAndSizeArrivesExactly) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    const int me = c.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
    int msg = 0;
    for (DataType t : testing::allDataTypes()) {
      for (size_t count : {size_t(0), size_t(1), size_t(1000), size_t(150000)}) {
        ++msg;
        std::vector<char> out = filled(me, next, msg, count, t);
        std::vector<char> in(count * dataTypeSize(t) + 1, 0x5a);
        c.sendRecv({P2POp::send(Tensor(out.data(), count, t), next, msg % 3),
                    P2POp::recv(Tensor(in.data(), count, t), prev, msg % 3)});
        expectFrom(in, prev, me, msg, count, t);
        // Blocking pairs: rank 0 and 1 (even sends first, odd receives first).
        if (me > 1) continue;
        std::vector<char> mine = filled(me, 1 - me, msg, count, t);
        std::vector<char> theirs(mine.size(), 0x5a);
        Tensor o(mine.data(), count, t), i(theirs.data(), count, t);
        if (me == 0) {
          c.send(o, 1, 5);
          EXPECT_EQ(c.recv(i, 1, 5), 1);
        } else {
          EXPECT_EQ(c.recv(i, 0, 5), 0);
          c.send(o, 0, 5);
        }
        expectFrom(theirs, 1 - me, me, msg, count, t);
      }
    }
    EXPECT_GT(c.stats().pointToPoint, 0u);
  });
}

// Messages of one tag arrive in the order they were sent, whatever order
// the receiver asks for the tags in; async sends and receives pair up the
// same way.
TEST_P(PointToPoint, MessagesOfOneTagKeepTheirOrder) {
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    if (c.rank() > 1) return;
    const int other = 1 - c.rank();
    if (c.rank() == 0) {
      for (int64_t v : {10, 20, 11, 21, 12}) {
        int64_t x = v;
        c.send(tensor(&x, 1), other, int(v / 10));
      }
      std::vector<int64_t> big(50000);
      for (size_t i = 0; i < big.size(); ++i) big[i] = int64_t(i) * 3;
      std::vector<Work> works;
      for (int k = 0; k < 3; ++k) works.push_back(c.sendAsync(tensor(big.data(), big.size()), 1));
      for (auto& wk : works) wk.wait();
      return;
    }
    std::vector<int64_t> got(5, -1);
    c.recv(tensor(&got[0], 1), other, 2);
    c.recv(tensor(&got[1], 1), other, 1);
    c.recv(tensor(&got[2], 1), other, 2);
    c.recv(tensor(&got[3], 1), other, 1);
    c.recv(tensor(&got[4], 1), other, 1);
    EXPECT_EQ(got, (std::vector<int64_t>{20, 10, 21, 11, 12}));
    std::vector<std::vector<int64_t>> bufs(3, std::vector<int64_t>(50000, -1));
    std::vector<Work> works;
    for (auto& b : bufs) works.push_back(c.recvAsync(tensor(b.data(), b.size()), 0));
    for (auto& wk : works) wk.wait();
    for (auto& b : bufs) {
      for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], int64_t(i) * 3) << i;
    }
  });
}

// A receive from any source takes each sender's message once, tells which
// rank sent it, and keeps each sender's order of one tag.
TEST_P(PointToPoint, AnySourceTakesEverySendersMessagesInTheirOrder) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    if (c.rank() != 0) {
      for (int k = 0; k < 3; ++k) {
        int32_t v[2] = {c.rank(), k};
        c.send(tensor(v, 2), 0, 4);
      }
      return;
    }
    std::vector<int> nextOf(n, 0);
    for (int k = 0; k < 3 * (n - 1); ++k) {
      int32_t v[2] = {-1, -1};
      int source = -2;
      if (k % 2 == 0) {
        source = c.recv(tensor(v, 2), P2POp::kAnySource, 4);
      } else {
        c.recvAsync(tensor(v, 2), P2POp::kAnySource, 4, &source).wait();
      }
      ASSERT_GE(source, 1);
      ASSERT_LT(source, n);
      EXPECT_EQ(v[0], source);
      EXPECT_EQ(v[1], nextOf[source]++) << "from rank " << source;
    }
  });
}

// Point-to-point between two ranks while a third runs nothing, then a
// collective of all: neither disturbs the other's order or results.
TEST_P(PointToPoint, InterleavesWithCollectivesOtherRanksRunAlone) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    for (int round = 0; round < 12; ++round) {
      const int a = round % n, b = (round + 1) % n;
      std::vector<float> x(round % 2 ? 3000 : 7, float(round));
      if (c.rank() == a) c.send(tensor(x.data(), x.size()), b, round);
      if (c.rank() == b) {
        std::vector<float> y(x.size(), -1.0f);
        c.recv(tensor(y.data(), y.size()), a, round);
        ASSERT_EQ(y, x);
      }
      std::vector<double> s(5, double(c.rank()));
      c.allreduce(tensor(s.data(), s.size()));
      for (double v : s) ASSERT_EQ(v, n * (n - 1) / 2.0);
    }
  });
}

// Both ranks send 8 MB to each other first with a 64 KiB unexpected-data
// limit: sendRecv posts the receives with the sends, so nothing deadlocks.
TEST_P(PointToPoint, SendRecvExchangesFarBeyondTheUnexpectedLimit) {
  Options o;
  o.progress.unexpectedLimitBytes = 64 * 1024;
  auto w = world(o);
  testing::forEachRank(w, [&](Communicator& c) {
    if (c.rank() > 1) return;
    const int other = 1 - c.rank();
    const size_t count = size_t(1) << 20;
    std::vector<double> out(count), in(count, -1.0);
    for (size_t i = 0; i < count; ++i) out[i] = c.rank() * 1e7 + double(i);
    c.sendRecv({P2POp::recv(tensor(in.data(), count), other),
                P2POp::send(tensor(out.data(), count), other)});
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(in[i], other * 1e7 + double(i)) << i;
  });
}

// Every rank posts an async receive from each peer, then an async send to
// each (the order of torch's batch_isend_irecv tests), with messages far
// beyond a 64 KiB unexpected-data limit: the receives stay in flight while
// the sends run, so nothing waits for the deadline. A collective after them
// and an async receive completed by a later blocking op work too.
TEST_P(PointToPoint, AsyncReceivesPostedBeforeTheSendsDoNotHoldThemBack) {
  const int n = this->n();
  Options o;
  o.progress.unexpectedLimitBytes = 64 * 1024;
  auto w = world(o);
  testing::forEachRank(w, [&](Communicator& c) {
    const int me = c.rank();
    const size_t count = 300000;
    std::vector<double> out(count);
    for (size_t i = 0; i < count; ++i) out[i] = me * 1e7 + double(i);
    std::vector<std::vector<double>> in(n, std::vector<double>(count, -1.0));
    std::vector<Work> works;
    for (int p = 0; p < n; ++p) {
      if (p != me) works.push_back(c.recvAsync(tensor(in[p].data(), count), p, 2));
    }
    for (int p = 0; p < n; ++p) {
      if (p != me) works.push_back(c.sendAsync(tensor(out.data(), count), p, 2));
    }
    for (auto& wk : works) wk.wait();
    for (int p = 0; p < n; ++p) {
      for (size_t i = 0; i < count && p != me; ++i) ASSERT_EQ(in[p][i], p * 1e7 + double(i));
    }
    int64_t x = me, from = -1;
    int source = -5;
    Work r = c.recvAsync(tensor(&from, 1), P2POp::kAnySource, 8, &source);
    c.send(tensor(&x, 1), (me + 1) % n, 8);
    c.barrier();
    r.wait();
    EXPECT_EQ(source, (me + n - 1) % n);
    EXPECT_EQ(from, (me + n - 1) % n);
  });
}

// Messages from GFLOW_LOCAL_SINGLE_COPY on (4 KiB in the tests) between
// ranks of one host are read from the sender's buffer (single copy) where
// shared memory is on; between hosts, under GFLOW_SHM=0 and on verbs they
// cross the wire. Smaller ones always do.
TEST_P(PointToPoint, LargeMessagesWithinAHostGoBySingleCopyOthersCrossTheWire) {
  const int n = this->n();
  const WorldPath path = std::get<0>(GetParam());
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    const int me = c.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
    const uint64_t before = c.stats().peers[next].singleCopyBytesSent;
    for (size_t count : {size_t(500), size_t(25000)}) {  // 2 KB and 100 KB of float32
      std::vector<char> out = filled(me, next, 1, count, DataType::kFloat32);
      std::vector<char> in(out.size(), 0x5a);
      c.sendRecv({P2POp::send(Tensor(out.data(), count, DataType::kFloat32), next),
                  P2POp::recv(Tensor(in.data(), count, DataType::kFloat32), prev)});
      expectFrom(in, prev, me, 1, count, DataType::kFloat32);
    }
    const bool sameHost = path == WorldPath::kShm || (path == WorldPath::kTwoHosts &&
                                                      (me < (n + 1) / 2) == (next < (n + 1) / 2));
    EXPECT_EQ(c.stats().peers[next].singleCopyBytesSent - before, sameHost ? 100000u : 0u)
        << "rank " << me << " to " << next;
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, PointToPoint,
                         ::testing::Values(std::make_tuple(WorldPath::kShm, 2),
                                           std::make_tuple(WorldPath::kShm, 3),
                                           std::make_tuple(WorldPath::kNetwork, 4),
                                           std::make_tuple(WorldPath::kTwoHosts, 4),
                                           std::make_tuple(WorldPath::kVerbs, 3)),
                         testing::pathName);

// ---- errors ------------------------------------------------------------------

struct SetOnExit {
  std::atomic<bool>& flag;
  ~SetOnExit() { flag = true; }
};

using testing::Outcome;

std::vector<Outcome> outcomes(int n, const std::function<void(Communicator&)>& fn,
                              milliseconds timeout = std::chrono::seconds(20)) {
  Options o;
  o.timeout = timeout;
  return testing::runRanksOutcomes(n, fn, o);
}

// A receive of another count or dtype than the send raises kMismatch on the
// receiver, and the sender's next op learns it.
TEST(PointToPointErrors, ReceiveOfAnotherSizeOrDtypeIsAMismatchOnBothRanks) {
  for (bool dtype : {false, true}) {
    auto res = outcomes(2, [&](Communicator& c) {
      std::vector<float> v(16, 1.0f);
      if (c.rank() == 0) {
        c.send(tensor(v.data(), 16), 1);
      } else if (dtype) {
        std::vector<int32_t> i(16);
        c.recv(tensor(i.data(), 16), 0);
      } else {
        c.recv(tensor(v.data(), 12), 0);
      }
      c.barrier();
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(res[r].threw) << "rank " << r;
      EXPECT_EQ(res[r].code, ErrorCode::kMismatch) << "rank " << r << ": " << res[r].what;
      EXPECT_THAT(res[r].what, HasSubstr(dtype ? "int32" : "count=12")) << res[r].what;
    }
  }
}

// A receive that no rank matches times out naming the peer (or, from any
// source, saying so); the words are torch's ("Timed out").
TEST(PointToPointErrors, UnmatchedReceiveTimesOutNamingThePeer) {
  for (bool any : {false, true}) {
    std::atomic<bool> over{false};
    auto res = outcomes(
        3,
        [&](Communicator& c) {
          float x = 0;
          if (c.rank() != 0) {
            // Alive and connected, but sending nothing.
            while (!over) std::this_thread::sleep_for(milliseconds(5));
            return;
          }
          SetOnExit release{over};
          c.recv(tensor(&x, 1), any ? P2POp::kAnySource : 2, 3);
        },
        milliseconds(400));
    ASSERT_TRUE(res[0].threw);
    EXPECT_EQ(res[0].code, ErrorCode::kTimeout) << res[0].what;
    EXPECT_THAT(res[0].what, HasSubstr("Timed out"));
    EXPECT_THAT(res[0].what, HasSubstr(any ? "any source with tag 3" : "rank 2"));
    if (!any) {
      EXPECT_EQ(res[0].peer, 2) << res[0].what;
    }
  }
}

TEST(PointToPointErrors, BadArgumentsNameTheProblem) {
  struct Case {
    std::function<void(Communicator&, std::vector<float>&)> call;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {[](Communicator& c, std::vector<float>& v) { c.send(tensor(v.data(), 4), c.rank()); },
       "not another rank"},
      {[](Communicator& c, std::vector<float>& v) { c.send(tensor(v.data(), 4), 7); }, "peer 7"},
      {[](Communicator& c, std::vector<float>& v) {
         c.send(tensor(v.data(), 4), P2POp::kAnySource);
       },
       "peer -1"},
      {[](Communicator& c, std::vector<float>& v) {
         c.recv(tensor(v.data(), 4), 1 - c.rank(), -2);
       },
       "tag -2 is negative"},
      {[](Communicator& c, std::vector<float>&) {
         c.recv(Tensor(nullptr, 4, DataType::kFloat32), 1 - c.rank());
       },
       "null"},
      {[](Communicator& c, std::vector<float>& v) {
         c.sendRecv({P2POp::recv(tensor(v.data(), 4), 1 - c.rank()),
                     P2POp::send(tensor(v.data() + 2, 4), 1 - c.rank())});
       },
       "ops[0] (a receive) overlaps ops[1]"},
  };
  for (const Case& k : cases) {
    auto res = outcomes(2, [&](Communicator& c) {
      std::vector<float> v(16, 1.0f);
      if (c.rank() == 0) {
        k.call(c, v);
      } else {
        c.barrier();  // the peer learns at once instead of at its deadline
      }
    });
    ASSERT_TRUE(res[0].threw) << k.needle;
    EXPECT_EQ(res[0].code, ErrorCode::kInvalidArgument) << res[0].what;
    EXPECT_THAT(res[0].what, HasSubstr(k.needle));
    EXPECT_THAT(res[0].what, HasSubstr("rank 0"));
    ASSERT_TRUE(res[1].threw) << k.needle;
    EXPECT_EQ(res[1].code, ErrorCode::kPeerLost) << res[1].what;
  }
}

}  // namespace
}  // namespace gflow
