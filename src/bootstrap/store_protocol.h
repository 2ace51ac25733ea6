// Wire protocol of the TCP store (private to src/bootstrap/).
//
// After auth::authenticate, a client sends requests and the server answers
// each one in order; a client never has two requests outstanding on one
// connection (TcpStore keeps a pool of connections for concurrent callers).
//
// Every frame is a 12-byte header followed by `bodyLen` bytes; integers are
// little-endian:
//   u32 magic | u8 version | u8 op (request) or status (response) | u16 zero | u32 bodyLen
// Request bodies:
//   kSet   u32 keyLen | key | value (the rest of the body)
//   kGet   u64 timeoutMs | u32 keyLen | key
//   kWait  u64 timeoutMs | u32 count | count x (u32 keyLen | key)
//   kAdd   i64 delta | u32 keyLen | key
//   kCheck u32 count | count x (u32 keyLen | key)
//   kMultiGet u64 timeoutMs | u32 count | count x (u32 keyLen | key)
//   kMultiSet u32 count | count x (u32 keyLen | key | u32 valueLen | value)
// Response bodies by status:
//   kOk       kSet/kWait/kMultiSet: empty; kGet: the value; kAdd: i64 new value;
//             kCheck: one byte (0/1) per key; kMultiGet: u32 count |
//             count x (u32 valueLen | value), in the request's order
//   kTimeout  u32 count | count x (u32 keyLen | key): the keys still missing
//   kError    a human-readable message
// Blocking requests carry their timeout so the server answers kTimeout itself
// and the connection stays in step (a client-side timeout would leave a late
// answer in the stream).
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace gflow::bootstrap::proto {

constexpr uint32_t kRequestMagic = 0x51534647;   // "GFSQ" on the wire
constexpr uint32_t kResponseMagic = 0x52534647;  // "GFSR" on the wire
// 2: kMultiGet; 3: kMultiSet.
constexpr uint8_t kVersion = 3;
constexpr size_t kHeaderSize = 12;
constexpr const char* kAuthLabel = "gflow-store/v1";

// Limits that bound what one peer can make the server hold.
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t{64} << 20;
constexpr size_t kMaxKeysPerRequest = 65536;
constexpr size_t kMaxSetBody = 4 + kMaxKeyBytes + kMaxValueBytes;
constexpr size_t kMaxOtherBody = size_t{1} << 20;  // multi-key requests of ~64k short keys
constexpr size_t kMaxErrorBody = 1024;

enum class Op : uint8_t {
  kSet = 1,
  kGet = 2,
  kWait = 3,
  kAdd = 4,
  kCheck = 5,
  kMultiGet = 6,
  kMultiSet = 7
};
// The values a kMultiGet answer may carry in all.
constexpr size_t kMaxMultiGetBytes = kMaxValueBytes;
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

struct Header {
  uint32_t magic = 0;
  uint8_t version = 0;
  uint8_t code = 0;  // Op or Status
  uint16_t reserved = 0;
  uint32_t bodyLen = 0;
};

// Appends little-endian fields to a byte buffer.
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  void u8(uint8_t v) { out_->push_back(v); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  void key(const std::string& k) {
    u32(static_cast<uint32_t>(k.size()));
    bytes(k.data(), k.size());
  }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_->push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t>* out_;
};

// Reads little-endian fields from a bounded span; every read checks bounds and
// sets ok() false instead of reading past the end.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  size_t left() const { return n_ - pos_; }
  bool atEnd() const { return ok_ && pos_ == n_; }
  const uint8_t* cursor() const { return p_ + pos_; }

  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  // A length-prefixed key of at most maxLen bytes.
  bool key(std::string* out, size_t maxLen) {
    uint32_t len = u32();
    if (!ok_ || len > maxLen || len > left()) return ok_ = false;
    out->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return true;
  }
  void skip(size_t n) {
    if (n > left())
      ok_ = false;
    else
      pos_ += n;
  }

 private:
  uint64_t le(int n) {
    if (!ok_ || left() < static_cast<size_t>(n)) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{p_[pos_ + i]} << (8 * i);
    pos_ += n;
    return v;
  }
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  bool ok_ = true;
};

inline void writeHeader(std::vector<uint8_t>* out, uint32_t magic, uint8_t code, uint32_t bodyLen) {
  Writer w(out);
  w.u32(magic);
  w.u8(kVersion);
  w.u8(code);
  w.u16(0);
  w.u32(bodyLen);
}

inline Header readHeader(const uint8_t* p) {
  Reader r(p, kHeaderSize);
  Header h;
  h.magic = r.u32();
  h.version = r.u8();
  h.code = r.u8();
  h.reserved = r.u16();
  h.bodyLen = r.u32();
  return h;
}

// Timeouts travel as u64 milliseconds; anything beyond ~30 years means "never"
// (and keeps steady_clock arithmetic from overflowing).
constexpr uint64_t kNeverMs = uint64_t{1} << 40;

inline uint64_t toWireMs(std::chrono::milliseconds t) {
  if (t.count() <= 0) return 0;
  return static_cast<uint64_t>(t.count()) >= kNeverMs ? kNeverMs : static_cast<uint64_t>(t.count());
}

inline Deadline deadlineAfterMs(uint64_t ms) {
  if (ms >= kNeverMs) return Deadline::never();
  return Deadline::after(std::chrono::milliseconds(static_cast<int64_t>(ms)));
}

// Values written by add() are decimal strings, so get() of a counter is
// readable and HashStore and TcpStore agree. False when `v` is not one.
inline bool parseCounter(const std::vector<uint8_t>& v, int64_t* out) {
  if (v.empty() || v.size() > 20) return false;
  std::string s(v.begin(), v.end());
  size_t i = (s[0] == '-') ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j) {
    if (s[j] < '0' || s[j] > '9') return false;
  }
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0) return false;
  *out = x;
  return true;
}

// The add() step shared by HashStore and the TCP store server: the new value
// of a counter whose current value is `current` (nullptr: absent). On failure
// returns false with a message naming the key.
inline bool applyAdd(const std::string& key, const std::vector<uint8_t>* current, int64_t delta,
                     int64_t* result, std::string* error) {
  int64_t now = 0;
  if (current != nullptr && !parseCounter(*current, &now)) {
    *error = "add('" + key + "'): the key holds a value that is not a decimal integer";
    return false;
  }
  if (__builtin_add_overflow(now, delta, result)) {
    *error = "add('" + key + "'): " + std::to_string(now) + " + " + std::to_string(delta) +
             " overflows int64";
    return false;
  }
  return true;
}

// Keys for error messages: quoted, non-printable bytes escaped, long keys and
// long lists shortened so a message stays readable.
inline std::string describeKeys(const std::vector<std::string>& keys) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t shown = keys.size() < 8 ? keys.size() : 8;
  for (size_t i = 0; i < shown; ++i) {
    if (i) out += ", ";
    out += '\'';
    const std::string& k = keys[i];
    for (size_t j = 0; j < k.size() && j < 128; ++j) {
      auto c = static_cast<unsigned char>(k[j]);
      if (c >= 0x20 && c < 0x7f && c != '\\') {
        out += static_cast<char>(c);
      } else {
        out += "\\x";
        out += kHex[c >> 4];
        out += kHex[c & 0xf];
      }
    }
    if (k.size() > 128) out += "...";
    out += '\'';
  }
  if (keys.size() > shown) out += " and " + std::to_string(keys.size() - shown) + " more";
  return out;
}

// "store get timed out after 100 ms waiting for key 'x'" or
// "store wait timed out after 100 ms; 2 of 5 keys still missing: 'a', 'b'".
inline std::string describeTimeout(const char* op, std::chrono::milliseconds timeout,
                                   size_t requested, const std::vector<std::string>& missing) {
  std::string s =
      std::string("store ") + op + " timed out after " + std::to_string(timeout.count()) + " ms";
  if (requested <= 1) return s + " waiting for key " + describeKeys(missing);
  return s + "; " + std::to_string(missing.size()) + " of " + std::to_string(requested) +
         " keys still missing: " + describeKeys(missing);
}

}  // namespace gflow::bootstrap::proto
