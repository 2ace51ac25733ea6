// TcpStore specifics: authentication, server loss, limits, and a server that
// keeps serving while peers send it garbage.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "bootstrap/store_protocol.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/socket.h"
#include "gflow/error.h"
#include "gflow/store.h"

namespace gflow {
namespace {

namespace proto = bootstrap::proto;
using std::chrono::milliseconds;
using testing::HasSubstr;

constexpr const char* kToken = "tcp-store-test-token";

TcpStoreOptions serverOptions(const std::string& token = kToken) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.isServer = true;
  o.token = token;
  o.timeout = milliseconds(3000);
  return o;
}

TcpStoreOptions clientOptions(uint16_t port, const std::string& token = kToken) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = token;
  o.timeout = milliseconds(3000);
  return o;
}

// An authenticated raw connection for speaking the protocol by hand.
net::Socket rawConnect(uint16_t port, bool authenticate = true) {
  net::Socket s = net::connectTo("127.0.0.1", port, Deadline::after(milliseconds(2000)), "store");
  if (authenticate) {
    auth::authenticate(s.fd(), kToken, proto::kAuthLabel, true,
                       Deadline::after(milliseconds(2000)));
  }
  return s;
}

// True when the server closes `fd` within the time limit (data is discarded).
bool closedByServer(int fd, milliseconds limit = milliseconds(2000)) {
  Deadline d = Deadline::after(limit);
  char buf[4096];
  while (!d.expired()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, d.remainingMs()) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
  return false;
}

std::vector<uint8_t> frame(uint32_t magic, uint8_t version, uint8_t op, uint16_t reserved,
                           uint32_t bodyLen, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> f;
  proto::Writer w(&f);
  w.u32(magic);
  w.u8(version);
  w.u8(op);
  w.u16(reserved);
  w.u32(bodyLen);
  w.bytes(body.data(), body.size());
  return f;
}

void sendBytes(int fd, const std::vector<uint8_t>& b) {
  net::sendAll(fd, b.data(), b.size(), Deadline::after(milliseconds(2000)));
}

// The server still answers a normal client correctly.
void expectServing(TcpStore& server, const std::string& what) {
  static std::atomic<int> calls{0};
  const std::string tag = what + "#" + std::to_string(calls++);
  TcpStore client(clientOptions(server.port()));
  client.setString("alive/" + tag, tag);
  EXPECT_EQ(server.getString("alive/" + tag, milliseconds(1000)), tag);
  EXPECT_EQ(client.add("alive-counter/" + tag, 2), 2);
}

class TcpStoreTest : public testing::Test {
 protected:
  TcpStore server_{serverOptions()};
};

TEST_F(TcpStoreTest, ManyClients) {
  constexpr int kClients = 64;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      TcpStore c(clientOptions(server_.port()));
      c.setString("k" + std::to_string(i), std::to_string(i));
      c.add("arrived", 1);
      c.wait({"go"}, milliseconds(5000));
      EXPECT_EQ(c.getString("k" + std::to_string((i + 1) % kClients), milliseconds(5000)),
                std::to_string((i + 1) % kClients));
    });
  }
  // All clients are parked on "go" at once; the server must not be stuck on any.
  Deadline d = Deadline::after(milliseconds(5000));
  while (server_.add("arrived", 0) < kClients && !d.expired()) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  server_.setString("go", "");
  for (auto& t : threads) t.join();
  EXPECT_EQ(server_.add("arrived", 0), kClients);
}

TEST_F(TcpStoreTest, WrongTokenIsUnauthorizedQuickly) {
  auto start = std::chrono::steady_clock::now();
  try {
    TcpStore c(clientOptions(server_.port(), "not-the-token"));
    FAIL() << "expected kUnauthorized";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnauthorized) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  try {
    TcpStore c(clientOptions(server_.port(), ""));
    FAIL() << "expected kUnauthorized";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnauthorized) << e.what();
  }
  expectServing(server_, "after-bad-token");
}

TEST(TcpStoreLifecycleTest, ServerGoneIsPeerLost) {
  auto server = std::make_unique<TcpStore>(serverOptions());
  TcpStore client(clientOptions(server->port()));
  client.setString("x", "1");
  std::string where = "127.0.0.1:" + std::to_string(server->port());
  auto blocked = std::async(std::launch::async, [&] {
    try {
      client.get("never", milliseconds(5000));
      return std::string("no error");
    } catch (const Error& e) {
      return std::string(toString(e.code())) + " " + e.detail();
    }
  });
  std::this_thread::sleep_for(milliseconds(50));
  auto start = std::chrono::steady_clock::now();
  server.reset();  // stops the server thread, closing every connection
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  std::string r = blocked.get();
  EXPECT_THAT(r, HasSubstr("peer_lost"));
  EXPECT_THAT(r, HasSubstr("store at " + where + " closed the connection"));
  try {
    client.setString("y", "2");
    FAIL() << "expected kPeerLost";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerLost);
  }
}

TEST(TcpStoreLifecycleTest, ClientWaitsForLateServer) {
  uint16_t port = 0;
  { net::Socket probe = net::listenOn("127.0.0.1", net::PortRange{}, &port); }
  auto client = std::async(std::launch::async, [port] {
    TcpStore c(clientOptions(port));
    return c.getString("hello", milliseconds(3000));
  });
  std::this_thread::sleep_for(milliseconds(200));
  TcpStoreOptions o = serverOptions();
  o.port = port;
  TcpStore server(o);
  server.setString("hello", "world");
  EXPECT_EQ(client.get(), "world");
}

TEST(TcpStoreLifecycleTest, NoServerTimesOut) {
  uint16_t port = 0;
  { net::Socket probe = net::listenOn("127.0.0.1", net::PortRange{}, &port); }
  TcpStoreOptions o = clientOptions(port);
  o.timeout = milliseconds(200);
  try {
    TcpStore c(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_THAT(e.detail(), HasSubstr(std::to_string(port)));
  }
}

TEST(TcpStoreLifecycleTest, PortInUseIsClear) {
  uint16_t port = 0;
  net::Socket held = net::listenOn("127.0.0.1", net::PortRange{}, &port);
  TcpStoreOptions o = serverOptions();
  o.port = port;
  try {
    TcpStore s(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.detail(), HasSubstr("store server"));
  }
  TcpStoreOptions c;
  c.port = 0;
  EXPECT_THROW(TcpStore{c}, Error);  // a client needs a port
}

TEST_F(TcpStoreTest, ClientSideLimits) {
  std::vector<uint8_t> tooBig(proto::kMaxValueBytes + 1);
  EXPECT_THROW(server_.set("k", tooBig), Error);
  EXPECT_THROW(server_.set(std::string(proto::kMaxKeyBytes + 1, 'k'), {}), Error);
  server_.set(std::string(proto::kMaxKeyBytes, 'k'), {1});
  EXPECT_EQ(server_.get(std::string(proto::kMaxKeyBytes, 'k'), milliseconds(0)),
            std::vector<uint8_t>{1});
}

TEST_F(TcpStoreTest, CheckOpOverRawProtocol) {
  server_.setString("present", "1");
  net::Socket s = rawConnect(server_.port());
  std::vector<uint8_t> body;
  proto::Writer w(&body);
  w.u32(2);
  w.key("present");
  w.key("absent");
  sendBytes(s.fd(),
            frame(proto::kRequestMagic, proto::kVersion, static_cast<uint8_t>(proto::Op::kCheck), 0,
                  static_cast<uint32_t>(body.size()), body));
  uint8_t reply[proto::kHeaderSize + 2];
  net::recvAll(s.fd(), reply, sizeof(reply), Deadline::after(milliseconds(1000)));
  proto::Header h = proto::readHeader(reply);
  EXPECT_EQ(h.magic, proto::kResponseMagic);
  EXPECT_EQ(h.code, static_cast<uint8_t>(proto::Status::kOk));
  EXPECT_EQ(h.bodyLen, 2u);
  EXPECT_EQ(reply[proto::kHeaderSize], 1);
  EXPECT_EQ(reply[proto::kHeaderSize + 1], 0);
}

TEST_F(TcpStoreTest, PipelinedRequestsAreAnsweredInOrder) {
  net::Socket s = rawConnect(server_.port());
  std::vector<uint8_t> all;
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> body;
    proto::Writer w(&body);
    w.u64(static_cast<uint64_t>(i + 1));
    w.key("pipe");
    auto f = frame(proto::kRequestMagic, proto::kVersion, static_cast<uint8_t>(proto::Op::kAdd), 0,
                   static_cast<uint32_t>(body.size()), body);
    all.insert(all.end(), f.begin(), f.end());
  }
  sendBytes(s.fd(), all);
  for (int64_t expect : {1, 3, 6}) {
    uint8_t reply[proto::kHeaderSize + 8];
    net::recvAll(s.fd(), reply, sizeof(reply), Deadline::after(milliseconds(1000)));
    proto::Reader r(reply + proto::kHeaderSize, 8);
    EXPECT_EQ(static_cast<int64_t>(r.u64()), expect);
  }
}

// ---- robustness: every case closes (only) the offending connection -----------

class TcpStoreRobustnessTest : public TcpStoreTest {
 protected:
  // Sends `bytes` on a fresh connection and expects the server to close it
  // and log a WARN containing `logged`; then checks the server still serves.
  void expectRejected(const std::vector<uint8_t>& bytes, const std::string& logged,
                      bool authenticate = true, bool halfClose = false) {
    testing::internal::CaptureStderr();
    bool closed;
    {
      net::Socket s = rawConnect(server_.port(), authenticate);
      sendBytes(s.fd(), bytes);
      if (halfClose) ::shutdown(s.fd(), SHUT_WR);
      closed = closedByServer(s.fd());
    }
    std::this_thread::sleep_for(milliseconds(20));  // the log line lands before close; be safe
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(closed) << "server kept a connection that sent bad bytes open";
    if (log::enabled(log::Level::WARN)) {
      EXPECT_THAT(err, HasSubstr(logged));
      EXPECT_THAT(err, HasSubstr("127.0.0.1:"));  // names the peer
    }
    expectServing(server_, logged.substr(0, 8));
  }
};

TEST_F(TcpStoreRobustnessTest, GarbageBeforeAuthentication) {
  std::string http = "GET / HTTP/1.1\r\nHost: store\r\n\r\n";
  expectRejected(std::vector<uint8_t>(http.begin(), http.end()), "bad magic", false);
}

TEST_F(TcpStoreRobustnessTest, BadMagicAfterAuthentication) {
  expectRejected(frame(0xdeadbeef, proto::kVersion, 1, 0, 0, {}), "bad magic 0xdeadbeef");
}

TEST_F(TcpStoreRobustnessTest, BadVersion) {
  expectRejected(frame(proto::kRequestMagic, 7, 1, 0, 0, {}), "protocol version 7");
}

TEST_F(TcpStoreRobustnessTest, UnknownOp) {
  expectRejected(frame(proto::kRequestMagic, proto::kVersion, 99, 0, 0, {}), "unknown request op");
}

TEST_F(TcpStoreRobustnessTest, NonzeroReserved) {
  expectRejected(frame(proto::kRequestMagic, proto::kVersion, 1, 5, 0, {}), "reserved");
}

TEST_F(TcpStoreRobustnessTest, OversizedLength) {
  expectRejected(frame(proto::kRequestMagic, proto::kVersion, 1, 0, 0xffffffffu, {}),
                 "exceeds the limit");
  expectRejected(frame(proto::kRequestMagic, proto::kVersion, 2, 0, 2u << 20, {}),
                 "exceeds the limit");
}

TEST_F(TcpStoreRobustnessTest, KeyLengthBeyondBody) {
  std::vector<uint8_t> body;
  proto::Writer w(&body);
  w.u32(1000);  // key length, but only 3 bytes follow
  w.bytes("abc", 3);
  expectRejected(frame(proto::kRequestMagic, proto::kVersion, 1, 0, 7, body), "malformed set");
}

TEST_F(TcpStoreRobustnessTest, MalformedMultiSets) {
  const auto op = static_cast<uint8_t>(proto::Op::kMultiSet);
  std::vector<uint8_t> body;
  proto::Writer w(&body);
  w.u32(2);  // two pairs, one present, and its value runs past the body
  w.key("k");
  w.u32(1000);
  w.bytes("v", 1);
  expectRejected(
      frame(proto::kRequestMagic, proto::kVersion, op, 0, static_cast<uint32_t>(body.size()), body),
      "malformed multi-set");
  std::vector<uint8_t> many;
  proto::Writer(&many).u32(0xffffffffu);
  expectRejected(frame(proto::kRequestMagic, proto::kVersion, op, 0, 4, many),
                 "malformed multi-set");
}

TEST_F(TcpStoreRobustnessTest, TooManyKeysInWait) {
  std::vector<uint8_t> body;
  proto::Writer w(&body);
  w.u64(0);
  w.u32(0xffffffffu);
  expectRejected(frame(proto::kRequestMagic, proto::kVersion, 3, 0, 12, body), "too many keys");
}

TEST_F(TcpStoreRobustnessTest, TruncatedFrame) {
  std::vector<uint8_t> f =
      frame(proto::kRequestMagic, proto::kVersion, 1, 0, 100, std::vector<uint8_t>(10, 'x'));
  expectRejected(f, "truncated request", true, /*halfClose=*/true);
}

TEST_F(TcpStoreRobustnessTest, SilentPeersDoNotBlockOthers) {
  // One peer never authenticates, one stops mid-frame, one parks a get.
  net::Socket silent = rawConnect(server_.port(), false);
  net::Socket partial = rawConnect(server_.port());
  sendBytes(partial.fd(), frame(proto::kRequestMagic, proto::kVersion, 1, 0, 1000, {0, 0}));
  TcpStore waiter(clientOptions(server_.port()));
  auto parked = std::async(std::launch::async, [&] { waiter.get("nope", milliseconds(300)); });
  auto start = std::chrono::steady_clock::now();
  expectServing(server_, "silent");
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(500));
  EXPECT_THROW(parked.get(), Error);
}

TEST(TcpStoreShutdownTest, DestructorIsPromptWithSilentPeers) {
  auto server = std::make_unique<TcpStore>(serverOptions());
  std::vector<net::Socket> silent;
  for (int i = 0; i < 8; ++i) silent.push_back(rawConnect(server->port(), i % 2 == 0));
  std::this_thread::sleep_for(milliseconds(50));
  auto start = std::chrono::steady_clock::now();
  server.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
}

TEST_F(TcpStoreRobustnessTest, RandomFramesNeverHurtTheServer) {
  // Valid header, random op and body: the server answers or closes, never
  // crashes or hangs (under ASan this also checks the parser's bounds).
  std::mt19937 rng(12345);
  testing::internal::CaptureStderr();
  for (int i = 0; i < 60; ++i) {
    net::Socket s = rawConnect(server_.port());
    std::vector<uint8_t> body(rng() % 64);
    for (auto& b : body) b = static_cast<uint8_t>(rng() % 4 == 0 ? 0 : rng());
    uint8_t op = static_cast<uint8_t>(1 + rng() % 7);
    if (op == static_cast<uint8_t>(proto::Op::kGet) ||
        op == static_cast<uint8_t>(proto::Op::kWait) ||
        op == static_cast<uint8_t>(proto::Op::kMultiGet)) {
      for (size_t j = 0; j < 8 && j < body.size(); ++j) body[j] = 0;  // timeout 0: no parking
    }
    sendBytes(s.fd(), frame(proto::kRequestMagic, proto::kVersion, op, 0,
                            static_cast<uint32_t>(body.size()), body));
    ::shutdown(s.fd(), SHUT_WR);
    EXPECT_TRUE(closedByServer(s.fd())) << "iteration " << i;
  }
  testing::internal::GetCapturedStderr();
  expectServing(server_, "fuzzed");
}

}  // namespace
}  // namespace gflow
