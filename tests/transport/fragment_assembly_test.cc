// Message assembly from fragments on TCP, against a peer that knows the
// token and writes its own frames: fragments that overlap, repeat earlier
// bytes or disagree about the message's length are a protocol error naming
// the peer, never a message completed with bytes it did not send. Also the
// unit (transport/byte_ranges.h) on its own, and well-formed fragments in
// any order still assembling exactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/socket.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "transport/byte_ranges.h"
#include "transport/contract.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_context.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using transport::ByteRanges;
using transport::tcp::FrameHeader;

TEST(ByteRanges, DisjointRangesInAnyOrderAddUp) {
  ByteRanges r;
  EXPECT_EQ(r.claim(40, 20, 100), "");
  EXPECT_EQ(r.claim(0, 10, 100), "");
  EXPECT_EQ(r.claim(60, 40, 100), "");
  EXPECT_EQ(r.claim(10, 30, 100), "");
  EXPECT_EQ(r.claimed(), 100u);
  EXPECT_EQ(r.claim(5, 0, 100), "");  // empty: nothing claimed
}

TEST(ByteRanges, OverlapsAndRepeatsAreRefused) {
  ByteRanges whole;
  EXPECT_EQ(whole.claim(0, 100, 100), "");
  EXPECT_THAT(whole.claim(0, 100, 100), HasSubstr("repeats"));
  ByteRanges r;
  EXPECT_EQ(r.claim(0, 50, 100), "");
  EXPECT_THAT(r.claim(0, 50, 100), HasSubstr("overlaps [0, 50)"));
  EXPECT_THAT(r.claim(49, 2, 100), HasSubstr("overlaps [0, 50)"));
  EXPECT_EQ(r.claim(60, 10, 100), "");
  EXPECT_THAT(r.claim(55, 10, 100), HasSubstr("overlaps [60, 70)"));
  EXPECT_THAT(r.claim(69, 1, 100), HasSubstr("overlaps [60, 70)"));
  EXPECT_EQ(r.claimed(), 60u);
}

// One fragment of a message from rank 0 to rank 1, as rank 0's wire would
// frame it: tag (p2p group 5, index 0), message length, offset, length.
struct Fragment {
  uint64_t msgLen, offset, fragLen;
};

void writeFragments(int fd, const std::vector<Fragment>& frags, const std::vector<char>& data) {
  for (const Fragment& f : frags) {
    FrameHeader h{transport::tcp::kFrameMagic,
                  transport::tcp::kFrameData,
                  0,
                  transport::kPointToPointGroup | 5,
                  0,
                  f.msgLen,
                  f.offset,
                  f.fragLen,
                  {0, 0, 0},
                  {}};
    net::sendAll(fd, &h, sizeof(h), Deadline::after(milliseconds(5000)));
    net::sendAll(fd, data.data() + f.offset, f.fragLen, Deadline::after(milliseconds(5000)));
  }
}

// Rank 0 writes `frags` of a 64 KiB message straight onto its socket to
// rank 1, which receives the message; returns what rank 1 raised (nullptr:
// it completed, and then its buffer must equal what was sent).
std::exception_ptr deliver(const std::vector<Fragment>& frags, uint64_t recvLen) {
  const std::vector<char> sent = testing::pattern(128 << 10, 3);
  std::exception_ptr got;
  auto errs = testing::runContexts(
      "tcp", 2,
      [&](transport::Context& c) {
        if (c.rank() == 0) {
          auto& t = dynamic_cast<transport::tcp::TcpContext&>(c);
          writeFragments(t.socketForTesting(1, 0), frags, sent);
          std::this_thread::sleep_for(milliseconds(500));  // rank 1 reads before EOF
          return;
        }
        std::vector<char> buf(recvLen, 0);
        const transport::Tag tag{transport::kPointToPointGroup | 5, 0};
        try {
          c.wait(c.irecv(0, buf.data(), buf.size(), tag, transport::Envelope{}),
                 Deadline::after(milliseconds(10000)));
          c.endOp();
          EXPECT_EQ(buf, std::vector<char>(sent.begin(), sent.begin() + recvLen));
        } catch (const Error&) {
          got = std::current_exception();
        }
      },
      milliseconds(20000));
  testing::expectNoErrors(errs);
  return got;
}

constexpr uint64_t kLen = 64 << 10;

TEST(FragmentAssembly, FragmentsInAnyOrderAssembleExactly) {
  EXPECT_EQ(
      deliver({{kLen, 32 << 10, 32 << 10}, {kLen, 0, 16 << 10}, {kLen, 16 << 10, 16 << 10}}, kLen),
      nullptr);
}

TEST(FragmentAssembly, OverlappingFragmentsAreAProtocolErrorNamingThePeer) {
  // Two halves at the same offset: the right total, half the bytes never sent.
  const Error e = testing::errorOf(deliver({{kLen, 0, kLen / 2}, {kLen, 0, kLen / 2}}, kLen));
  EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
  EXPECT_THAT(e.what(), HasSubstr("invalid frame from rank 0"));
  EXPECT_THAT(e.what(), HasSubstr("overlaps"));
  EXPECT_EQ(e.peer(), 0);
}

TEST(FragmentAssembly, ARepeatedFragmentIsAProtocolError) {
  const Error e = testing::errorOf(
      deliver({{kLen, 0, 16 << 10}, {kLen, 16 << 10, 16 << 10}, {kLen, 16 << 10, 16 << 10}}, kLen));
  EXPECT_THAT(e.what(), HasSubstr("overlaps [0, 32768)"));
}

TEST(FragmentAssembly, FragmentsThatDisagreeAboutTheLengthAreRefused) {
  const Error e =
      testing::errorOf(deliver({{kLen, 0, kLen / 2}, {kLen / 2 * 3, kLen, kLen / 2}}, kLen));
  EXPECT_THAT(e.what(), HasSubstr("rank 0"));
}

}  // namespace
}  // namespace gflow
