// Single copy between the ranks of one host over the TCP wire
// (tcp_single_copy.cc), ranks as threads (one process reads itself as a
// peer process would): messages from GFLOW_LOCAL_SINGLE_COPY bytes on (4 KiB
// in the tests) are read from the sender's buffer once the receive is
// posted, and the send completes only then; smaller ones go over the wire;
// a receive of another size is a mismatch that writes nothing; a receive
// that never comes is the sender's timeout naming the receiver. The general
// contract on this wire runs in contract_test.cc ("tcp_single_copy").
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gflow/gflow.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "transport/transport.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using testing::errorOf;
using testing::expectNoErrors;
using testing::pattern;
using transport::Context;
using transport::Envelope;
using transport::RequestPtr;
using transport::Tag;

constexpr Envelope kEnv{{1, 2, 3}};
constexpr size_t kBig = 100000;  // single copy
constexpr size_t kSmall = 4095;  // below the threshold: over the wire

Deadline longDeadline() {
  return Deadline::after(std::chrono::seconds(30));
}

std::vector<std::exception_ptr> run(const std::function<void(Context&)>& body,
                                    milliseconds timeout = std::chrono::seconds(30)) {
  return testing::runContexts("tcp_single_copy", 2, body, timeout);
}

TEST(TcpSingleCopy, LargeSendsAreReadFromTheSendersBufferOnceTheReceiveIsPosted) {
  std::atomic<bool> checked{false};
  expectNoErrors(run([&](Context& c) {
    c.beginGroup(1, kEnv);
    const int peer = 1 - c.rank();
    if (c.rank() == 0) {
      const std::vector<char> big = pattern(kBig, 1), small = pattern(kSmall, 2);
      RequestPtr s = c.isend(peer, big.data(), kBig, Tag{1, 0}, kEnv);
      RequestPtr t = c.isend(peer, small.data(), kSmall, Tag{1, 1}, kEnv);
      c.wait(t, longDeadline());  // over the wire: done without a receive
      for (int i = 0; i < 20; ++i) {
        EXPECT_FALSE(c.test(s)) << "a single-copy send completed before its receive was posted";
        std::this_thread::sleep_for(milliseconds(2));
      }
      checked = true;
      c.wait(s, longDeadline());
      const PeerStats st = c.peerStats(peer);
      EXPECT_EQ(st.singleCopyBytesSent, kBig);
      EXPECT_EQ(st.bytesSent, kBig + kSmall);
      EXPECT_EQ(st.messagesSent, 2u);
      return;
    }
    const Deadline d = longDeadline();
    while (!checked || !c.arrived(peer, Tag{1, 0})) {
      ASSERT_FALSE(d.expired());
      c.poll();
      std::this_thread::sleep_for(milliseconds(1));
    }
    std::vector<char> in(kBig + 1, 0), in2(kSmall + 1, 0);
    c.wait(c.irecv(peer, in.data(), kBig, Tag{1, 0}, kEnv), longDeadline());
    c.wait(c.irecv(peer, in2.data(), kSmall, Tag{1, 1}, kEnv), longDeadline());
    EXPECT_EQ(0, std::memcmp(in.data(), pattern(kBig, 1).data(), kBig));
    EXPECT_EQ(0, std::memcmp(in2.data(), pattern(kSmall, 2).data(), kSmall));
    EXPECT_EQ(in[kBig], 0) << "wrote past the receive";
    EXPECT_EQ(c.peerStats(peer).bytesReceived, kBig + kSmall);
    EXPECT_EQ(c.peerStats(peer).singleCopyBytesSent, 0u);
  }));
}

// Posted before or after the header arrives: both orders read the message.
TEST(TcpSingleCopy, ReceivesPostedBeforeOrAfterTheHeaderBothArrive) {
  expectNoErrors(run([&](Context& c) {
    c.beginGroup(1, kEnv);
    const int peer = 1 - c.rank();
    std::vector<std::vector<char>> in(4, std::vector<char>(kBig, 0));
    std::vector<RequestPtr> reqs;
    if (c.rank() == 1) {
      for (uint64_t i : {0, 2}) reqs.push_back(c.irecv(peer, in[i].data(), kBig, Tag{1, i}, kEnv));
    }
    std::vector<std::vector<char>> out;
    for (uint64_t i = 0; i < 4; ++i) out.push_back(pattern(kBig, int(10 * c.rank() + i)));
    for (uint64_t i = 0; i < 4 && c.rank() == 0; ++i) {
      reqs.push_back(c.isend(peer, out[i].data(), kBig, Tag{1, i}, kEnv));
    }
    if (c.rank() == 1) {
      for (uint64_t i : {1, 3}) reqs.push_back(c.irecv(peer, in[i].data(), kBig, Tag{1, i}, kEnv));
    }
    for (auto& r : reqs) c.wait(r, longDeadline());
    for (uint64_t i = 0; i < 4 && c.rank() == 1; ++i) {
      EXPECT_EQ(in[i], pattern(kBig, int(i))) << i;
    }
  }));
}

TEST(TcpSingleCopy, AReceiveOfAnotherSizeIsAMismatchThatWritesNothing) {
  std::vector<char> in(kBig, 0);
  auto errs = run(
      [&](Context& c) {
        c.beginGroup(1, kEnv);
        const int peer = 1 - c.rank();
        const std::vector<char> out = pattern(kBig, 3);
        RequestPtr r = c.rank() == 0 ? c.isend(peer, out.data(), kBig, Tag{1, 0}, kEnv)
                                     : c.irecv(peer, in.data(), kBig - 4, Tag{1, 0}, kEnv);
        testing::waitOrNotify(c, r, milliseconds(20000));
      },
      std::chrono::seconds(20));
  ASSERT_TRUE(errs[1]);
  const Error e = errorOf(errs[1]);
  EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
  EXPECT_EQ(e.peer(), 0) << e.what();
  EXPECT_TRUE(errs[0]) << "the sender must fail too";
  EXPECT_EQ(in, std::vector<char>(kBig, 0)) << "a mismatched receive was written";
}

TEST(TcpSingleCopy, ASendNobodyReceivesTimesOutNamingTheReceiver) {
  std::atomic<bool> done{false};
  auto errs = run(
      [&](Context& c) {
        c.beginGroup(1, kEnv);
        if (c.rank() == 1) {
          while (!done) {  // alive: answers the probe, never receives
            try {
              c.poll();
            } catch (const Error&) {
              return;
            }
            std::this_thread::sleep_for(milliseconds(5));
          }
          return;
        }
        struct Release {
          std::atomic<bool>& f;
          ~Release() { f = true; }
        } release{done};
        const std::vector<char> out = pattern(kBig, 4);
        c.wait(c.isend(1, out.data(), kBig, Tag{1, 0}, kEnv), Deadline::after(milliseconds(300)));
      },
      std::chrono::seconds(1));
  ASSERT_TRUE(errs[0]);
  const Error e = errorOf(errs[0]);
  EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  EXPECT_EQ(e.peer(), 1) << e.what();
}

}  // namespace
}  // namespace gflow
