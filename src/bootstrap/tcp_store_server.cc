// See tcp_store_server.h for the design.
#include "bootstrap/tcp_store_server.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/check.h"
#include "common/logging.h"
#include "common/resource_counts.h"
#include "common/socket.h"

namespace gflow::bootstrap {
namespace {

using proto::Op;
using proto::Status;
using Value = TcpStoreServer::Value;

// Authenticated connections. Each rank needs about one, so this is above any
// job size we expect; `ulimit -n` usually binds first.
constexpr size_t kMaxConnections = 65536;
constexpr size_t kMaxHandshakes = 256;
constexpr size_t kMaxStoredBytes = size_t{1} << 30;
constexpr size_t kReadChunk = size_t{256} << 10;
constexpr std::chrono::milliseconds kMaxHandshakeTime{30000};

// A request that breaks the protocol; closes that connection only.
struct ProtocolError {
  std::string what;
};

const char* opName(Op op) {
  switch (op) {
    case Op::kSet: return "set";
    case Op::kGet: return "get";
    case Op::kWait: return "wait";
    case Op::kAdd: return "add";
    case Op::kCheck: return "check";
    case Op::kMultiGet: return "multi-get";
    case Op::kMultiSet: return "multi-set";
  }
  return "?";
}

std::string hex32(uint32_t v) {
  static const char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 7; i >= 0; --i) s += kHex[(v >> (4 * i)) & 0xf];
  return s;
}

ProtocolError malformed(Op op, const char* why) {
  return ProtocolError{std::string("malformed ") + opName(op) + " request: " + why};
}

// A key count and that many keys (wait, check).
std::vector<std::string> readKeys(proto::Reader& r, Op op) {
  uint32_t count = r.u32();
  if (!r.ok()) throw malformed(op, "truncated key count");
  if (count > proto::kMaxKeysPerRequest) throw malformed(op, "too many keys");
  std::vector<std::string> keys(count);
  for (auto& k : keys) {
    if (!r.key(&k, proto::kMaxKeyBytes)) throw malformed(op, "key truncated or longer than 4 KiB");
  }
  return keys;
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, std::string token,
                               std::chrono::milliseconds handshakeTimeout) {
  net::Socket listener;
  try {
    listener = net::listenOn(host, net::PortRange{port, port}, &port_);
  } catch (const Error& e) {
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("store"))
        << "cannot start the store server on " << host << ":" << port << ": " << e.detail();
  }
  wake_ = net::Socket(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  GFLOW_SYSCHECK(wake_.fd(), "eventfd");
  epoll_ = net::Socket(::epoll_create1(EPOLL_CLOEXEC));
  GFLOW_SYSCHECK(epoll_.fd(), "epoll_create1");
  GFLOW_SYSCHECK(arm(wake_.fd(), kWakeTag, EPOLLIN, true) ? 0 : -1, "epoll_ctl");
  net::HandshakeAcceptor::Options ao;
  ao.name = "store";
  ao.token = std::move(token);
  ao.label = proto::kAuthLabel;
  ao.timeout = std::min(handshakeTimeout, kMaxHandshakeTime);
  ao.maxPending = kMaxHandshakes;
  acceptor_ = std::make_unique<net::HandshakeAcceptor>(
      std::move(listener), std::move(ao),
      [this](net::HandshakeAcceptor::Handshake& h) { onAuthenticated(h); });
  // Arrivals before the loop runs wait in arrivals_ (and the eventfd count).
  resources::threadStarted();
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::~TcpStoreServer() {
  // The acceptor first: its callbacks post to the loop through wake_.
  acceptor_.reset();
  stop_.store(true);
  wakeLoop();
  thread_.join();
}

void TcpStoreServer::wakeLoop() {
  uint64_t one = 1;
  ssize_t r = ::write(wake_.fd(), &one, sizeof(one));
  (void)r;  // the counter cannot overflow in practice
}

void TcpStoreServer::run() {
  loop_.enter();
  while (!stop_.load()) {
    try {
      loopOnce();
    } catch (const std::exception& e) {
      // Never let the store die with the job still depending on it; a failure
      // here is a bug or resource exhaustion, so slow down and keep serving.
      GFLOW_LOG(ERROR) << "store server: " << e.what();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  conns_.clear();
}

bool TcpStoreServer::arm(int fd, uint64_t tag, uint32_t events, bool add) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  return ::epoll_ctl(epoll_.fd(), add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev) == 0;
}

void TcpStoreServer::loopOnce() {
  int timeoutMs = -1;
  if (!parkedByDeadline_.empty()) {
    // Round up so a sub-millisecond remainder does not spin.
    auto left = parkedByDeadline_.begin()->first - Deadline::Clock::now();
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    ms = std::max<int64_t>(0, std::min<int64_t>(ms, INT32_MAX));
    if (timeoutMs < 0 || ms < timeoutMs) timeoutMs = static_cast<int>(ms);
  }

  epoll_event events[256];
  int n = ::epoll_wait(epoll_.fd(), events, 256, timeoutMs);
  if (n < 0) {
    if (errno == EINTR) return;
    GFLOW_SYSCHECK(n, "epoll_wait");
  }
  for (int i = 0; i < n; ++i) {
    uint64_t tag = events[i].data.u64;
    if (tag == kWakeTag) {
      uint64_t count;
      while (::read(wake_.fd(), &count, sizeof(count)) > 0) {
      }
      admitArrivals();
    } else {
      auto it = conns_.find(tag);
      if (it != conns_.end() && !it->second.dead) onEvents(it->second, events[i].events);
    }
  }
  expireWaiters();
  while (!runnable_.empty()) {
    uint64_t id = runnable_.back();
    runnable_.pop_back();
    auto it = conns_.find(id);
    if (it != conns_.end() && !it->second.dead) processFrames(it->second);
  }
  // Re-arm connections whose state changed: a pending answer waits for
  // EPOLLOUT; a parked one is not read (its next request must wait) but is
  // watched for the client going away; any other is read.
  for (uint64_t id : touched_) {
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.dead) continue;
    Conn& c = it->second;
    uint32_t want = c.outPending() ? EPOLLOUT : (c.parked ? EPOLLRDHUP : EPOLLIN);
    if (want == c.armed) continue;
    if (!arm(c.sock.fd(), c.id, want, false)) {
      close(c, "cannot watch the connection: " + detail::errnoString(errno), true);
      continue;
    }
    c.armed = want;
  }
  touched_.clear();
  // Closing a descriptor also removes it from the epoll set.
  for (uint64_t id : dead_) conns_.erase(id);
  dead_.clear();
}

void TcpStoreServer::onAuthenticated(net::HandshakeAcceptor::Handshake& h) {
  net::Socket sock = h.take();
  if (!sock.valid()) return;  // shutting down
  {
    MutexLock lock(arrivalsMutex_);
    arrivals_.push_back(Arrival{std::move(sock), h.peer()});
  }
  wakeLoop();
}

void TcpStoreServer::admitArrivals() {
  std::vector<Arrival> arrivals;
  {
    MutexLock lock(arrivalsMutex_);
    arrivals.swap(arrivals_);
  }
  for (Arrival& a : arrivals) {
    if (conns_.size() >= kMaxConnections) {
      GFLOW_LOG(WARN) << "store: refusing connection from " << a.peer << ": " << kMaxConnections
                      << " connections already open";
      continue;
    }
    uint64_t id = nextId_++;
    Conn& c = conns_[id];
    c.id = id;
    c.sock = std::move(a.sock);
    c.peer = std::move(a.peer);
    c.armed = EPOLLIN;
    int flags = ::fcntl(c.sock.fd(), F_GETFL, 0);
    if (flags < 0 || ::fcntl(c.sock.fd(), F_SETFL, flags | O_NONBLOCK) < 0 ||
        !arm(c.sock.fd(), id, c.armed, true)) {
      close(c, "cannot watch the connection: " + detail::errnoString(errno), true);
    }
  }
}

void TcpStoreServer::onEvents(Conn& c, uint32_t events) {
  if (events & EPOLLOUT) flush(c);
  if (c.dead) return;
  if (events & EPOLLIN) {
    readSome(c);
  } else if (events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
    close(c, c.parked ? "client went away while waiting" : "connection closed", false);
  }
}

void TcpStoreServer::readSome(Conn& c) {
  // Read what the current frame still needs (at least a chunk), so a large
  // value arrives in few reads but nothing beyond one frame is buffered much.
  size_t want = kReadChunk;
  if (c.in.size() >= proto::kHeaderSize) {
    size_t frame = proto::kHeaderSize + proto::readHeader(c.in.data()).bodyLen;
    if (frame > c.in.size()) want = std::max(want, std::min(frame - c.in.size(), size_t{4} << 20));
  }
  size_t old = c.in.size();
  c.in.resize(old + want);
  ssize_t n;
  do {
    n = ::recv(c.sock.fd(), c.in.data() + old, want, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  int err = errno;
  c.in.resize(old + (n > 0 ? static_cast<size_t>(n) : 0));
  if (n > 0) {
    processFrames(c);
    return;
  }
  if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return;
  if (c.in.empty()) {
    close(c, n == 0 ? "connection closed" : detail::errnoString(err), false);
    return;
  }
  std::string have = std::to_string(c.in.size()) + " bytes of an unfinished request";
  if (c.in.size() >= proto::kHeaderSize) {
    have += " (header announced " +
            std::to_string(proto::kHeaderSize + proto::readHeader(c.in.data()).bodyLen) + ")";
  }
  close(c, "connection closed with a truncated request: got " + have, true);
}

void TcpStoreServer::processFrames(Conn& c) {
  size_t pos = 0;
  try {
    while (!c.dead && !c.parked && !c.outPending()) {
      size_t avail = c.in.size() - pos;
      if (avail < proto::kHeaderSize) break;
      proto::Header h = proto::readHeader(c.in.data() + pos);
      if (h.magic != proto::kRequestMagic) {
        throw ProtocolError{"bad magic " + hex32(h.magic) +
                            " in request header (not a gflow store client?)"};
      }
      if (h.version != proto::kVersion) {
        throw ProtocolError{"unsupported store protocol version " + std::to_string(h.version) +
                            " (this server speaks " + std::to_string(proto::kVersion) + ")"};
      }
      if (h.code < static_cast<uint8_t>(Op::kSet) || h.code > static_cast<uint8_t>(Op::kMultiSet)) {
        throw ProtocolError{"unknown request op " + std::to_string(h.code)};
      }
      if (h.reserved != 0) throw ProtocolError{"nonzero reserved header field"};
      const Op op = static_cast<Op>(h.code);
      const size_t limit = op == Op::kSet ? proto::kMaxSetBody : proto::kMaxOtherBody;
      if (h.bodyLen > limit) {
        throw ProtocolError{std::string(opName(op)) + " request of " + std::to_string(h.bodyLen) +
                            " bytes exceeds the limit of " + std::to_string(limit)};
      }
      if (avail < proto::kHeaderSize + h.bodyLen) break;
      dispatch(c, op, c.in.data() + pos + proto::kHeaderSize, h.bodyLen);
      pos += proto::kHeaderSize + h.bodyLen;
    }
  } catch (const ProtocolError& e) {
    close(c, e.what, true);
    return;
  } catch (const std::bad_alloc&) {
    close(c, "out of memory while handling its request", true);
    return;
  }
  if (pos == c.in.size()) {
    // Drop the capacity of a large value once it is stored.
    if (c.in.capacity() > (size_t{1} << 20))
      std::vector<uint8_t>().swap(c.in);
    else
      c.in.clear();
  } else if (pos > 0) {
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  }
}

void TcpStoreServer::dispatch(Conn& c, Op op, const uint8_t* body, size_t len) {
  proto::Reader r(body, len);
  switch (op) {
    case Op::kSet: return onSet(c, r);
    case Op::kGet: return onGet(c, r);
    case Op::kWait: return onWait(c, r);
    case Op::kAdd: return onAdd(c, r);
    case Op::kCheck: return onCheck(c, r);
    case Op::kMultiGet: return onMultiGet(c, r);
    case Op::kMultiSet: return onMultiSet(c, r);
  }
}

void TcpStoreServer::onSet(Conn& c, proto::Reader& r) {
  std::string key;
  if (!r.key(&key, proto::kMaxKeyBytes)) {
    throw malformed(Op::kSet, "key truncated or longer than 4 KiB");
  }
  size_t valueLen = r.left();
  if (valueLen > proto::kMaxValueBytes) throw malformed(Op::kSet, "value larger than 64 MiB");
  auto it = data_.find(key);
  size_t oldBytes = it == data_.end() ? 0 : key.size() + it->second->size();
  size_t newTotal = storedBytes_ - oldBytes + key.size() + valueLen;
  if (newTotal > kMaxStoredBytes) {
    std::string msg = "store is full: setting '" + key.substr(0, 128) + "' (" +
                      std::to_string(valueLen) + " bytes) would exceed " +
                      std::to_string(kMaxStoredBytes) + " stored bytes";
    respond(c, Status::kError, std::vector<uint8_t>(msg.begin(), msg.end()));
    return;
  }
  auto v = std::make_shared<const std::vector<uint8_t>>(r.cursor(), r.cursor() + valueLen);
  storedBytes_ = newTotal;
  data_[key] = std::move(v);
  respond(c, Status::kOk, {});
  notifyKey(key);
}

void TcpStoreServer::onGet(Conn& c, proto::Reader& r) {
  uint64_t timeoutMs = r.u64();
  std::string key;
  if (!r.key(&key, proto::kMaxKeyBytes) || !r.atEnd()) throw malformed(Op::kGet, "bad key field");
  auto it = data_.find(key);
  if (it != data_.end()) {
    respond(c, Status::kOk, {}, it->second);
  } else {
    park(c, Op::kGet, {std::move(key)}, timeoutMs);
  }
}

void TcpStoreServer::onWait(Conn& c, proto::Reader& r) {
  uint64_t timeoutMs = r.u64();
  std::vector<std::string> keys = readKeys(r, Op::kWait);
  if (!r.atEnd()) throw malformed(Op::kWait, "trailing bytes");
  if (missingOf(keys).empty()) {
    respond(c, Status::kOk, {});
  } else {
    park(c, Op::kWait, std::move(keys), timeoutMs);
  }
}

void TcpStoreServer::onAdd(Conn& c, proto::Reader& r) {
  auto delta = static_cast<int64_t>(r.u64());
  std::string key;
  if (!r.key(&key, proto::kMaxKeyBytes) || !r.atEnd()) throw malformed(Op::kAdd, "bad key field");
  auto it = data_.find(key);
  int64_t result = 0;
  std::string error;
  if (!proto::applyAdd(key, it == data_.end() ? nullptr : it->second.get(), delta, &result,
                       &error)) {
    respond(c, Status::kError, std::vector<uint8_t>(error.begin(), error.end()));
    return;
  }
  std::string s = std::to_string(result);
  storedBytes_ -= it == data_.end() ? 0 : key.size() + it->second->size();
  storedBytes_ += key.size() + s.size();
  data_[key] = std::make_shared<const std::vector<uint8_t>>(s.begin(), s.end());
  std::vector<uint8_t> out;
  proto::Writer(&out).u64(static_cast<uint64_t>(result));
  respond(c, Status::kOk, out);
  notifyKey(key);
}

void TcpStoreServer::onCheck(Conn& c, proto::Reader& r) {
  std::vector<std::string> keys = readKeys(r, Op::kCheck);
  if (!r.atEnd()) throw malformed(Op::kCheck, "trailing bytes");
  std::vector<uint8_t> out;
  for (const auto& k : keys) out.push_back(data_.count(k) ? 1 : 0);
  respond(c, Status::kOk, out);
}

void TcpStoreServer::onMultiGet(Conn& c, proto::Reader& r) {
  uint64_t timeoutMs = r.u64();
  std::vector<std::string> keys = readKeys(r, Op::kMultiGet);
  if (!r.atEnd()) throw malformed(Op::kMultiGet, "trailing bytes");
  if (missingOf(keys).empty()) {
    respondValues(c, keys);
  } else {
    park(c, Op::kMultiGet, std::move(keys), timeoutMs);
  }
}

// All or nothing: the request is read whole, then either every key is set
// or (the store would be full) none is.
void TcpStoreServer::onMultiSet(Conn& c, proto::Reader& r) {
  const uint32_t count = r.u32();
  if (!r.ok() || count > proto::kMaxKeysPerRequest) throw malformed(Op::kMultiSet, "bad count");
  struct Item {
    std::string key;
    const uint8_t* value;
    size_t len;
  };
  std::vector<Item> items;
  items.reserve(count);
  size_t adding = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Item it;
    if (!r.key(&it.key, proto::kMaxKeyBytes)) {
      throw malformed(Op::kMultiSet, "key truncated or longer than 4 KiB");
    }
    it.len = r.u32();
    if (!r.ok() || it.len > r.left()) throw malformed(Op::kMultiSet, "value truncated");
    it.value = r.cursor();
    r.skip(it.len);
    adding += it.key.size() + it.len;
    items.push_back(std::move(it));
  }
  if (!r.atEnd()) throw malformed(Op::kMultiSet, "trailing bytes");
  if (storedBytes_ + adding > kMaxStoredBytes) {  // before what they replace: the bound holds
    const std::string msg = "store is full: a multi-set of " + std::to_string(count) + " keys (" +
                            std::to_string(adding) + " bytes) would exceed " +
                            std::to_string(kMaxStoredBytes) + " stored bytes";
    respond(c, Status::kError, std::vector<uint8_t>(msg.begin(), msg.end()));
    return;
  }
  for (const Item& it : items) {
    auto old = data_.find(it.key);
    if (old != data_.end()) storedBytes_ -= it.key.size() + old->second->size();
    storedBytes_ += it.key.size() + it.len;
    data_[it.key] = std::make_shared<const std::vector<uint8_t>>(it.value, it.value + it.len);
  }
  respond(c, Status::kOk, {});
  for (const Item& it : items) notifyKey(it.key);
}

// The values are copied into one answer, bounded in all (an error names
// the bound; the caller asks for fewer keys at once).
void TcpStoreServer::respondValues(Conn& c, const std::vector<std::string>& keys) {
  size_t total = 0;
  for (const auto& k : keys) total += data_.at(k)->size();
  if (total > proto::kMaxMultiGetBytes) {
    const std::string e = "multi-get of " + std::to_string(keys.size()) + " keys holding " +
                          std::to_string(total) + " bytes exceeds the limit of " +
                          std::to_string(proto::kMaxMultiGetBytes) + " bytes per request";
    respond(c, Status::kError, std::vector<uint8_t>(e.begin(), e.end()));
    return;
  }
  std::vector<uint8_t> out;
  out.reserve(4 + 4 * keys.size() + total);
  proto::Writer w(&out);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    const Value& v = data_.at(k);
    w.u32(static_cast<uint32_t>(v->size()));
    w.bytes(v->data(), v->size());
  }
  respond(c, Status::kOk, out);
}

std::vector<std::string> TcpStoreServer::missingOf(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (data_.count(k) == 0) missing.push_back(k);
  }
  return missing;
}

void TcpStoreServer::park(Conn& c, Op op, std::vector<std::string> keys, uint64_t timeoutMs) {
  c.parked = true;
  c.parkedOp = op;
  c.deadline = proto::deadlineAfterMs(timeoutMs);
  parkedByDeadline_.emplace(c.deadline.at(), c.id);
  touched_.push_back(c.id);
  for (const auto& k : missingOf(keys)) waiters_[k].push_back(c.id);
  c.waitKeys = std::move(keys);
}

void TcpStoreServer::unpark(Conn& c) {
  for (const auto& k : c.waitKeys) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), c.id), ids.end());
    if (ids.empty()) waiters_.erase(it);
  }
  parkedByDeadline_.erase({c.deadline.at(), c.id});
  touched_.push_back(c.id);
  c.parked = false;
  c.waitKeys.clear();
}

void TcpStoreServer::notifyKey(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (uint64_t id : ids) {
    auto ci = conns_.find(id);
    if (ci == conns_.end()) continue;
    Conn& c = ci->second;
    // A conn still missing other keys stays registered under those.
    if (c.dead || !c.parked || !missingOf(c.waitKeys).empty()) continue;
    Op op = c.parkedOp;
    std::vector<std::string> keys = c.waitKeys;
    unpark(c);
    if (op == Op::kGet) {
      respond(c, Status::kOk, {}, data_.at(keys.front()));
    } else if (op == Op::kMultiGet) {
      respondValues(c, keys);
    } else {
      respond(c, Status::kOk, {});
    }
  }
}

void TcpStoreServer::expireWaiters() {
  while (!parkedByDeadline_.empty() && parkedByDeadline_.begin()->first <= Deadline::Clock::now()) {
    uint64_t id = parkedByDeadline_.begin()->second;
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.dead || !it->second.parked) {
      parkedByDeadline_.erase(parkedByDeadline_.begin());  // defensive: never left behind
      continue;
    }
    Conn& c = it->second;
    std::vector<std::string> missing = missingOf(c.waitKeys);
    unpark(c);
    // The answer only needs to name the keys; keep it under the frame limit.
    size_t count = 0, bytes = 4;
    while (count < missing.size() && bytes + 4 + missing[count].size() <= proto::kMaxOtherBody) {
      bytes += 4 + missing[count++].size();
    }
    std::vector<uint8_t> body;
    proto::Writer w(&body);
    w.u32(static_cast<uint32_t>(count));
    for (size_t i = 0; i < count; ++i) w.key(missing[i]);
    respond(c, Status::kTimeout, body);
  }
}

void TcpStoreServer::respond(Conn& c, Status status, const std::vector<uint8_t>& body,
                             Value value) {
  resources::storeRequestServed();
  c.outHead.clear();
  size_t len = body.size() + (value ? value->size() : 0);
  proto::writeHeader(&c.outHead, proto::kResponseMagic, static_cast<uint8_t>(status),
                     static_cast<uint32_t>(len));
  c.outHead.insert(c.outHead.end(), body.begin(), body.end());
  c.outBody = std::move(value);
  c.outPos = 0;
  touched_.push_back(c.id);
  flush(c);
}

void TcpStoreServer::flush(Conn& c) {
  while (c.outPending()) {
    iovec iov[2];
    int n = 0;
    if (c.outPos < c.outHead.size()) {
      iov[n++] = iovec{c.outHead.data() + c.outPos, c.outHead.size() - c.outPos};
      if (c.outBody && !c.outBody->empty()) {
        iov[n++] = iovec{const_cast<uint8_t*>(c.outBody->data()), c.outBody->size()};
      }
    } else {
      size_t off = c.outPos - c.outHead.size();
      iov[n++] = iovec{const_cast<uint8_t*>(c.outBody->data()) + off, c.outBody->size() - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t sent = ::sendmsg(c.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;  // POLLOUT resumes
      close(c, "client went away: " + detail::errnoString(errno), false);
      return;
    }
    c.outPos += static_cast<size_t>(sent);
  }
  c.outHead.clear();
  c.outBody.reset();
  c.outPos = 0;
  touched_.push_back(c.id);
  // The client may have pipelined further requests behind this one.
  if (!c.in.empty()) runnable_.push_back(c.id);
}

void TcpStoreServer::close(Conn& c, const std::string& why, bool warn) {
  if (c.dead) return;
  if (warn) {
    GFLOW_LOG(WARN) << "store: closing connection from " << c.peer << ": " << why;
  } else {
    GFLOW_LOG(DEBUG) << "store: connection from " << c.peer << " ends: " << why;
  }
  if (c.parked) unpark(c);
  c.dead = true;
  dead_.push_back(c.id);
  c.outBody.reset();
  std::vector<uint8_t>().swap(c.in);
}

}  // namespace gflow::bootstrap
