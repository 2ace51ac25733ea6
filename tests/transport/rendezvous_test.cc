// Rendezvous on the TCP wire (tcp_rendezvous.cc), ranks as threads:
//   - between hosts: messages from GFLOW_RENDEZVOUS bytes on (64 KiB in the
//     tests) wait with their sender until the receive is posted, and are
//     never staged, and so do a collective's in an op that posts its
//     receives first; a receive of another size is a mismatch on both sides;
//   - single copy (one process reads itself as a peer process would):
//     messages from GFLOW_LOCAL_SINGLE_COPY bytes on (4 KiB in the tests)
//     are read from the sender's buffer once the receive is posted, and the
//     send completes only then; smaller ones go over the wire; a receive of
//     another size is a mismatch that writes nothing; a receive that never
//     comes is the sender's timeout naming the receiver;
//   - forged rendezvous frames (data before the receiver's CLEAR, an
//     address nobody agreed to, a READ of nothing) fail the receiver as
//     protocol errors naming the peer.
// The general contract on these wires runs in contract_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/params.h"
#include "common/socket.h"
#include "gflow/gflow.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "testing/scoped_env.h"
#include "transport/contract.h"
#include "transport/engine.h"
#include "transport/tcp/tcp_context.h"
#include "transport/transport.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using testing::errorOf;
using testing::expectNoErrors;
using ::testing::HasSubstr;
using testing::pattern;
using transport::Context;
using transport::Envelope;
using transport::RequestPtr;
using transport::Tag;
using transport::tcp::FrameHeader;

constexpr Envelope kEnv{{1, 2, 3}};
constexpr size_t kBig = 100000;  // single copy
constexpr size_t kSmall = 4095;  // below the threshold: over the wire

Deadline longDeadline() {
  return Deadline::after(std::chrono::seconds(30));
}

std::vector<std::exception_ptr> run(const std::function<void(Context&)>& body,
                                    milliseconds timeout = std::chrono::seconds(30),
                                    const char* wire = "tcp_single_copy") {
  return testing::runContexts(wire, 2, body, timeout);
}

constexpr size_t kHuge = 1 << 20;  // beyond GFLOW_RENDEZVOUS (64 KiB in the tests)

// Polls `s` for a while: it must stay pending (no receive is posted).
void expectHeld(Context& c, const RequestPtr& s) {
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(c.test(s)) << "a held send completed before its receive was posted";
    std::this_thread::sleep_for(milliseconds(2));
  }
}

// Polls until the sender has checked its send (`checked`) and the header of
// tag {1, 0} has arrived.
void awaitHeader(Context& c, int peer, const std::atomic<bool>& checked) {
  const Deadline d = longDeadline();
  while (!checked || !c.arrived(peer, Tag{1, 0})) {
    ASSERT_FALSE(d.expired());
    c.poll();
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// A frame header of tag {1, 0} with kEnv.
FrameHeader header(uint16_t type, uint64_t len, uint64_t offset, uint64_t fragLen) {
  return FrameHeader{
      transport::tcp::kFrameMagic, type, 0, 1, 0, len, offset, fragLen, {1, 2, 3}, {}};
}

uint64_t stagedBytes(Context& c, int peer) {
  return dynamic_cast<transport::Engine&>(c).stagedBytes(peer);
}

TEST(TcpRendezvous, LargeSendsWaitForTheReceiveAndAreNeverStaged) {
  std::atomic<bool> checked{false};
  expectNoErrors(run(
      [&](Context& c) {
        c.beginGroup(1, kEnv);
        const int peer = 1 - c.rank();
        if (c.rank() == 0) {
          const std::vector<char> out = pattern(kHuge, 5);
          RequestPtr s = c.isend(peer, out.data(), kHuge, Tag{1, 0}, kEnv);
          expectHeld(c, s);
          checked = true;
          c.wait(s, longDeadline());
          EXPECT_EQ(c.peerStats(peer).singleCopyBytesSent, 0u);
          return;
        }
        awaitHeader(c, peer, checked);
        EXPECT_LE(stagedBytes(c, peer), transport::kStagedOverhead) << "the payload came early";
        std::vector<char> in(kHuge + 1, 0);
        c.wait(c.irecv(peer, in.data(), kHuge, Tag{1, 0}, kEnv), longDeadline());
        EXPECT_EQ(0, std::memcmp(in.data(), pattern(kHuge, 5).data(), kHuge));
        EXPECT_EQ(in[kHuge], 0) << "wrote past the receive";
        EXPECT_EQ(stagedBytes(c, peer), 0u);
      },
      std::chrono::seconds(30), "tcp"));
}

// A collective's message of 100 KB is below the collective threshold (16
// times 64 KiB in the tests) and goes at once, staged by a receiver that
// has not reached the op; in an op that posts its receives first
// (receivesPostedFirst: all-to-all) it waits from the point-to-point size,
// and a receiver that posts late gets it in place.
TEST(TcpRendezvous, AnOpThatPostsItsReceivesFirstHoldsItsMessagesFromThePointToPointSize) {
  for (bool receivesFirst : {false, true}) {
    std::atomic<bool> sent{false};
    std::atomic<uint64_t> staged{0};
    expectNoErrors(run(
        [&](Context& c) {
          const int peer = 1 - c.rank();
          const std::vector<char> out = pattern(kBig, 6 + c.rank());
          std::vector<char> in(kBig + 1, 0);
          if (c.rank() == 1) {  // behind: its peer's message arrives first
            const Deadline d = longDeadline();
            while (!sent || !c.arrived(peer, Tag{1, 0})) {
              ASSERT_FALSE(d.expired());
              c.poll();
              std::this_thread::sleep_for(milliseconds(1));
            }
            staged = stagedBytes(c, peer);
          }
          c.beginGroup(1, kEnv);
          if (receivesFirst) c.receivesPostedFirst();
          RequestPtr r = c.irecv(peer, in.data(), kBig, Tag{1, 0}, kEnv);
          RequestPtr s = c.isend(peer, out.data(), kBig, Tag{1, 0}, kEnv);
          if (c.rank() == 0) sent = true;
          c.wait(r, longDeadline());
          c.wait(s, longDeadline());
          EXPECT_EQ(0, std::memcmp(in.data(), pattern(kBig, 6 + peer).data(), kBig));
          EXPECT_EQ(in[kBig], 0) << "wrote past the receive";
        },
        std::chrono::seconds(30), "tcp"));
    if (receivesFirst) {
      EXPECT_LE(staged, transport::kStagedOverhead) << "the payload came early";
    } else {
      EXPECT_GE(staged, kBig) << "without the hint the message goes at once";
    }
  }
}

// Four sockets per peer: a message whose CLEAR crossed its RENDEZVOUS is
// striped over all of them, so its data can arrive before its header; the
// late header is dropped, never taken for a new message (which would fail
// the next op as stale, or hold staging forever).
TEST(TcpRendezvous, DataStripedAheadOfItsHeaderIsReceivedOnce) {
  testing::ScopedEnv sockets("GFLOW_SOCKETS_PER_PEER", "4");
  params::resetCacheForTesting();
  constexpr int kMsgs = 24;
  expectNoErrors(run(
      [&](Context& c) {
        c.beginGroup(1, kEnv);
        const int peer = 1 - c.rank();
        // A slow first connection (the one headers take): a header queues
        // behind data there while the data of its message, released by a
        // CLEAR, goes on the others.
        if (c.rank() == 0) {
          dynamic_cast<transport::tcp::TcpContext&>(c).setSendBufferForTesting(peer, 0, 4096);
        }
        std::vector<std::vector<char>> bufs;
        for (int i = 0; i < kMsgs; ++i) bufs.push_back(pattern(kHuge, c.rank() == 0 ? i : -1));
        std::vector<RequestPtr> reqs;
        for (int i = 0; i < kMsgs; ++i) {
          const Tag tag{1, uint64_t(i)};
          if (c.rank() == 0) {
            reqs.push_back(c.isend(peer, bufs[i].data(), kHuge, tag, kEnv));
          } else {
            // Some posted before their header arrives (cleared ahead),
            // most after (held, then released on the CLEAR).
            if (i % 3 == 0) std::this_thread::sleep_for(milliseconds(1));
            reqs.push_back(c.irecv(peer, bufs[i].data(), kHuge, tag, kEnv));
          }
          c.poll();
        }
        for (auto& r : reqs) c.wait(r, longDeadline());
        char done = 0;
        c.beginGroup(2, kEnv);
        if (c.rank() == 0) {
          c.wait(c.isend(peer, &done, 1, Tag{2, 0}, kEnv), longDeadline());
          return;
        }
        for (int i = 0; i < kMsgs; ++i) ASSERT_EQ(bufs[i], pattern(kHuge, i)) << i;
        c.wait(c.irecv(peer, &done, 1, Tag{2, 0}, kEnv), longDeadline());
        const Deadline settle = Deadline::after(milliseconds(50));
        while (!settle.expired()) c.poll();  // late headers arrive meanwhile
        EXPECT_EQ(stagedBytes(c, peer), 0u) << "a late header was kept as a message";
      },
      std::chrono::seconds(30), "tcp"));
  params::resetCacheForTesting();
}

// The same crossing, forced: rank 1 posts a large receive (CLEAR ahead);
// its data comes on connection 1 marked as released by a CLEAR, and only
// after rank 1 has received it does the RENDEZVOUS come on connection 0.
// It is dropped: the next op starts clean and nothing stays staged.
TEST(TcpRendezvous, ALateHeaderOfAMessageReceivedOnItsClearIsDropped) {
  testing::ScopedEnv sockets("GFLOW_SOCKETS_PER_PEER", "2");
  params::resetCacheForTesting();
  std::atomic<bool> received{false};
  expectNoErrors(run(
      [&](Context& c) {
        c.beginGroup(1, kEnv);
        const int peer = 1 - c.rank();
        if (c.rank() == 0) {
          auto& t = dynamic_cast<transport::tcp::TcpContext&>(c);
          const std::vector<char> data = pattern(kHuge, 8);
          FrameHeader h = header(transport::tcp::kFrameData, kHuge, 0, kHuge);
          h.reserved = transport::tcp::kReleased;
          net::sendAll(t.socketForTesting(peer, 1), &h, sizeof(h), longDeadline());
          net::sendAll(t.socketForTesting(peer, 1), data.data(), kHuge, longDeadline());
          while (!received) std::this_thread::sleep_for(milliseconds(1));
          h = header(transport::tcp::kFrameRendezvous, kHuge, 0, 0);
          net::sendAll(t.socketForTesting(peer, 0), &h, sizeof(h), longDeadline());
          char done = 0;
          c.beginGroup(2, kEnv);
          c.wait(c.isend(peer, &done, 1, Tag{2, 0}, kEnv), longDeadline());
          c.wait(c.irecv(peer, &done, 1, Tag{2, 1}, kEnv), longDeadline());  // rank 1 is done
          return;
        }
        std::vector<char> in(kHuge, 0);
        c.wait(c.irecv(peer, in.data(), kHuge, Tag{1, 0}, kEnv), longDeadline());
        EXPECT_EQ(in, pattern(kHuge, 8));
        received = true;
        char done = 1;
        c.beginGroup(2, kEnv);
        c.wait(c.irecv(peer, &done, 1, Tag{2, 0}, kEnv), longDeadline());
        const Deadline settle = Deadline::after(milliseconds(50));
        while (!settle.expired()) c.poll();
        EXPECT_EQ(stagedBytes(c, peer), 0u) << "the late header was kept as a message";
        c.wait(c.isend(peer, &done, 1, Tag{2, 1}, kEnv), longDeadline());
      },
      std::chrono::seconds(30), "tcp"));
  params::resetCacheForTesting();
}

// A receive posted first clears ahead; one posted for another size is a
// mismatch on the receiver (its buffer untouched) and the sender.
TEST(TcpRendezvous, AReceiveOfAnotherSizeIsAMismatchOnBothSides) {
  for (bool receiveFirst : {true, false}) {
    std::vector<char> in(kHuge, 0);
    std::atomic<bool> posted{false};
    auto errs = run(
        [&](Context& c) {
          c.beginGroup(1, kEnv);
          const std::vector<char> out = pattern(kHuge, 6);
          if (c.rank() == 1) {
            RequestPtr r = c.irecv(0, in.data(), kHuge - 8, Tag{1, 0}, kEnv);
            posted = true;
            testing::waitOrNotify(c, r, milliseconds(20000));
            return;
          }
          while (receiveFirst && !posted) std::this_thread::sleep_for(milliseconds(1));
          testing::waitOrNotify(c, c.isend(1, out.data(), kHuge, Tag{1, 0}, kEnv),
                                milliseconds(20000));
        },
        std::chrono::seconds(20), "tcp");
    ASSERT_TRUE(errs[1]) << receiveFirst;
    const Error e = errorOf(errs[1]);
    EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
    EXPECT_EQ(e.peer(), 0) << e.what();
    ASSERT_TRUE(errs[0]) << "the sender must fail too";
    EXPECT_EQ(in, std::vector<char>(kHuge, 0)) << "a mismatched receive was written";
  }
}

// Rank 0 writes `frames` (headers, no payload unless `payload`) straight
// onto its socket to rank 1, which polls (or receives tag {1, 0} of
// `recvLen` bytes when nonzero) and must fail naming rank 0.
Error forged(const std::vector<FrameHeader>& frames, size_t payload, size_t recvLen) {
  std::exception_ptr got;
  std::vector<char> buf(recvLen + 1, 0);
  auto errs = testing::runContexts(
      "tcp", 2,
      [&](Context& c) {
        c.beginGroup(1, kEnv);
        if (c.rank() == 0) {
          auto& t = dynamic_cast<transport::tcp::TcpContext&>(c);
          const std::vector<char> data = pattern(payload, 7);
          for (const FrameHeader& h : frames) {
            net::sendAll(t.socketForTesting(1, 0), &h, sizeof(h), longDeadline());
            if (h.type == transport::tcp::kFrameData && payload > 0) {
              net::sendAll(t.socketForTesting(1, 0), data.data(), payload, longDeadline());
            }
          }
          std::this_thread::sleep_for(milliseconds(500));  // rank 1 reads before EOF
          return;
        }
        try {
          const Deadline d = Deadline::after(milliseconds(10000));
          if (recvLen > 0) {
            c.wait(c.irecv(0, buf.data(), recvLen, Tag{1, 0}, kEnv), d);
          } else {
            while (!d.expired()) c.poll();
          }
        } catch (const Error&) {
          got = std::current_exception();
        }
      },
      milliseconds(20000));
  expectNoErrors(errs);
  EXPECT_EQ(buf, std::vector<char>(recvLen + 1, 0)) << "a forged frame wrote into the receive";
  return errorOf(got);
}

TEST(TcpRendezvous, ForgedRendezvousFramesAreProtocolErrorsNamingThePeer) {
  namespace tcp = transport::tcp;
  // Data for a message announced by RENDEZVOUS before any CLEAR, with and
  // without a receive posted meanwhile.
  for (size_t recvLen : {size_t(0), size_t(4096)}) {
    const Error e = forged(
        {header(tcp::kFrameRendezvous, 4096, 0, 0), header(tcp::kFrameData, 4096, 1 << 20, 4096)},
        4096, recvLen);
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
    EXPECT_EQ(e.peer(), 0) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("invalid frame from rank 0"));
  }
  // An address, between ranks that never agreed on single copy.
  Error e = forged({header(tcp::kFrameRendezvous, 4096, 0x10000, 0)}, 0, 4096);
  EXPECT_THAT(e.what(), HasSubstr("never offered"));
  // A READ of a message never sent.
  e = forged({header(tcp::kFrameRead, 4096, 0, 0)}, 0, 0);
  EXPECT_THAT(e.what(), HasSubstr("did not send"));
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
      expectHeld(c, s);
      checked = true;
      c.wait(s, longDeadline());
      const PeerStats st = c.peerStats(peer);
      EXPECT_EQ(st.singleCopyBytesSent, kBig);
      EXPECT_EQ(st.bytesSent, kBig + kSmall);
      EXPECT_EQ(st.messagesSent, 2u);
      return;
    }
    awaitHeader(c, peer, checked);
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
