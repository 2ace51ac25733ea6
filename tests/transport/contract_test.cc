// The Transport contract (src/transport/transport.h), driven on a Context
// directly, the same tests for TCP and for verbs on the software RDMA device
// (tests/testing/soft_verbs.h), ranks as threads over an in-memory store:
// tag matching in any posting order, unexpected messages staged within
// GFLOW_UNEXPECTED_LIMIT, envelope mismatch, abort from another thread and
// which rank a timeout blames. Deadlines are generous; nothing asserts how
// long anything takes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/params.h"
#include "gflow/gflow.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "testing/soft_verbs.h"
#include "transport/engine.h"
#include "transport/transport.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using testing::errorOf;
using testing::expectNoErrors;
using testing::pattern;
using testing::waitOrNotify;
using transport::Context;
using transport::Envelope;
using transport::RequestPtr;
using transport::Tag;

constexpr Envelope kEnv{{1, 2, 3}};
constexpr Envelope kOther{{1, 2, 4}};

Deadline longDeadline() {
  return Deadline::after(std::chrono::seconds(30));
}

// Sets `flag` when it goes out of scope, so that a rank waiting for it is
// released even when an assertion returns early.
struct SetOnExit {
  std::atomic<bool>& flag;
  ~SetOnExit() { flag = true; }
};

// The unexpected-data accounting of the shared engine (both transports are
// Engines).
uint64_t stagedBytes(Context& c, int peer) {
  return dynamic_cast<transport::Engine&>(c).stagedBytes(peer);
}

class TransportContract : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()).rfind("verbs", 0) == 0) device_.emplace();
  }
  void TearDown() override {
    device_.reset();
    unsetenv("GFLOW_UNEXPECTED_LIMIT");
    params::resetCacheForTesting();
  }

  std::vector<std::exception_ptr> run(int n, const std::function<void(Context&)>& body,
                                      milliseconds timeout = std::chrono::seconds(30)) {
    return testing::runContexts(GetParam(), n, body, timeout);
  }

 private:
  std::optional<testing::softverbs::Installed> device_;
};

// Sizes below and above the verbs eager size of the tests (512 bytes), and
// a multi-fragment one; the last is small so that it arrives behind the
// others on every wire.
const std::vector<size_t> kSizes = {0, 1, 100, 512, 513, 4096, 100000, 8};

TEST_P(TransportContract, ReceivesMatchByTagInAnyOrderAndEarlyMessagesAreStaged) {
  expectNoErrors(run(2, [&](Context& c) {
    c.beginGroup(1, kEnv);
    const int peer = 1 - c.rank();
    const size_t k = kSizes.size();
    std::vector<std::vector<char>> in(k);
    for (size_t i = 0; i < k; ++i) in[i].assign(kSizes[i] + 1, 0);
    if (c.rank() == 0) {
      std::vector<std::vector<char>> out;
      std::vector<RequestPtr> sends;
      for (size_t i = 0; i < k; ++i) out.push_back(pattern(kSizes[i], int(i)));
      for (size_t i = 0; i < k; ++i)
        sends.push_back(c.isend(peer, out[i].data(), kSizes[i], Tag{1, i}, kEnv));
      for (auto& s : sends) c.wait(s, longDeadline());
      // The last word: rank 1 has matched everything.
      char done = 0;
      c.wait(c.irecv(peer, &done, 1, Tag{1, 100}, kEnv), longDeadline());
      EXPECT_EQ(c.peerStats(peer).messagesSent, k);
      return;
    }
    // The last message first: the small ones before it arrive meanwhile and
    // are staged (no receive asks for them yet).
    c.wait(c.irecv(peer, in[k - 1].data(), kSizes[k - 1], Tag{1, k - 1}, kEnv), longDeadline());
    EXPECT_GT(stagedBytes(c, peer), 0u);
    std::vector<RequestPtr> recvs;
    for (size_t i = k - 1; i-- > 0;)
      recvs.push_back(c.irecv(peer, in[i].data(), kSizes[i], Tag{1, i}, kEnv));
    for (auto& r : recvs) c.wait(r, longDeadline());
    for (size_t i = 0; i < k; ++i) {
      const std::vector<char> want = pattern(kSizes[i], int(i));
      if (kSizes[i] > 0) {
        EXPECT_EQ(0, std::memcmp(in[i].data(), want.data(), kSizes[i])) << i;
      }
      EXPECT_EQ(in[i][kSizes[i]], 0) << "wrote past the receive of " << kSizes[i] << " bytes";
    }
    EXPECT_EQ(stagedBytes(c, peer), 0u);
    EXPECT_EQ(c.peerStats(peer).messagesReceived, k);
    char done = 1;
    c.wait(c.isend(peer, &done, 1, Tag{1, 100}, kEnv), longDeadline());
  }));
}

// Point-to-point messages (kPointToPointGroup tags) stand outside the op
// order: ones that arrive before, during and after other ops' groups are
// neither stale nor a mismatch, and arrived() finds them before a receive
// is posted, whatever their size (staged, or announced by the wire).
TEST_P(TransportContract, PointToPointMessagesSkipTheOpChecksAndArrivedFindsThem) {
  const uint64_t p2p = transport::kPointToPointGroup | 7;
  expectNoErrors(run(2, [&](Context& c) {
    const int peer = 1 - c.rank();
    const std::vector<size_t> sizes = {0, 100, 513, 100000};
    if (c.rank() == 0) {
      c.beginGroup(5, kEnv);
      std::vector<std::vector<char>> out;
      for (size_t i = 0; i < sizes.size(); ++i) out.push_back(pattern(sizes[i], int(i)));
      std::vector<RequestPtr> sends;
      for (size_t i = 0; i < sizes.size(); ++i) {
        sends.push_back(c.isend(peer, out[i].data(), sizes[i], Tag{p2p, i}, kOther));
      }
      for (auto& s : sends) c.wait(s, longDeadline());
      char done = 0;
      c.wait(c.irecv(peer, &done, 1, Tag{9, 0}, kEnv), longDeadline());
      return;
    }
    // Rank 1 runs ops 8 and 9 meanwhile: the messages are from neither.
    c.beginGroup(8, kEnv);
    const Deadline d = longDeadline();
    for (size_t i = 0; i < sizes.size(); ++i) {
      while (!c.arrived(peer, Tag{p2p, i})) {
        ASSERT_FALSE(d.expired()) << "message " << i << " never arrived";
        c.poll();
      }
    }
    EXPECT_FALSE(c.arrived(peer, Tag{p2p, sizes.size()}));
    c.beginGroup(9, kEnv);
    for (size_t i = sizes.size(); i-- > 0;) {
      std::vector<char> in(sizes[i] + 1, 0);
      c.wait(c.irecv(peer, in.data(), sizes[i], Tag{p2p, i}, kOther), longDeadline());
      const std::vector<char> want = pattern(sizes[i], int(i));
      if (sizes[i] > 0) {
        EXPECT_EQ(0, std::memcmp(in.data(), want.data(), sizes[i])) << i;
      }
      EXPECT_EQ(in[sizes[i]], 0);
      EXPECT_FALSE(c.arrived(peer, Tag{p2p, i})) << "a received message still counts as arrived";
    }
    char done = 1;
    c.wait(c.isend(peer, &done, 1, Tag{9, 0}, kEnv), longDeadline());
  }));
}

TEST_P(TransportContract, UnexpectedDataStaysWithinTheLimitAndArrivesIntact) {
  setenv("GFLOW_UNEXPECTED_LIMIT", "64K", 1);
  params::resetCacheForTesting();
  constexpr int kMsgs = 24;
  constexpr size_t kBytes = 48 << 10;  // one fits the limit, two do not
  expectNoErrors(run(2, [&](Context& c) {
    c.beginGroup(1, kEnv);
    const int peer = 1 - c.rank();
    if (c.rank() == 0) {
      std::vector<std::vector<char>> out;
      std::vector<RequestPtr> sends;
      for (int i = 0; i < kMsgs; ++i) out.push_back(pattern(kBytes, i));
      for (int i = 0; i < kMsgs; ++i)
        sends.push_back(c.isend(peer, out[i].data(), kBytes, Tag{1, uint64_t(i)}, kEnv));
      for (auto& s : sends) c.wait(s, longDeadline());
      return;
    }
    // Something to wait on while the flood arrives: the sender's messages
    // pile up against the limit (the wire holds the rest back).
    std::vector<char> first(kBytes);
    RequestPtr r0 = c.irecv(peer, first.data(), kBytes, Tag{1, 0}, kEnv);
    std::this_thread::sleep_for(milliseconds(100));
    c.wait(r0, longDeadline());
    EXPECT_EQ(0, std::memcmp(first.data(), pattern(kBytes, 0).data(), kBytes));
    for (int i = 1; i < kMsgs; ++i) {
      EXPECT_LE(stagedBytes(c, peer), uint64_t{64} << 10);
      std::vector<char> in(kBytes);
      c.wait(c.irecv(peer, in.data(), kBytes, Tag{1, uint64_t(i)}, kEnv), longDeadline());
      ASSERT_EQ(0, std::memcmp(in.data(), pattern(kBytes, i).data(), kBytes)) << "message " << i;
    }
    EXPECT_EQ(stagedBytes(c, peer), 0u);
  }));
}

TEST_P(TransportContract, EnvelopeMismatchFailsTheReceiverNamingThePeer) {
  for (size_t bytes : {size_t{64}, size_t{3000}}) {
    for (bool recvFirst : {true, false}) {
      auto errs = run(
          2,
          [&](Context& c) {
            std::vector<char> buf(bytes);
            const Envelope& mine = c.rank() == 0 ? kEnv : kOther;
            c.beginGroup(1, mine);
            RequestPtr r;
            if (c.rank() == 0) {
              if (recvFirst) std::this_thread::sleep_for(milliseconds(50));
              r = c.isend(1, buf.data(), bytes, Tag{1, 0}, mine);
            } else {
              if (!recvFirst) std::this_thread::sleep_for(milliseconds(50));
              r = c.irecv(0, buf.data(), bytes, Tag{1, 0}, mine);
            }
            waitOrNotify(c, r, std::chrono::seconds(20));
          },
          std::chrono::seconds(20));
      const std::string what =
          std::to_string(bytes) + " bytes, receive first " + (recvFirst ? "yes" : "no");
      ASSERT_TRUE(errs[1]) << what;
      const Error e = errorOf(errs[1]);
      EXPECT_EQ(e.code(), ErrorCode::kMismatch) << what << ": " << e.what();
      EXPECT_EQ(e.peer(), 0) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
      if (errs[0]) {
        EXPECT_NE(errorOf(errs[0]).code(), ErrorCode::kTimeout) << what;
      }
    }
  }
}

TEST_P(TransportContract, AbortFromAnotherThreadFailsEveryPendingRequestAndWakesTheWaiter) {
  std::atomic<bool> done{false};
  auto errs = run(2, [&](Context& c) {
    c.beginGroup(1, kEnv);
    if (c.rank() == 1) {  // stays connected, sends nothing
      while (!done) std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    SetOnExit release{done};
    char a = 0, b = 0;
    RequestPtr waited = c.irecv(1, &a, 1, Tag{1, 0}, kEnv);
    RequestPtr other = c.irecv(1, &b, 1, Tag{1, 1}, kEnv);
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(100));
      c.abort(Error(ErrorCode::kAborted, "aborted by the test", ErrorContext{}));
    });
    try {
      c.wait(waited, Deadline::after(std::chrono::seconds(60)));
      ADD_FAILURE() << "wait returned after abort";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
    }
    aborter.join();
    EXPECT_TRUE(waited->failed());
    ASSERT_TRUE(other->failed());
    EXPECT_EQ(other->error().code(), ErrorCode::kAborted);
    ASSERT_TRUE(c.error());
    EXPECT_EQ(c.error()->code(), ErrorCode::kAborted);
    EXPECT_THROW(c.isend(1, &a, 1, Tag{2, 0}, kEnv), Error);
    // A second error does not replace the first.
    c.abort(Error(ErrorCode::kInternal, "later", ErrorContext{}));
    EXPECT_EQ(c.error()->code(), ErrorCode::kAborted);
  });
  done = true;
  for (auto& e : errs) EXPECT_FALSE(e) << errorOf(e).what();
}

// Rank 0 times out on rank 1. A rank 1 that is inside the transport (waiting
// on something else itself) answers the probe: rank 0 blames the chain
// beyond it. A rank 1 that does not run the transport at all is blamed as
// not responding. Either way the error names rank 1.
TEST_P(TransportContract, TimeoutSaysWhetherTheSilentPeerIsAliveAndBlamesIt) {
  for (bool peerWaits : {true, false}) {
    std::atomic<bool> done{false};
    auto errs = run(
        2,
        [&](Context& c) {
          c.beginGroup(1, kEnv);
          char b = 0;
          if (c.rank() == 0) {
            SetOnExit release{done};
            auto r = c.irecv(1, &b, 1, Tag{1, 0}, kEnv);
            c.wait(r, Deadline::after(milliseconds(200)));
          } else if (peerWaits) {
            auto r = c.irecv(0, &b, 1, Tag{1, 1}, kEnv);
            try {
              c.wait(r, Deadline::after(std::chrono::seconds(20)));
            } catch (const Error&) {
              // rank 0 left: expected.
            }
          } else {
            while (!done) std::this_thread::sleep_for(milliseconds(5));
          }
        },
        std::chrono::seconds(1));
    ASSERT_TRUE(errs[0]) << "peer waits " << peerWaits;
    const Error e = errorOf(errs[0]);
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    EXPECT_EQ(e.peer(), 1) << e.what();
    const std::string want =
        peerWaits ? "rank 1 is alive but waiting itself" : "rank 1 is not responding";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// poll() answers probes: a rank 1 that only polls (what the hook of a
// companion transport does while its own wait sleeps) is alive. Rank 0's
// sleeping wait runs its own hook (Context::setWhileWaiting).
TEST_P(TransportContract, PollAnswersTheProbeAndSleepingWaitsRunTheHook) {
  std::atomic<bool> done{false};
  std::atomic<int> hookRuns{0};
  auto errs = run(
      2,
      [&](Context& c) {
        c.beginGroup(1, kEnv);
        if (c.rank() == 1) {
          try {
            while (!done) {
              c.poll();
              std::this_thread::sleep_for(milliseconds(5));
            }
          } catch (const Error&) {
            // rank 0 left: expected.
          }
          return;
        }
        SetOnExit release{done};
        c.setWhileWaiting([&] { ++hookRuns; });
        char b = 0;
        auto r = c.irecv(1, &b, 1, Tag{1, 0}, kEnv);
        c.wait(r, Deadline::after(milliseconds(200)));
      },
      std::chrono::seconds(1));
  ASSERT_TRUE(errs[0]);
  const Error e = errorOf(errs[0]);
  EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  EXPECT_NE(std::string(e.what()).find("rank 1 is alive but waiting itself"), std::string::npos)
      << e.what();
  EXPECT_GT(hookRuns.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportContract,
                         ::testing::Values("tcp", "tcp_single_copy", "tcp_lazy", "verbs",
                                           "verbs_lazy"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param);
                         });

}  // namespace
}  // namespace gflow
