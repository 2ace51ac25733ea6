// Congestion control of TCP data sockets (transport/tcp/congestion.h):
// "auto" leaves a loss-based system choice alone and replaces a model-based
// (bbr) one, "system" keeps whatever the kernel gave, a name is applied to
// every data socket, and a name the kernel refuses is an invalid_argument
// naming the parameter on every rank instead of a silently ignored setting.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/params.h"
#include "common/socket.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "transport/tcp/congestion.h"
#include "transport/tcp/tcp_context.h"

namespace gflow {
namespace {

using transport::Context;
using transport::tcp::CongestionChoice;
using transport::tcp::congestionOf;
using transport::tcp::TcpContext;

// A TCP socket (not connected: TCP_CONGESTION applies to any TCP socket).
class TcpSocket {
 public:
  TcpSocket() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {}
  ~TcpSocket() { ::close(fd_); }
  int fd() const { return fd_; }
  bool set(const char* name) const {
    return setsockopt(fd_, IPPROTO_TCP, TCP_CONGESTION, name, std::strlen(name)) == 0;
  }

 private:
  int fd_;
};

TEST(Congestion, AutoReplacesBbrWithALossBasedAlgorithm) {
  TcpSocket s;
  if (!s.set("bbr")) GTEST_SKIP() << "the kernel has no bbr to replace";
  CongestionChoice choice("auto");
  choice.apply(s.fd(), 0);
  const std::string now = congestionOf(s.fd());
  EXPECT_TRUE(now == "cubic" || now == "reno") << now;
  EXPECT_EQ(choice.chosen(), now);
  // Later sockets get the same algorithm, whatever they started with.
  TcpSocket t;
  ASSERT_TRUE(t.set("bbr"));
  choice.apply(t.fd(), 0);
  EXPECT_EQ(congestionOf(t.fd()), now);
}

TEST(Congestion, AutoKeepsALossBasedSystemChoice) {
  TcpSocket s;
  ASSERT_TRUE(s.set("reno"));  // reno is always built in and permitted
  CongestionChoice choice("auto");
  choice.apply(s.fd(), 0);
  EXPECT_EQ(congestionOf(s.fd()), "reno");
  EXPECT_EQ(choice.chosen(), "");
}

TEST(Congestion, SystemKeepsEvenBbr) {
  TcpSocket s;
  if (!s.set("bbr")) GTEST_SKIP() << "no bbr in this kernel";
  CongestionChoice choice("system");
  choice.apply(s.fd(), 0);
  EXPECT_EQ(congestionOf(s.fd()), "bbr");
}

TEST(Congestion, ANamedAlgorithmIsApplied) {
  TcpSocket s;
  if (!s.set("bbr")) GTEST_SKIP() << "no bbr in this kernel to start from";
  CongestionChoice choice("reno");
  choice.apply(s.fd(), 0);
  EXPECT_EQ(congestionOf(s.fd()), "reno");
}

// Set on a listener, the choice reaches accepted connections from their
// handshake on, with no call on them (a socket switched after its handshake
// keeps the pacing BBR started; congestion.h).
TEST(Congestion, AcceptedSocketsInheritTheListenersChoice) {
  uint16_t port = 0;
  net::Socket l = net::listenOn("127.0.0.1", net::PortRange{}, &port);
  CongestionChoice choice("reno");
  choice.apply(l.fd(), 0);
  net::Socket c = net::connectTo("127.0.0.1", port, Deadline::after(std::chrono::seconds(5)),
                                 "test", [&](int fd) { choice.apply(fd, 0); });
  const int a = ::accept(l.fd(), nullptr, nullptr);
  ASSERT_GE(a, 0);
  EXPECT_EQ(congestionOf(a), "reno");
  EXPECT_EQ(congestionOf(c.fd()), "reno");
  ::close(a);
}

TEST(Congestion, AnUnknownNameIsAnErrorNamingTheParameter) {
  TcpSocket s;
  CongestionChoice choice("no-such-cc");
  try {
    choice.apply(s.fd(), 3);
    FAIL() << "an unknown congestion control was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("GFLOW_TCP_CONGESTION"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no-such-cc"), std::string::npos) << e.what();
    EXPECT_EQ(e.rank(), 3);
  }
}

class ContextCongestion : public ::testing::Test {
 protected:
  void set(const char* value) {
    setenv("GFLOW_TCP_CONGESTION", value, 1);
    params::resetCacheForTesting();
  }
  void TearDown() override {
    unsetenv("GFLOW_TCP_CONGESTION");
    params::resetCacheForTesting();
  }

  // Each rank's algorithm on each of its data sockets.
  std::vector<std::string> dataSocketAlgorithms(int n) {
    std::vector<std::string> out;
    std::mutex mu;
    testing::expectNoErrors(testing::runContexts(
        "tcp", n,
        [&](Context& c) {
          auto& t = dynamic_cast<TcpContext&>(c);
          for (int peer = 0; peer < c.size(); ++peer) {
            if (peer == c.rank()) continue;
            const std::string a = congestionOf(t.socketForTesting(peer, 0));
            std::lock_guard<std::mutex> lock(mu);
            out.push_back(a);
          }
        },
        std::chrono::seconds(30)));
    return out;
  }
};

TEST_F(ContextCongestion, EveryDataSocketTakesTheNamedAlgorithm) {
  set("reno");
  const auto algos = dataSocketAlgorithms(3);
  ASSERT_EQ(algos.size(), 6u);
  for (const auto& a : algos) EXPECT_EQ(a, "reno");
}

TEST_F(ContextCongestion, AutoNeverLeavesBbrOnADataSocket) {
  TcpSocket probe;  // what the system gives a new socket
  const std::string system = congestionOf(probe.fd());
  const auto algos = dataSocketAlgorithms(2);
  ASSERT_EQ(algos.size(), 2u);
  for (const auto& a : algos) {
    if (system.rfind("bbr", 0) == 0) {
      EXPECT_TRUE(a == "cubic" || a == "reno") << a << " (system: " << system << ")";
    } else {
      EXPECT_EQ(a, system);
    }
  }
}

TEST_F(ContextCongestion, ARefusedNameFailsEveryRankNamingTheParameter) {
  set("no-such-cc");
  const auto errs = testing::runContexts(
      "tcp", 2, [](Context&) {}, std::chrono::seconds(10));
  for (const auto& e : errs) {
    ASSERT_TRUE(e);
    const Error err = testing::errorOf(e);
    EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find("GFLOW_TCP_CONGESTION"), std::string::npos);
  }
}

}  // namespace
}  // namespace gflow
