#include "common/handshake_acceptor.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/socket.h"
#include "gflow/error.h"

namespace gflow::net {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const char kToken[] = "acceptor-test-token";
const char kLabel[] = "gflow-acceptor-test/v1";
// Hang guard only: every wait below ends long before it unless the code under
// test is broken. Tests that must show a peer did not wait for a handshake
// timeout use a timeout (kLong) longer than this guard.
constexpr seconds kGuard{30};
constexpr milliseconds kLong{120000};

template <class Pred>
bool eventually(Pred pred) {
  const Deadline d = Deadline::after(kGuard);
  while (!d.expired()) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return pred();
}

// True once the other side has closed `fd` (EOF or reset), within the guard.
bool closedByAcceptor(int fd) {
  const Deadline d = Deadline::after(kGuard);
  char buf[256];
  while (!d.expired()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, d.remainingMs()) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

// An acceptor on loopback whose callback keeps each connection after one
// more exchange: it reads a byte and answers it, so a client knows it reached
// the callback.
class AcceptorTest : public testing::Test {
 protected:
  void start(milliseconds timeout, size_t maxPending) {
    Socket listener = listenOn("127.0.0.1", PortRange{}, &port_);
    HandshakeAcceptor::Options o;
    o.name = "test";
    o.token = kToken;
    o.label = kLabel;
    o.timeout = timeout;
    o.maxPending = maxPending;
    acceptor_ = std::make_unique<HandshakeAcceptor>(
        std::move(listener), o, [this](HandshakeAcceptor::Handshake& h) { onHandshake(h); });
  }

  void onHandshake(HandshakeAcceptor::Handshake& h) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      maxPendingSeen_ = std::max(maxPendingSeen_, acceptor_->pending());
      peers_.push_back(h.peer());
    }
    uint8_t b = 0;
    recvAll(h.fd(), &b, 1, h.deadline());
    sendAll(h.fd(), &b, 1, h.deadline());
    Socket s = h.take();
    std::lock_guard<std::mutex> lock(mutex_);
    if (s.valid()) kept_.push_back(std::move(s));
  }

  Socket connectSilent() {
    return connectTo("127.0.0.1", port_, Deadline::after(kGuard), "the acceptor");
  }

  // Authenticates and completes the callback's exchange; throws on failure.
  Socket connectGood(const std::string& token = kToken) {
    Socket s = connectSilent();
    auth::authenticate(s.fd(), token, kLabel, /*initiator=*/true, Deadline::after(kGuard));
    uint8_t b = 42;
    sendAll(s.fd(), &b, 1, Deadline::after(kGuard));
    uint8_t echo = 0;
    recvAll(s.fd(), &echo, 1, Deadline::after(kGuard));
    EXPECT_EQ(echo, 42);
    return s;
  }

  size_t keptCount() {
    std::lock_guard<std::mutex> lock(mutex_);
    return kept_.size();
  }

  uint16_t port_ = 0;
  std::mutex mutex_;
  std::vector<Socket> kept_;
  std::vector<std::string> peers_;
  size_t maxPendingSeen_ = 0;
  std::unique_ptr<HandshakeAcceptor> acceptor_;
};

TEST_F(AcceptorTest, GoodHandshakeReachesTheCallback) {
  start(kLong, 4);
  Socket s = connectGood();
  ASSERT_TRUE(eventually([&] { return keptCount() == 1; }));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    EXPECT_NE(peers_.at(0).find("127.0.0.1"), std::string::npos) << peers_.at(0);
  }
  // The kept socket is the client's connection: bytes flow both ways.
  uint8_t b = 7;
  sendAll(s.fd(), &b, 1, Deadline::after(kGuard));
  uint8_t got = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    recvAll(kept_.at(0).fd(), &got, 1, Deadline::after(kGuard));
  }
  EXPECT_EQ(got, 7);
  EXPECT_TRUE(eventually([&] { return acceptor_->pending() == 0; }));  // reaped
}

TEST_F(AcceptorTest, SilentClientTimesOutAndIsClosed) {
  start(milliseconds(200), 4);
  Socket silent = connectSilent();
  EXPECT_TRUE(closedByAcceptor(silent.fd()));
  EXPECT_TRUE(eventually([&] { return acceptor_->pending() == 0; }));
  EXPECT_EQ(keptCount(), 0u);
}

TEST_F(AcceptorTest, SilentClientsDoNotBlockOthers) {
  // The handshake timeout outlasts the guard, so the good clients can only
  // finish if the silent ones (never authenticating, or stuck inside the
  // callback's exchange) hold up nobody but themselves.
  start(kLong, 8);
  Socket silent = connectSilent();
  Socket halfway = connectSilent();
  auth::authenticate(halfway.fd(), kToken, kLabel, true, Deadline::after(kGuard));
  ASSERT_TRUE(eventually([&] { return acceptor_->pending() == 2; }));
  std::vector<Socket> good;
  for (int i = 0; i < 3; ++i) good.push_back(connectGood());
  EXPECT_TRUE(eventually([&] { return keptCount() == 3; }));
  // The good ones are reaped; the two silent ones are still waiting.
  EXPECT_TRUE(eventually([&] { return acceptor_->pending() == 2; }));
}

TEST_F(AcceptorTest, GarbageAndWrongTokensAreRejected) {
  start(kLong, 4);
  Socket garbage = connectSilent();
  std::vector<uint8_t> junk(512);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
  sendAll(garbage.fd(), junk.data(), junk.size(), Deadline::after(kGuard));
  // Rejected on what it sent, long before the handshake timeout.
  EXPECT_TRUE(closedByAcceptor(garbage.fd()));
  try {
    connectGood("another-token");
    ADD_FAILURE() << "a wrong token was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::kUnauthorized || e.code() == ErrorCode::kPeerLost)
        << e.what();
  }
  EXPECT_TRUE(eventually([&] { return acceptor_->pending() == 0; }));
  EXPECT_EQ(keptCount(), 0u);
  Socket ok = connectGood();  // still serving
  EXPECT_TRUE(eventually([&] { return keptCount() == 1; }));
}

TEST_F(AcceptorTest, PendingHandshakesAreBoundedAndStrangersMakeRoom) {
  constexpr size_t kBound = 2;
  start(kLong, kBound);
  std::vector<Socket> silent;
  for (int i = 0; i < 6; ++i) silent.push_back(connectSilent());
  for (int i = 0; i < 20; ++i) {
    EXPECT_LE(acceptor_->pending(), kBound);
    std::this_thread::sleep_for(milliseconds(5));
  }
  // A legitimate client is served while the strangers hold on (the oldest
  // are dropped to make room), long before their handshakes time out.
  Socket good = connectGood();
  EXPECT_TRUE(eventually([&] { return keptCount() == 1; }));
  int dropped = 0;
  for (auto& s : silent) {
    pollfd p{s.fd(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) ++dropped;
  }
  EXPECT_GE(dropped, 1);
  std::lock_guard<std::mutex> lock(mutex_);
  EXPECT_LE(maxPendingSeen_, kBound);
}

TEST_F(AcceptorTest, AuthenticatedHandshakesAreNeverDropped) {
  constexpr size_t kBound = 2;
  start(kLong, kBound);
  // Both slots are taken by peers past the token check, stalled inside the
  // callback's exchange: a newcomer waits in the backlog instead of evicting.
  std::vector<Socket> stalled;
  for (size_t i = 0; i < kBound; ++i) {
    stalled.push_back(connectSilent());
    auth::authenticate(stalled.back().fd(), kToken, kLabel, true, Deadline::after(kGuard));
  }
  ASSERT_TRUE(eventually([&] { return acceptor_->pending() == kBound; }));
  auto good = std::async(std::launch::async, [&] { return connectGood(); });
  EXPECT_EQ(good.wait_for(milliseconds(300)), std::future_status::timeout);
  for (auto& s : stalled) {
    pollfd p{s.fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0) << "an authenticated handshake was dropped";
  }
  // One of them finishes its exchange: the newcomer is served.
  uint8_t b = 7;
  sendAll(stalled[0].fd(), &b, 1, Deadline::after(kGuard));
  ASSERT_EQ(good.wait_for(kGuard), std::future_status::ready);
  Socket s = good.get();
  EXPECT_TRUE(eventually([&] { return keptCount() == 2; }));
}

TEST_F(AcceptorTest, StopIsPromptWithHandshakesInFlight) {
  start(kLong, 64);
  std::vector<Socket> clients;
  for (int i = 0; i < 8; ++i) clients.push_back(connectSilent());
  // Two more authenticate and then stall inside the callback's exchange.
  for (int i = 0; i < 2; ++i) {
    clients.push_back(connectSilent());
    auth::authenticate(clients.back().fd(), kToken, kLabel, true, Deadline::after(kGuard));
  }
  ASSERT_TRUE(eventually([&] { return acceptor_->pending() == 10; }));
  auto stopped = std::async(std::launch::async, [&] { acceptor_->stop(); });
  ASSERT_EQ(stopped.wait_for(kGuard), std::future_status::ready);
  EXPECT_EQ(acceptor_->pending(), 0u);
  EXPECT_EQ(keptCount(), 0u);
  for (auto& c : clients) EXPECT_TRUE(closedByAcceptor(c.fd()));
  acceptor_->stop();  // idempotent
}

}  // namespace
}  // namespace gflow::net
