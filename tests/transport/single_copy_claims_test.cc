// A job-token holder that claims, on TCP's single-copy agreement
// (local/host.h), that it reads a rank's memory without proving it: it
// offers no identity, or one it made up, and then sends the claim with
// the best echo it can make without reading (none, or the proof it can
// compute itself). It takes either side of the connection: it dials the
// real rank as rank 1, or listens as rank 0 and is dialed. In every case
// the real rank shows it no buffer address (its RENDEZVOUS frames carry
// none) and completes no send on its bare READ: the READ is a protocol
// error naming the impostor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/hash.h"
#include "common/socket.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "transport/local/host.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_context.h"
#include "transport/transport.h"

namespace gflow {
namespace {

namespace tcp = transport::tcp;
namespace local = transport::local;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr const char* kToken = "single-copy-claims-token";
constexpr const char* kPrefix = "t/";
constexpr const char* kAuthLabel = "gflow-data/v1";  // tcp_connect.cc
constexpr transport::Envelope kEnv{{1, 2, 3}};
constexpr size_t kBig = 1 << 20;  // single copy between ranks that agreed on it
// Beyond any pid the kernel hands out (pid_max is at most 2^22).
constexpr uint64_t kNoSuchPid = (1u << 22) + 7;

enum class Side { kDials, kListens };
enum class Offer { kNothing, kMadeUpIdentity };

struct Case {
  Side side;
  Offer offer;
};

std::string nameOf(const Case& c) {
  return std::string(c.side == Side::kDials ? "Dials" : "Listens") +
         (c.offer == Offer::kNothing ? "OfferingNoIdentity" : "OfferingAMadeUpIdentity");
}

std::string testName(const ::testing::TestParamInfo<Case>& info) {
  return nameOf(info.param);
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << nameOf(c);
}

Deadline soon() {
  return Deadline::after(seconds(10));
}

uint64_t commId() {
  return hash::sha256Id(std::string(kPrefix));
}

// What the impostor offers as its own: nothing, or a process that is not
// there on the real rank's host (hostHash 1, as the real rank's).
local::Identity offered(Offer o) {
  if (o == Offer::kNothing) return {};
  return local::Identity{1, kNoSuchPid, 0x10000, 0x20000};
}

// The claim that it reads the real rank, with the best echo it has without
// reading: the proof of its own challenge (which it can compute), or none.
local::ReadsClaim lie(uint64_t myChallenge, int me, int real) {
  local::ReadsClaim c{};
  c.flags = local::kReads | local::kTakesSingleCopy;
  c.echo = myChallenge ? local::proofOf(myChallenge, me, real, commId()) : 0;
  return c;
}

// What the impostor saw of the real rank while connecting.
struct Seen {
  tcp::HelloReply reply{};    // as the dialer
  tcp::Hello hello{};         // as the listener
  local::ReadsClaim claim{};  // the real rank's
};

// Rank 1 dials the real rank 0 and lies in the agreement (acceptorAgrees).
net::Socket dialAndLie(const std::shared_ptr<Store>& store, Offer o, Seen* seen) {
  // Published as the real ranks do (tcp_connect.cc): rank 0 reads every
  // address before it waits to be dialled; nobody dials this one.
  store->setString(std::string(kPrefix) + "tcp/addr/1", "127.0.0.1:1");
  const auto hp = net::parseHostPort(
      store->getString(std::string(kPrefix) + "tcp/addr/0", seconds(10)), "rank 0");
  net::Socket s = net::connectTo(hp.first, hp.second, soon(), "rank 0");
  auth::authenticate(s.fd(), kToken, kAuthLabel, /*initiator=*/true, soon());
  tcp::Hello h{tcp::kHelloMagic, tcp::kProtocolVersion, 1, 2, 0, 1, 0, commId(), offered(o)};
  net::sendAll(s.fd(), &h, sizeof(h), soon());
  net::recvAll(s.fd(), &seen->reply, sizeof(seen->reply), soon());
  const uint64_t challenge = o == Offer::kNothing ? 0 : 12345;
  net::sendAll(s.fd(), &challenge, sizeof(challenge), soon());
  net::recvAll(s.fd(), &seen->claim, sizeof(seen->claim), soon());
  const local::ReadsClaim claim = lie(challenge, 1, 0);
  net::sendAll(s.fd(), &claim, sizeof(claim), soon());
  return s;
}

// Rank 0 listens, is dialed by the real rank 1 and lies (dialerAgrees).
net::Socket listenAndLie(const std::shared_ptr<Store>& store, Offer o, Seen* seen) {
  uint16_t port = 0;
  net::Socket listener = net::listenOn("127.0.0.1", net::PortRange{}, &port);
  store->setString(std::string(kPrefix) + "tcp/addr/0", net::joinHostPort("127.0.0.1", port));
  pollfd p{listener.fd(), POLLIN, 0};
  if (::poll(&p, 1, 10000) != 1) throw Error(ErrorCode::kTimeout, "nobody dialed the impostor");
  net::Socket s(::accept(listener.fd(), nullptr, nullptr));
  auth::authenticate(s.fd(), kToken, kAuthLabel, /*initiator=*/false, soon());
  net::recvAll(s.fd(), &seen->hello, sizeof(seen->hello), soon());
  tcp::HelloReply reply{};
  reply.ok = 1;
  reply.local = offered(o);
  reply.challenge = o == Offer::kNothing ? 0 : 12345;
  net::sendAll(s.fd(), &reply, sizeof(reply), soon());
  uint64_t theirs = 0;
  net::recvAll(s.fd(), &theirs, sizeof(theirs), soon());
  const local::ReadsClaim claim = lie(reply.challenge, 0, 1);
  net::sendAll(s.fd(), &claim, sizeof(claim), soon());
  net::recvAll(s.fd(), &seen->claim, sizeof(seen->claim), soon());
  return s;
}

// Reads the real rank's frames until its RENDEZVOUS of tag {1, 0}, answers
// it with a READ, and returns the address it carried.
uint64_t claimTheRead(int fd) {
  for (;;) {
    tcp::FrameHeader h{};
    net::recvAll(fd, &h, sizeof(h), soon());
    std::vector<char> payload(h.type == tcp::kFrameRendezvous ? 0 : h.fragLen);
    if (!payload.empty()) net::recvAll(fd, payload.data(), payload.size(), soon());
    if (h.type != tcp::kFrameRendezvous) continue;
    tcp::FrameHeader read = h;
    read.type = tcp::kFrameRead;
    read.reserved = 0;
    read.offset = 0;
    net::sendAll(fd, &read, sizeof(read), soon());
    return h.offset;
  }
}

// A real rank of the pair, offering single copy on host 1, one socket.
transport::ContextOptions optionsOf(int rank, const std::shared_ptr<Store>& store) {
  transport::ContextOptions o;
  o.rank = rank;
  o.size = 2;
  o.store = store;
  o.prefix = kPrefix;
  o.token = kToken;
  o.timeout = seconds(10);
  o.localSingleCopy = true;
  o.hostHash = 1;
  o.tcp.socketsPerPeer = 1;
  // kBig waits for its receive whatever GFLOW_RENDEZVOUS says: the send
  // shows itself as a RENDEZVOUS, with or without an address.
  o.tcp.rendezvousBytes = 64 << 10;
  return o;
}

class SingleCopyClaims : public ::testing::TestWithParam<Case> {};

TEST_P(SingleCopyClaims, AnUnprovenReaderGetsNoAddressAndCompletesNoSend) {
  const Case k = GetParam();
  const int realRank = k.side == Side::kDials ? 0 : 1;
  std::atomic<bool> sent{false};
  std::atomic<bool> completed{false};
  std::string failure;
  int failedPeer = -2;
  Seen seen;
  uint64_t address = ~uint64_t{0};
  auto errs = testing::onThreads(2, [&](int rank, const std::shared_ptr<Store>& store) {
    if (rank != realRank) {
      net::Socket s = k.side == Side::kDials ? dialAndLie(store, k.offer, &seen)
                                             : listenAndLie(store, k.offer, &seen);
      address = claimTheRead(s.fd());
      // Open until the real rank has its answer.
      while (!sent) std::this_thread::sleep_for(milliseconds(1));
      return;
    }
    auto ctx = transport::createContext("tcp", optionsOf(realRank, store));
    std::vector<char> data(kBig, 'x');
    ctx->beginGroup(1, kEnv);
    try {
      ctx->wait(ctx->isend(1 - realRank, data.data(), data.size(), transport::Tag{1, 0}, kEnv),
                soon());
      completed = true;
    } catch (const Error& e) {
      failure = e.what();
      failedPeer = e.peer();
    }
    sent = true;
  });
  testing::expectNoErrors(errs);
  if (k.offer == Offer::kNothing && k.side == Side::kDials) {
    EXPECT_EQ(seen.reply.local.pid, 0u) << "an identity shown to a peer that offered none";
    EXPECT_EQ(seen.reply.local.proofAddr, 0u);
    EXPECT_EQ(seen.reply.challenge, 0u);
  }
  EXPECT_EQ(seen.claim.flags, 0) << "the real rank cannot read a process that is not there";
  EXPECT_EQ(address, 0u) << "a buffer address went to a peer that never proved it reads";
  EXPECT_FALSE(completed) << "a send completed on a READ of a peer that never read it";
  EXPECT_THAT(failure, HasSubstr("did not send by single copy"));
  EXPECT_EQ(failedPeer, 1 - realRank) << failure;
}

INSTANTIATE_TEST_SUITE_P(Impostor, SingleCopyClaims,
                         ::testing::Values(Case{Side::kDials, Offer::kNothing},
                                           Case{Side::kDials, Offer::kMadeUpIdentity},
                                           Case{Side::kListens, Offer::kNothing},
                                           Case{Side::kListens, Offer::kMadeUpIdentity}),
                         testName);

// The same agreement between two real ranks of one process (which read
// each other): single copy is still chosen, and the send completes once
// the peer has read it.
TEST(SingleCopyClaims, ProvenReadersStillAgreeOnSingleCopy) {
  std::vector<char> got(kBig, 0);
  const std::vector<char> data(kBig, 'y');
  auto errs = testing::onThreads(2, [&](int rank, const std::shared_ptr<Store>& store) {
    auto ctx = transport::createContext("tcp", optionsOf(rank, store));
    ctx->beginGroup(1, kEnv);
    if (rank == 0) {
      ctx->wait(ctx->isend(1, data.data(), data.size(), transport::Tag{1, 0}, kEnv), soon());
      EXPECT_EQ(ctx->peerStats(1).singleCopyBytesSent, kBig);
    } else {
      ctx->wait(ctx->irecv(0, got.data(), got.size(), transport::Tag{1, 0}, kEnv), soon());
    }
  });
  testing::expectNoErrors(errs);
  EXPECT_EQ(got, data);
}

}  // namespace
}  // namespace gflow
