// Local rings (transport/local/ring.h, tcp/tcp_polled.cc):
//   - the ring itself, two sides in this process: bytes cross the wrap-around
//     intact and in order, a full ring takes only what fits, an empty one
//     gives nothing, words of the peer that make no sense break the ring
//     instead of reading out of it, and a side that sleeps is woken once
//     per sleep, for data only when it wants data, for room only when it
//     waits for room and half its ring is free;
//   - the TCP wire between two ranks of one host (threads of this process
//     prove to each other that they read each other's memory, as processes
//     would): frames go through the rings, messages of every size arrive
//     intact in both directions at once through a ring of 4 KiB (wrapping
//     and full all the time), a receiver asleep in epoll is woken by a
//     DOORBELL, and a writer waiting for room is woken by its reader.
// The transport contract on this wire runs in contract_test.cc
// (tcp_single_copy), the process faults in tests/faults.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "testing/contexts.h"
#include "testing/ranks.h"
#include "testing/scoped_env.h"
#include "transport/local/ring.h"
#include "transport/tcp/tcp_context.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using testing::expectNoErrors;
using testing::pattern;
using transport::Context;
using transport::Envelope;
using transport::RequestPtr;
using transport::Tag;
using LocalRing = transport::local::Ring;
using transport::tcp::TcpContext;

constexpr size_t kCap = 4096;

// Two sides of a pair in this process; `rawB` is B's segment as B writes
// it, so a test can corrupt B's words.
struct Pair {
  Mapping rawB;
  std::unique_ptr<LocalRing> a, b;
};

Mapping readOnly(const Mapping& m) {
  std::string why;
  Mapping r = Mapping::open(::getpid(), m.fd(), m.size(), &why, /*readOnly=*/true);
  EXPECT_TRUE(r.data()) << why;
  return r;
}

// Mapping::open of this process's own memfd again, writable.
Mapping writable(const Mapping& m) {
  std::string why;
  Mapping r = Mapping::open(::getpid(), m.fd(), m.size(), &why);
  EXPECT_TRUE(r.data()) << why;
  return r;
}

Pair makePair() {
  Mapping segA = LocalRing::create(kCap), segB = LocalRing::create(kCap);
  Pair p;
  p.rawB = writable(segB);
  Mapping aSeesB = readOnly(segB), bSeesA = readOnly(segA);
  p.a = std::make_unique<LocalRing>(std::move(segA), kCap, std::move(aSeesB), kCap);
  p.b = std::make_unique<LocalRing>(std::move(segB), kCap, std::move(bSeesA), kCap);
  return p;
}

size_t writeBytes(LocalRing& r, const char* data, size_t n) {
  const iovec iov{const_cast<char*>(data), n};
  return r.write(&iov, 1);
}

TEST(LocalRing, BytesCrossTheWrapAroundIntactAndInOrder) {
  Pair p = makePair();
  const std::vector<char> data = pattern(1 << 20, 7);
  std::vector<char> got;
  size_t sent = 0;
  // Pieces of odd sizes, written as two iovecs, read in other odd sizes.
  for (int round = 0; got.size() < data.size(); ++round) {
    const size_t n1 = std::min<size_t>(data.size() - sent, 1 + (round * 977) % 3001);
    const size_t n2 = std::min<size_t>(data.size() - sent - n1, (round * 131) % 700);
    const iovec iov[2] = {{const_cast<char*>(data.data() + sent), n1},
                          {const_cast<char*>(data.data() + sent + n1), n2}};
    sent += p.a->write(iov, 2);
    std::vector<char> buf(1 + (round * 557) % 2500);
    const size_t r = p.b->read(buf.data(), buf.size());
    got.insert(got.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(r));
    ASSERT_LT(round, 100000);
  }
  EXPECT_EQ(got, data);
  EXPECT_FALSE(p.a->broken() || p.b->broken());
}

TEST(LocalRing, AFullRingTakesWhatFitsAndAnEmptyOneGivesNothing) {
  Pair p = makePair();
  char buf[64];
  EXPECT_FALSE(p.b->readable());
  EXPECT_EQ(p.b->read(buf, sizeof(buf)), 0u);
  const std::vector<char> data = pattern(kCap + 100, 1);
  EXPECT_EQ(writeBytes(*p.a, data.data(), data.size()), kCap);
  EXPECT_FALSE(p.a->writable());
  EXPECT_EQ(writeBytes(*p.a, data.data(), 10), 0u);
  EXPECT_EQ(p.b->read(buf, 10), 10u);
  EXPECT_TRUE(p.a->writable());
  EXPECT_EQ(writeBytes(*p.a, data.data(), 100), 10u);
  EXPECT_EQ(0, std::memcmp(buf, data.data(), 10));
}

TEST(LocalRing, PeerWordsThatMakeNoSenseBreakTheRing) {
  struct RawWords {  // LocalRing::Words as laid out in the segment
    alignas(64) uint64_t tail;
    alignas(64) uint64_t head;
  };
  {  // B claims to have written more than its ring holds.
    Pair p = makePair();
    static_cast<RawWords*>(p.rawB.data())->tail = kCap + 1;
    char buf[16];
    EXPECT_EQ(p.a->read(buf, sizeof(buf)), 0u);
    EXPECT_TRUE(p.a->broken());
  }
  {  // B claims to have read what A never wrote.
    Pair p = makePair();
    static_cast<RawWords*>(p.rawB.data())->head = 5;
    EXPECT_EQ(writeBytes(*p.a, "x", 1), 0u);
    EXPECT_TRUE(p.a->broken());
  }
}

TEST(LocalRing, ASleeperIsWokenOncePerSleepForWhatItWaitsFor) {
  Pair p = makePair();
  EXPECT_FALSE(p.a->peerNeedsWake(false)) << "B is awake";
  ASSERT_TRUE(p.b->arm(1, /*wantsRoom=*/false, /*wantsData=*/true));
  EXPECT_FALSE(p.a->peerNeedsWake(/*forRoom=*/true)) << "B does not wait for room";
  EXPECT_TRUE(p.a->peerNeedsWake(false));
  EXPECT_FALSE(p.a->peerNeedsWake(false)) << "one wake-up per sleep";
  p.b->disarm();
  // B waits for room in its full ring; A reads, and B is woken for it.
  const std::vector<char> fill = pattern(kCap, 3);
  ASSERT_EQ(writeBytes(*p.b, fill.data(), kCap), kCap);
  ASSERT_TRUE(p.b->arm(2, /*wantsRoom=*/true, /*wantsData=*/true));
  std::vector<char> buf(kCap / 2);
  ASSERT_EQ(p.a->read(buf.data(), 8), 8u);
  EXPECT_FALSE(p.a->peerNeedsWake(true)) << "woken for one frame's room";
  ASSERT_EQ(p.a->read(buf.data(), kCap / 2 - 8), kCap / 2 - 8);
  EXPECT_TRUE(p.a->peerNeedsWake(true)) << "half its ring is free";
  p.b->disarm();
  EXPECT_FALSE(p.b->arm(5, /*wantsRoom=*/true, /*wantsData=*/true)) << "there is room now";
  p.b->disarm();
  // Something to do already: arm says so.
  EXPECT_EQ(writeBytes(*p.a, "abc", 3), 3u);
  EXPECT_FALSE(p.b->arm(3, false, /*wantsData=*/true));
  p.b->disarm();
  EXPECT_TRUE(p.b->arm(4, false, /*wantsData=*/false)) << "data it does not want now";
  EXPECT_FALSE(p.a->peerNeedsWake(false)) << "more data it does not want";
  p.b->disarm();
}

// The wire. Ranks are threads that read each other's memory; the test
// binary sets GFLOW_LOCAL_RING=4K and GFLOW_LOCAL_SINGLE_COPY=4K.
constexpr Envelope kEnv{{1, 2, 3}};

std::vector<std::exception_ptr> run(const std::function<void(Context&)>& body) {
  return testing::runContexts("tcp_single_copy", 2, body, std::chrono::seconds(30));
}

Deadline longDeadline() {
  return Deadline::after(std::chrono::seconds(30));
}

TcpContext& tcpOf(Context& c) {
  return dynamic_cast<TcpContext&>(c);
}

TEST(TcpLocalRing, MessagesOfEverySizeCrossBothWaysAtOnceIntact) {
  const std::vector<size_t> sizes = {0, 1, 71, 72, 73, 1000, 4095, 4096, 4097, 9000, 70000};
  for (const char* singleCopy : {"4K", "0"}) {
    testing::ScopedEnv env("GFLOW_LOCAL_SINGLE_COPY", singleCopy);
    expectNoErrors(run([&](Context& c) {
      EXPECT_TRUE(tcpOf(c).talksThroughStream(1 - c.rank()));
      c.beginGroup(1, kEnv);
      const int peer = 1 - c.rank();
      std::vector<std::vector<char>> out, in;
      std::vector<RequestPtr> reqs;
      for (int rep = 0; rep < 3; ++rep) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          const uint64_t index = rep * sizes.size() + i;
          out.push_back(pattern(sizes[i], int(100 * c.rank() + index)));
          in.emplace_back(sizes[i] + 1, 0);
          // Receives posted before, between and after the sends.
          if (rep == 0)
            reqs.push_back(c.irecv(peer, in.back().data(), sizes[i], Tag{1, index}, kEnv));
          reqs.push_back(c.isend(peer, out.back().data(), sizes[i], Tag{1, index}, kEnv));
          if (rep > 0)
            reqs.push_back(c.irecv(peer, in.back().data(), sizes[i], Tag{1, index}, kEnv));
        }
      }
      for (auto& r : reqs) c.wait(r, longDeadline());
      for (size_t k = 0; k < in.size(); ++k) {
        const size_t n = sizes[k % sizes.size()];
        const std::vector<char> want = pattern(n, int(100 * peer + k));
        EXPECT_TRUE(std::equal(want.begin(), want.end(), in[k].begin())) << k;
        EXPECT_EQ(in[k][n], 0) << "wrote past the receive " << k;
      }
    }));
  }
}

TEST(TcpLocalRing, WithoutItFramesGoThroughTheSocket) {
  testing::ScopedEnv env("GFLOW_LOCAL_RING", "0");
  expectNoErrors(run([&](Context& c) {
    EXPECT_FALSE(tcpOf(c).talksThroughStream(1 - c.rank()));
    c.beginGroup(1, kEnv);
    const std::vector<char> out = pattern(100, c.rank());
    std::vector<char> in(100);
    const int peer = 1 - c.rank();
    RequestPtr r = c.irecv(peer, in.data(), in.size(), Tag{1, 0}, kEnv);
    c.wait(c.isend(peer, out.data(), out.size(), Tag{1, 0}, kEnv), longDeadline());
    c.wait(r, longDeadline());
    EXPECT_EQ(in, pattern(100, peer));
  }));
}

// The receiver waits without polling (GFLOW_SPIN_US=0: it sleeps in epoll
// at once); the sender writes later. Only the DOORBELL wakes it before its
// next wake-up of its own (up to a second).
TEST(TcpLocalRing, AReceiverAsleepInEpollIsWokenByADoorbell) {
  testing::ScopedEnv spin("GFLOW_SPIN_US", "0");
  constexpr int kMessages = 5;
  expectNoErrors(run([&](Context& c) {
    c.beginGroup(1, kEnv);
    for (uint64_t i = 0; i < kMessages; ++i) {
      const std::vector<char> out = pattern(300, int(i));
      if (c.rank() == 0) {
        std::this_thread::sleep_for(milliseconds(20));  // the receiver is asleep by now
        c.wait(c.isend(1, out.data(), out.size(), Tag{1, i}, kEnv), longDeadline());
      } else {
        std::vector<char> in(300);
        c.wait(c.irecv(0, in.data(), in.size(), Tag{1, i}, kEnv), longDeadline());
        EXPECT_EQ(in, out);
      }
    }
    if (c.rank() == 1) {
      EXPECT_GE(tcpOf(c).doorbellsReceived(), 1u);
    }
  }));
}

// 400 KiB of small messages through a 4 KiB ring to a receiver that posts
// its receives late: the writer fills the ring and sleeps; its reader wakes
// it as it makes room.
TEST(TcpLocalRing, AWriterWaitingForRoomIsWokenByItsReader) {
  testing::ScopedEnv spin("GFLOW_SPIN_US", "0");
  constexpr int kMessages = 100;
  constexpr size_t kBytes = 4000;  // below single copy
  expectNoErrors(run([&](Context& c) {
    c.beginGroup(1, kEnv);
    std::vector<std::vector<char>> bufs;
    std::vector<RequestPtr> reqs;
    if (c.rank() == 1) std::this_thread::sleep_for(milliseconds(50));
    for (uint64_t i = 0; i < kMessages; ++i) {
      bufs.push_back(c.rank() == 0 ? pattern(kBytes, int(i)) : std::vector<char>(kBytes));
      reqs.push_back(c.rank() == 0 ? c.isend(1, bufs.back().data(), kBytes, Tag{1, i}, kEnv)
                                   : c.irecv(0, bufs.back().data(), kBytes, Tag{1, i}, kEnv));
    }
    for (auto& r : reqs) c.wait(r, longDeadline());
    for (uint64_t i = 0; i < kMessages && c.rank() == 1; ++i) {
      EXPECT_EQ(bufs[i], pattern(kBytes, int(i))) << i;
    }
    if (c.rank() == 0) {
      EXPECT_GE(tcpOf(c).doorbellsReceived(), 1u);
    }
  }));
}

}  // namespace
}  // namespace gflow
