#include "common/socket.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "gflow/error.h"

namespace gflow::net {
namespace {

using std::chrono::milliseconds;
using testing::HasSubstr;

template <typename F>
Error expectError(F&& f, ErrorCode code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e;
  }
  ADD_FAILURE() << "expected gflow::Error " << toString(code);
  return Error(ErrorCode::kInternal, "no error thrown");
}

TEST(SocketParseTest, PortRange) {
  EXPECT_TRUE(parsePortRange("").any());
  EXPECT_TRUE(parsePortRange("0").any());
  PortRange r = parsePortRange("50000-50100");
  EXPECT_EQ(r.lo, 50000);
  EXPECT_EQ(r.hi, 50100);
  r = parsePortRange(" 6000 ");
  EXPECT_EQ(r.lo, 6000);
  EXPECT_EQ(r.hi, 6000);
  for (const char* bad : {"abc", "100-50", "0-10", "1-70000", "5-", "-5", "1-2-3", "12a"}) {
    Error e = expectError([&] { parsePortRange(bad); }, ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.detail(), HasSubstr("GFLOW_PORT_RANGE")) << bad;
  }
}

TEST(SocketParseTest, HostPort) {
  auto hp = parseHostPort("node1:29500", "GFLOW_ROOT");
  EXPECT_EQ(hp.first, "node1");
  EXPECT_EQ(hp.second, 29500);
  hp = parseHostPort("[fe80::1]:80", "GFLOW_ROOT");
  EXPECT_EQ(hp.first, "fe80::1");
  EXPECT_EQ(hp.second, 80);
  for (const char* bad : {"node1", "node1:", ":80", "node1:0", "node1:70000", "fe80::1:80",
                          "[fe80::1]80", "node1:8x"}) {
    Error e = expectError([&] { parseHostPort(bad, "GFLOW_ROOT"); }, ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.detail(), HasSubstr("GFLOW_ROOT")) << bad;
  }
}

TEST(SocketInterfaceTest, ExactLoopback) {
  EXPECT_EQ(selectInterfaceAddress("=lo"), "127.0.0.1");
}

TEST(SocketInterfaceTest, PrefixLoopback) {
  EXPECT_EQ(selectInterfaceAddress("lo"), "127.0.0.1");
}

TEST(SocketInterfaceTest, DefaultPrefersNonLoopback) {
  std::string addr = selectInterfaceAddress("");
  EXPECT_FALSE(addr.empty());
  // Either a real interface or, on a host with none, loopback as fallback.
  std::string other;
  try {
    other = selectInterfaceAddress("^lo");
  } catch (const Error&) {
    EXPECT_EQ(addr, "127.0.0.1");
    return;
  }
  EXPECT_EQ(addr, other);
}

TEST(SocketInterfaceTest, ExcludingLoopbackNeverReturnsIt) {
  try {
    std::string a = selectInterfaceAddress("^lo");
    EXPECT_NE(a, "127.0.0.1");
    EXPECT_NE(a, "::1");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.detail(), HasSubstr("lo ("));  // lists what exists
  }
}

TEST(SocketInterfaceTest, ExactNameDoesNotMatchPrefix) {
  Error e = expectError([] { selectInterfaceAddress("=l"); }, ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.detail(), HasSubstr("GFLOW_SOCKET_IFNAME='=l'"));
}

TEST(SocketInterfaceTest, UnknownInterfaceListsInterfaces) {
  Error e = expectError([] { selectInterfaceAddress("nosuchif"); }, ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.detail(), HasSubstr("nosuchif"));
  EXPECT_THAT(e.detail(), HasSubstr("lo (127.0.0.1)"));
}

TEST(SocketListenTest, PicksNextPortWhenFirstIsTaken) {
  // Find two consecutive free ports by probing, then occupy the first.
  for (int attempt = 0; attempt < 20; ++attempt) {
    uint16_t base = 0;
    Socket probe = listenOn("127.0.0.1", PortRange{}, &base);
    if (base >= 65000) continue;
    uint16_t p1 = 0;
    Socket first;
    try {
      first = listenOn("127.0.0.1",
                       PortRange{static_cast<uint16_t>(base + 1), static_cast<uint16_t>(base + 1)},
                       &p1);
    } catch (const Error&) {
      continue;  // someone else has base+1
    }
    // `probe` holds base, `first` holds base+1: the range base..base+2 must give base+2.
    uint16_t got = 0;
    try {
      Socket s = listenOn("127.0.0.1", PortRange{base, static_cast<uint16_t>(base + 2)}, &got);
    } catch (const Error&) {
      continue;  // base+2 taken by another process
    }
    EXPECT_EQ(got, base + 2);
    return;
  }
  FAIL() << "could not find three consecutive free ports";
}

TEST(SocketListenTest, AllPortsTakenNamesTheRange) {
  uint16_t port = 0;
  Socket held = listenOn("127.0.0.1", PortRange{}, &port);
  Error e = expectError(
      [&] {
        listenOn("127.0.0.1", PortRange{port, port}, nullptr);
      },
      ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.detail(), HasSubstr("GFLOW_PORT_RANGE"));
}

TEST(SocketConnectTest, TimesOutWhenNothingListens) {
  uint16_t port = 0;
  { Socket s = listenOn("127.0.0.1", PortRange{}, &port); }  // now closed: refused
  auto start = std::chrono::steady_clock::now();
  Error e = expectError(
      [&] { connectTo("127.0.0.1", port, Deadline::after(milliseconds(200)), "the test peer"); },
      ErrorCode::kTimeout);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(190));
  EXPECT_LT(took, milliseconds(1000));
  EXPECT_THAT(e.detail(), HasSubstr("the test peer"));
  EXPECT_THAT(e.detail(), HasSubstr("127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(e.detail(), HasSubstr("refused"));
}

// A socket whose own port is the target port connects to itself when nothing
// listens there (TCP simultaneous open). connectTo must see a refusal, keep
// retrying, and never hand back that socket: it would read its own bytes and
// hold the port the real listener needs. Binding the port in beforeConnect
// makes the kernel's rare choice of an ephemeral port certain.
TEST(SocketConnectTest, ASocketConnectedToItselfIsARefusal) {
  uint16_t port = 0;
  { Socket s = listenOn("127.0.0.1", PortRange{}, &port); }
  auto bindToTarget = [port](int fd) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
  };
  Error e = expectError(
      [&] {
        connectTo("127.0.0.1", port, Deadline::after(milliseconds(200)), "the root", bindToTarget);
      },
      ErrorCode::kTimeout);
  EXPECT_THAT(e.detail(), HasSubstr("refused"));
  uint16_t bound = 0;
  Socket l = listenOn("127.0.0.1", PortRange{port, port}, &bound);  // the port is free again
  EXPECT_EQ(bound, port);
}

TEST(SocketConnectTest, RetriesUntilListenerAppears) {
  uint16_t port = 0;
  { Socket s = listenOn("127.0.0.1", PortRange{}, &port); }
  std::thread late([port] {
    std::this_thread::sleep_for(milliseconds(150));
    uint16_t p = 0;
    Socket l = listenOn("127.0.0.1", PortRange{port, port}, &p);
    Socket c(::accept(l.fd(), nullptr, nullptr));
    char b = 0;
    recvAll(c.fd(), &b, 1, Deadline::after(milliseconds(2000)));
  });
  Socket s = connectTo("127.0.0.1", port, Deadline::after(milliseconds(2000)), "late peer");
  char b = 'x';
  sendAll(s.fd(), &b, 1, Deadline::after(milliseconds(1000)));
  late.join();
}

TEST(SocketConnectTest, UnresolvableHostIsInvalidArgument) {
  expectError([] { connectTo("no-such-host.invalid", 1, Deadline::after(milliseconds(500)), "x"); },
              ErrorCode::kInvalidArgument);
}

struct Connected {
  Socket a, b;
};

Connected connectedPair() {
  uint16_t port = 0;
  Socket l = listenOn("127.0.0.1", PortRange{}, &port);
  Connected c;
  c.a = connectTo("127.0.0.1", port, Deadline::after(milliseconds(2000)), "test");
  c.b = Socket(::accept(l.fd(), nullptr, nullptr));
  return c;
}

TEST(SocketIoTest, LargeRoundTrip) {
  Connected c = connectedPair();
  std::vector<uint8_t> out(8 << 20);
  std::iota(out.begin(), out.end(), 0);
  std::vector<uint8_t> in(out.size());
  std::thread sender(
      [&] { sendAll(c.a.fd(), out.data(), out.size(), Deadline::after(milliseconds(5000))); });
  recvAll(c.b.fd(), in.data(), in.size(), Deadline::after(milliseconds(5000)));
  sender.join();
  EXPECT_EQ(in, out);
}

TEST(SocketIoTest, EofIsPeerLost) {
  Connected c = connectedPair();
  sendAll(c.a.fd(), "ab", 2, Deadline::after(milliseconds(1000)));
  c.a.close();
  char buf[4];
  Error e = expectError([&] { recvAll(c.b.fd(), buf, 4, Deadline::after(milliseconds(1000))); },
                        ErrorCode::kPeerLost);
  EXPECT_THAT(e.detail(), HasSubstr("2 of 4"));
}

TEST(SocketIoTest, SendToClosedPeerIsPeerLost) {
  Connected c = connectedPair();
  c.b.close();
  std::vector<uint8_t> big(1 << 20);
  // The first send may land in the buffer; keep sending until the reset shows.
  expectError(
      [&] {
        for (int i = 0; i < 100; ++i) {
          sendAll(c.a.fd(), big.data(), big.size(), Deadline::after(milliseconds(1000)));
        }
      },
      ErrorCode::kPeerLost);
}

TEST(SocketIoTest, RecvTimesOut) {
  Connected c = connectedPair();
  char b;
  auto start = std::chrono::steady_clock::now();
  expectError([&] { recvAll(c.b.fd(), &b, 1, Deadline::after(milliseconds(100))); },
              ErrorCode::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(95));
}

TEST(SocketIoTest, SendTimesOutWhenPeerDoesNotRead) {
  Connected c = connectedPair();
  setBufferSizes(c.a.fd(), 64 << 10);
  std::vector<uint8_t> big(64 << 20);
  expectError(
      [&] { sendAll(c.a.fd(), big.data(), big.size(), Deadline::after(milliseconds(200))); },
      ErrorCode::kTimeout);
}

TEST(SocketIoTest, PeerAddress) {
  Connected c = connectedPair();
  EXPECT_THAT(peerAddress(c.a.fd()), HasSubstr("127.0.0.1:"));
  EXPECT_EQ(peerAddress(-1), "unknown peer");
}

// Options that must hold at the handshake (congestion control, buffer sizes)
// are set on the socket before it connects, and stay in force after.
TEST(SocketTest, BeforeConnectRunsOnTheUnconnectedSocket) {
  uint16_t port = 0;
  Socket l = listenOn("127.0.0.1", PortRange{}, &port);
  int calls = 0, seenErrno = 0;
  Socket s = connectTo("127.0.0.1", port, Deadline::after(milliseconds(2000)), "test", [&](int fd) {
    ++calls;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) {
      seenErrno = errno;
    }
    int small = 8192;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seenErrno, ENOTCONN);
  int got = 0;
  socklen_t len = sizeof(got);
  ASSERT_EQ(getsockopt(s.fd(), SOL_SOCKET, SO_RCVBUF, &got, &len), 0);
  EXPECT_LE(got, 4 * 8192);  // the kernel doubles it; the default is far larger
}

TEST(SocketTest, MoveAndClose) {
  uint16_t port = 0;
  Socket a = listenOn("127.0.0.1", PortRange{}, &port);
  int fd = a.fd();
  Socket b(std::move(a));
  EXPECT_FALSE(a.valid());
  EXPECT_EQ(b.fd(), fd);
  Socket c;
  c = std::move(b);
  EXPECT_EQ(c.fd(), fd);
  c.close();
  EXPECT_FALSE(c.valid());
}

}  // namespace
}  // namespace gflow::net
