// SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104) and the job-token handshake.
// Written here rather than taken from OpenSSL so that libgflow has no crypto
// dependency; the handshake only needs a keyed MAC over a few dozen bytes.
//
// Handshake wire format (all fixed size, so a peer that is not gflow is
// recognised after the first 22 bytes and nothing it sends is buffered):
//   both ways:          "GFLW" | u16 version (big-endian) | 16-byte nonce
//   initiator->acceptor: 32-byte proof  HMAC(token, msg('I'))
//   acceptor->initiator: verdict byte, then (if accepted) its proof HMAC(token, msg('A'))
//   initiator->acceptor: verdict byte
// where msg(role) = u32be(len(label)) | label | role | initiatorNonce | acceptorNonce.
// The acceptor checks the initiator's proof before revealing its own, and each
// side sends an explicit verdict, so both ends of a mismatched pair report
// kUnauthorized rather than one of them seeing a bare connection close.
#include "common/auth.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/socket.h"

namespace gflow::auth {
namespace {

// ---- SHA-256 ---------------------------------------------------------------

constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

// Streaming SHA-256 so HMAC can hash (key pad | message) without copying.
class Sha256 {
 public:
  Sha256() {
    static constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                          0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::memcpy(h_, kInit, sizeof(h_));
  }

  void update(const void* data, size_t len) {
    const auto* p = static_cast<const uint8_t*>(data);
    totalBytes_ += len;
    if (bufLen_ > 0) {
      size_t take = std::min(len, sizeof(buf_) - bufLen_);
      std::memcpy(buf_ + bufLen_, p, take);
      bufLen_ += take;
      p += take;
      len -= take;
      if (bufLen_ < sizeof(buf_)) return;
      block(buf_);
      bufLen_ = 0;
    }
    for (; len >= 64; p += 64, len -= 64) block(p);
    std::memcpy(buf_, p, len);
    bufLen_ = len;
  }

  Digest finish() {
    // Padding: 0x80, zeros to 56 mod 64, then the bit length big-endian.
    uint64_t bits = totalBytes_ * 8;
    uint8_t pad[72] = {0x80};
    size_t padLen = (bufLen_ < 56) ? 56 - bufLen_ : 120 - bufLen_;
    for (int i = 0; i < 8; ++i) pad[padLen + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(pad, padLen + 8);
    Digest out;
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
    }
    return out;
  }

 private:
  void block(const uint8_t* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) |
             (uint32_t{p[4 * i + 2]} << 8) | uint32_t{p[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      uint32_t ch = (e & f) ^ (~e & g);
      uint32_t t1 = h + s1 + ch + kRoundConstants[i] + w[i];
      uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      uint32_t t2 = s0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t bufLen_ = 0;
  uint64_t totalBytes_ = 0;
};

// ---- handshake -------------------------------------------------------------

constexpr uint8_t kMagic[4] = {'G', 'F', 'L', 'W'};
constexpr uint16_t kVersion = 1;
constexpr size_t kHelloSize = 4 + 2 + sizeof(Nonce);
constexpr uint8_t kAccept = 0xA5;
constexpr uint8_t kReject = 0x5A;

Digest proof(const std::string& token, const std::string& label, char role, const Nonce& initiator,
             const Nonce& acceptor) {
  std::vector<uint8_t> msg;
  msg.reserve(4 + label.size() + 1 + 2 * sizeof(Nonce));
  uint32_t n = static_cast<uint32_t>(label.size());
  for (int i = 3; i >= 0; --i) msg.push_back(static_cast<uint8_t>(n >> (8 * i)));
  msg.insert(msg.end(), label.begin(), label.end());
  msg.push_back(static_cast<uint8_t>(role));
  msg.insert(msg.end(), initiator.begin(), initiator.end());
  msg.insert(msg.end(), acceptor.begin(), acceptor.end());
  return hmacSha256(token, msg.data(), msg.size());
}

void sendByte(int fd, uint8_t b, Deadline deadline) {
  net::sendAll(fd, &b, 1, deadline);
}

// Best effort: the peer may already be gone; the caller is about to throw anyway.
void sendRejectQuietly(int fd, Deadline deadline) {
  try {
    sendByte(fd, kReject, deadline);
  } catch (const Error&) {
  }
}

}  // namespace

Digest sha256(const void* data, size_t len) {
  Sha256 h;
  h.update(data, len);
  return h.finish();
}

Digest hmacSha256(const std::string& key, const void* data, size_t len) {
  // RFC 2104: keys longer than the block size are hashed first.
  uint8_t k[64] = {0};
  if (key.size() > sizeof(k)) {
    Digest kd = sha256(key.data(), key.size());
    std::memcpy(k, kd.data(), kd.size());
  } else {
    std::memcpy(k, key.data(), key.size());
  }
  uint8_t ipad[64], opad[64];
  for (int i = 0; i < 64; ++i) {
    ipad[i] = k[i] ^ 0x36;
    opad[i] = k[i] ^ 0x5c;
  }
  Sha256 inner;
  inner.update(ipad, sizeof(ipad));
  inner.update(data, len);
  Digest innerDigest = inner.finish();
  Sha256 outer;
  outer.update(opad, sizeof(opad));
  outer.update(innerDigest.data(), innerDigest.size());
  return outer.finish();
}

bool equalConstantTime(const Digest& a, const Digest& b) {
  // Accumulate every difference so the time taken does not depend on where the
  // first mismatch is; volatile keeps the compiler from short-circuiting.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

Nonce randomNonce() {
  Nonce n;
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = ::getrandom(n.data() + got, n.size() - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      GFLOW_SYSCHECK(r, "getrandom");
    }
    got += static_cast<size_t>(r);
  }
  return n;
}

std::string randomToken() {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (int i = 0; i < 2; ++i) {
    Nonce n = randomNonce();
    for (uint8_t b : n) {
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 0xf]);
    }
  }
  return out;
}

void authenticate(int fd, const std::string& token, const std::string& label, bool initiator,
                  Deadline deadline) {
  const ErrorContext ctx = ErrorContext::forOp("authenticate");
  const Nonce mine = randomNonce();

  uint8_t hello[kHelloSize];
  std::memcpy(hello, kMagic, 4);
  hello[4] = static_cast<uint8_t>(kVersion >> 8);
  hello[5] = static_cast<uint8_t>(kVersion & 0xff);
  std::memcpy(hello + 6, mine.data(), mine.size());
  net::sendAll(fd, hello, sizeof(hello), deadline);

  uint8_t peerHello[kHelloSize];
  net::recvAll(fd, peerHello, sizeof(peerHello), deadline);
  if (std::memcmp(peerHello, kMagic, 4) != 0) {
    if (!initiator) sendRejectQuietly(fd, deadline);
    GFLOW_THROW(kUnauthorized, ctx) << "peer " << net::peerAddress(fd) << " (" << label
                                    << ") did not open with the gflow handshake (bad magic); "
                                       "it is not a gflow process or speaks another protocol";
  }
  uint16_t peerVersion = static_cast<uint16_t>((peerHello[4] << 8) | peerHello[5]);
  if (peerVersion != kVersion) {
    if (!initiator) sendRejectQuietly(fd, deadline);
    GFLOW_THROW(kUnauthorized, ctx)
        << "peer " << net::peerAddress(fd) << " (" << label << ") speaks gflow handshake version "
        << peerVersion << ", this process speaks " << kVersion
        << "; are different gflow versions mixed in one job?";
  }
  Nonce theirs;
  std::memcpy(theirs.data(), peerHello + 6, theirs.size());

  const Nonce& initiatorNonce = initiator ? mine : theirs;
  const Nonce& acceptorNonce = initiator ? theirs : mine;
  const Digest expectInitiator = proof(token, label, 'I', initiatorNonce, acceptorNonce);
  const Digest expectAcceptor = proof(token, label, 'A', initiatorNonce, acceptorNonce);
  const char* tokenHint = "the job tokens differ (GFLOW_JOB_TOKEN / Options::token)";

  if (initiator) {
    net::sendAll(fd, expectInitiator.data(), expectInitiator.size(), deadline);
    uint8_t verdict = 0;
    net::recvAll(fd, &verdict, 1, deadline);
    if (verdict != kAccept) {
      GFLOW_THROW(kUnauthorized, ctx)
          << "peer " << net::peerAddress(fd) << " (" << label
          << ") rejected this process's proof of the job token: " << tokenHint;
    }
    Digest got;
    net::recvAll(fd, got.data(), got.size(), deadline);
    bool ok = equalConstantTime(got, expectAcceptor);
    sendByte(fd, ok ? kAccept : kReject, deadline);
    if (!ok) {
      GFLOW_THROW(kUnauthorized, ctx) << "peer " << net::peerAddress(fd) << " (" << label
                                      << ") failed the job-token challenge: " << tokenHint;
    }
    return;
  }

  Digest got;
  net::recvAll(fd, got.data(), got.size(), deadline);
  if (!equalConstantTime(got, expectInitiator)) {
    sendRejectQuietly(fd, deadline);
    GFLOW_THROW(kUnauthorized, ctx) << "peer " << net::peerAddress(fd) << " (" << label
                                    << ") failed the job-token challenge: " << tokenHint;
  }
  uint8_t reply[1 + sizeof(Digest)];
  reply[0] = kAccept;
  std::memcpy(reply + 1, expectAcceptor.data(), expectAcceptor.size());
  net::sendAll(fd, reply, sizeof(reply), deadline);
  uint8_t verdict = 0;
  net::recvAll(fd, &verdict, 1, deadline);
  if (verdict != kAccept) {
    GFLOW_THROW(kUnauthorized, ctx)
        << "peer " << net::peerAddress(fd) << " (" << label
        << ") rejected this process's proof of the job token: " << tokenHint;
  }
}

}  // namespace gflow::auth
