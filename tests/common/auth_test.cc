#include "common/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include "common/socket.h"
#include "gflow/error.h"

namespace gflow::auth {
namespace {

using std::chrono::milliseconds;
using testing::HasSubstr;

std::string hex(const Digest& d) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += kHex[b >> 4];
    s += kHex[b & 0xf];
  }
  return s;
}

std::string fromHex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string sha(const std::string& s) {
  return hex(sha256(s.data(), s.size()));
}
std::string hmac(const std::string& key, const std::string& data) {
  return hex(hmacSha256(key, data.data(), data.size()));
}

// FIPS 180-4 examples (csrc.nist.gov SHA256.pdf, SHA2_Additional.pdf).
TEST(Sha256Test, FipsVectors) {
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, PaddingBoundaries) {
  // Lengths around the 55/56/64-byte padding edges; reference values from
  // coreutils sha256sum.
  EXPECT_EQ(sha(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

// RFC 4231 test cases 1-4, 6, 7 (case 5 truncates the output; checked as a prefix).
TEST(HmacSha256Test, Rfc4231Vectors) {
  EXPECT_EQ(hmac(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmac("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmac(std::string(20, '\xaa'), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  EXPECT_EQ(
      hmac(fromHex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd')),
      "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(hmac(std::string(20, '\x0c'), "Test With Truncation").substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
  EXPECT_EQ(
      hmac(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
      "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hmac(std::string(131, '\xaa'),
                 "This is a test using a larger than block-size key and a larger than "
                 "block-size data. The key needs to be hashed before being used by the HMAC "
                 "algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(AuthPrimitivesTest, ConstantTimeCompare) {
  Digest a = sha256("x", 1);
  Digest b = a;
  EXPECT_TRUE(equalConstantTime(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(equalConstantTime(a, b));
  b = a;
  b[0] ^= 0x80;
  EXPECT_FALSE(equalConstantTime(a, b));
}

TEST(AuthPrimitivesTest, RandomNoncesAndTokens) {
  EXPECT_NE(randomNonce(), randomNonce());
  std::string t = randomToken();
  EXPECT_EQ(t.size(), 64u);
  EXPECT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(t, randomToken());
}

// A connected loopback TCP pair: authenticate() is meant for real sockets.
struct Pair {
  net::Socket a, b;  // a connected to b (a is the initiator side)
};

Pair makePair() {
  uint16_t port = 0;
  net::Socket l = net::listenOn("127.0.0.1", net::PortRange{}, &port);
  Pair p;
  p.a = net::connectTo("127.0.0.1", port, Deadline::after(milliseconds(2000)), "test");
  p.b = net::Socket(::accept(l.fd(), nullptr, nullptr));
  EXPECT_TRUE(p.b.valid());
  return p;
}

// Runs both sides; returns the errors (empty string: success).
std::pair<std::string, std::string> runBoth(const std::string& tokenA, const std::string& tokenB,
                                            const std::string& labelA = "test/v1",
                                            const std::string& labelB = "test/v1") {
  Pair p = makePair();
  auto side = [](int fd, const std::string& token, const std::string& label, bool initiator) {
    try {
      authenticate(fd, token, label, initiator, Deadline::after(milliseconds(2000)));
      return std::string();
    } catch (const Error& e) {
      return std::string(toString(e.code())) + ": " + e.detail();
    }
  };
  auto acceptor = std::async(std::launch::async, side, p.b.fd(), tokenB, labelB, false);
  std::string initiatorResult = side(p.a.fd(), tokenA, labelA, true);
  return {initiatorResult, acceptor.get()};
}

TEST(AuthenticateTest, SameTokenSucceeds) {
  auto r = runBoth("job-secret", "job-secret");
  EXPECT_EQ(r.first, "");
  EXPECT_EQ(r.second, "");
}

TEST(AuthenticateTest, EmptyTokensOnBothSidesSucceed) {
  auto r = runBoth("", "");
  EXPECT_EQ(r.first, "");
  EXPECT_EQ(r.second, "");
}

TEST(AuthenticateTest, WrongTokenFailsOnBothSides) {
  auto start = std::chrono::steady_clock::now();
  auto r = runBoth("job-secret", "other-secret");
  EXPECT_THAT(r.first, HasSubstr("unauthorized"));
  EXPECT_THAT(r.second, HasSubstr("unauthorized"));
  EXPECT_THAT(r.first, HasSubstr("job token"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
}

TEST(AuthenticateTest, TokenAgainstNoTokenFails) {
  auto r = runBoth("job-secret", "");
  EXPECT_THAT(r.first, HasSubstr("unauthorized"));
  EXPECT_THAT(r.second, HasSubstr("unauthorized"));
  r = runBoth("", "job-secret");
  EXPECT_THAT(r.first, HasSubstr("unauthorized"));
  EXPECT_THAT(r.second, HasSubstr("unauthorized"));
}

TEST(AuthenticateTest, DifferentLabelsFail) {
  // A proof for one purpose (store) must not open another (data connection).
  auto r = runBoth("t", "t", "gflow-store/v1", "gflow-tcp/v1");
  EXPECT_THAT(r.first, HasSubstr("unauthorized"));
  EXPECT_THAT(r.second, HasSubstr("unauthorized"));
}

TEST(AuthenticateTest, GarbageMagicIsUnauthorized) {
  Pair p = makePair();
  const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  net::sendAll(p.a.fd(), garbage, sizeof(garbage) - 1, Deadline::after(milliseconds(1000)));
  try {
    authenticate(p.b.fd(), "t", "test/v1", false, Deadline::after(milliseconds(1000)));
    FAIL() << "expected kUnauthorized";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnauthorized);
    EXPECT_THAT(e.detail(), HasSubstr("bad magic"));
  }
}

TEST(AuthenticateTest, WrongVersionIsUnauthorized) {
  Pair p = makePair();
  uint8_t hello[22] = {'G', 'F', 'L', 'W', 0, 99};
  net::sendAll(p.a.fd(), hello, sizeof(hello), Deadline::after(milliseconds(1000)));
  try {
    authenticate(p.b.fd(), "t", "test/v1", false, Deadline::after(milliseconds(1000)));
    FAIL() << "expected kUnauthorized";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnauthorized);
    EXPECT_THAT(e.detail(), HasSubstr("version 99"));
  }
}

TEST(AuthenticateTest, SilentPeerTimesOut) {
  Pair p = makePair();
  auto start = std::chrono::steady_clock::now();
  try {
    authenticate(p.b.fd(), "t", "test/v1", false, Deadline::after(milliseconds(150)));
    FAIL() << "expected kTimeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
  }
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(140));
  EXPECT_LT(took, milliseconds(1000));
}

TEST(AuthenticateTest, PeerClosingIsPeerLost) {
  Pair p = makePair();
  p.a.close();
  try {
    authenticate(p.b.fd(), "t", "test/v1", false, Deadline::after(milliseconds(1000)));
    FAIL() << "expected kPeerLost";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerLost);
  }
}

}  // namespace
}  // namespace gflow::auth
