// TcpStore: the client side, plus the server on rank 0 (tcp_store_server.h).
//
// Calls on one TcpStore may come from several threads, and a blocked get must
// not hold up a set from another thread of the same process, so each call
// borrows a connection from a pool (opening one when none is idle) and returns
// it once answered. Once the server has closed a connection the store is
// marked lost and every later call fails fast with kPeerLost.
#include <functional>
#include <mutex>

#include "bootstrap/store_protocol.h"
#include "bootstrap/tcp_store_server.h"
#include "common/auth.h"
#include "common/check.h"
#include "common/resource_counts.h"
#include "common/socket.h"
#include "gflow/store.h"

namespace gflow {
namespace {
namespace proto = bootstrap::proto;
using proto::Op;
using proto::Status;
const ErrorContext kStoreCtx = ErrorContext::forOp("store");
}  // namespace

struct TcpStore::Impl {
  TcpStoreOptions opts;
  std::string host;
  uint16_t port = 0;
  std::string where;  // "host:port" for messages
  std::unique_ptr<bootstrap::TcpStoreServer> server;
  std::mutex mu;
  std::vector<net::Socket> idle;  // connections not in use by a call
  bool lost = false;

  struct Reply {
    Status status;
    std::vector<uint8_t> body;
  };

  [[noreturn]] void throwLost(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      lost = true;
    }
    GFLOW_THROW(kPeerLost, kStoreCtx) << "store at " << where << " closed the connection (" << why
                                      << "); did the rank-0 process exit?";
  }

  net::Socket connect(Deadline deadline) {
    net::Socket s = net::connectTo(host, port, deadline, "the gflow store");
    try {
      auth::authenticate(s.fd(), opts.token, proto::kAuthLabel, /*initiator=*/true, deadline);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kPeerLost) throw;
      GFLOW_THROW(kPeerLost, kStoreCtx)
          << "store at " << where << " closed the connection during authentication (" << e.detail()
          << "); it may be at its connection limit or not be a gflow store";
    }
    return s;
  }

  net::Socket acquire(Deadline deadline) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (lost) {
        GFLOW_THROW(kPeerLost, kStoreCtx)
            << "store at " << where << " closed the connection earlier; it is gone";
      }
      if (!idle.empty()) {
        net::Socket s = std::move(idle.back());
        idle.pop_back();
        return s;
      }
    }
    return connect(deadline);
  }

  void release(net::Socket s) {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(std::move(s));
  }

  // One request/answer on a borrowed connection. `tail` (a set's value) is
  // sent after `body` without being copied into it.
  Reply call(Op op, const std::vector<uint8_t>& body, const std::vector<uint8_t>* tail,
             Deadline deadline) {
    resources::storeRequestMade();
    net::Socket s = acquire(deadline);
    std::vector<uint8_t> head;
    size_t len = body.size() + (tail ? tail->size() : 0);
    proto::writeHeader(&head, proto::kRequestMagic, static_cast<uint8_t>(op),
                       static_cast<uint32_t>(len));
    head.insert(head.end(), body.begin(), body.end());
    Reply reply;
    try {
      net::sendAll(s.fd(), head.data(), head.size(), deadline);
      if (tail && !tail->empty()) net::sendAll(s.fd(), tail->data(), tail->size(), deadline);
      uint8_t hb[proto::kHeaderSize];
      net::recvAll(s.fd(), hb, sizeof(hb), deadline);
      proto::Header h = proto::readHeader(hb);
      size_t limit = proto::kMaxValueBytes + proto::kMaxOtherBody;
      if (h.magic != proto::kResponseMagic || h.version != proto::kVersion ||
          h.code > static_cast<uint8_t>(Status::kError) || h.bodyLen > limit) {
        GFLOW_THROW(kInternal, kStoreCtx)
            << "store at " << where << " sent a malformed response header";
      }
      reply.status = static_cast<Status>(h.code);
      reply.body.resize(h.bodyLen);
      net::recvAll(s.fd(), reply.body.data(), reply.body.size(), deadline);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kPeerLost) throwLost(e.detail());
      throw;  // the connection is out of step: dropping `s` closes it
    }
    release(std::move(s));
    if (reply.status == Status::kError) {
      std::string msg(reply.body.begin(), reply.body.end());
      GFLOW_THROW(kInvalidArgument, kStoreCtx) << msg << " (store at " << where << ")";
    }
    return reply;
  }

  // A kMultiGet answer of `count` values, appended to *out.
  void parseValues(const std::vector<uint8_t>& body, size_t count,
                   std::vector<std::vector<uint8_t>>* out) {
    proto::Reader r(body.data(), body.size());
    const bool countOk = r.u32() == count;
    for (size_t i = 0; countOk && r.ok() && i < count; ++i) {
      const uint32_t len = r.u32();
      if (!r.ok() || len > r.left()) break;
      out->emplace_back(r.cursor(), r.cursor() + len);
      r.skip(len);
    }
    if (!countOk || !r.atEnd()) {
      GFLOW_THROW(kInternal, kStoreCtx)
          << "store at " << where << " sent a malformed answer to multi-get";
    }
  }

  std::vector<std::string> parseMissing(const std::vector<uint8_t>& body) {
    proto::Reader r(body.data(), body.size());
    uint32_t n = r.u32();
    std::vector<std::string> keys;
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      std::string k;
      if (r.key(&k, proto::kMaxKeyBytes)) keys.push_back(std::move(k));
    }
    return keys;
  }

  void batches(Op op, const char* what, const std::vector<std::string>& keys,
               std::chrono::milliseconds timeout,
               const std::function<void(Reply&, size_t)>& onReply);

  Deadline requestDeadline() const { return proto::deadlineAfterMs(proto::toWireMs(opts.timeout)); }
  // Blocking requests: the server answers at `timeout`; opts.timeout on top
  // covers the transfer and a slow server.
  Deadline blockingDeadline(std::chrono::milliseconds timeout) const {
    return proto::deadlineAfterMs(proto::toWireMs(timeout) + proto::toWireMs(opts.timeout));
  }
};

TcpStore::TcpStore(const TcpStoreOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opts = options;
  m.host = options.host;
  if (options.isServer) {
    m.server = std::make_unique<bootstrap::TcpStoreServer>(options.host, options.port,
                                                           options.token, options.timeout);
    m.port = m.server->port();
    // A wildcard bind address is not something to connect to.
    if (m.host.empty() || m.host == "0.0.0.0") m.host = "127.0.0.1";
    if (m.host == "::") m.host = "::1";
  } else {
    if (options.port == 0) {
      GFLOW_THROW(kInvalidArgument, kStoreCtx)
          << "TcpStore client needs the server's port (got 0 for host '" << options.host << "')";
    }
    m.port = options.port;
  }
  m.where = net::joinHostPort(m.host, m.port);
  // Connect now: the caller learns of a wrong token or an absent server here,
  // and a rank that starts before rank 0 waits here (connectTo retries).
  m.release(m.connect(m.requestDeadline()));
}

TcpStore::~TcpStore() {
  impl_->idle.clear();
  impl_->server.reset();
}

uint16_t TcpStore::port() const {
  return impl_->port;
}

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  if (key.size() > proto::kMaxKeyBytes || value.size() > proto::kMaxValueBytes) {
    GFLOW_THROW(kInvalidArgument, kStoreCtx)
        << "store set: key of " << key.size() << " bytes / value of " << value.size()
        << " bytes exceeds the TCP store's limits (" << proto::kMaxKeyBytes << " / "
        << proto::kMaxValueBytes << " bytes)";
  }
  std::vector<uint8_t> body;
  proto::Writer(&body).key(key);
  impl_->call(Op::kSet, body, &value, impl_->requestDeadline());
}

// In requests of at most kMaxOtherBody bytes each; a pair too large for one
// goes by itself as a set.
void TcpStore::multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::vector<uint8_t>>& values) {
  GFLOW_ENFORCE(keys.size() == values.size());
  for (const std::string& k : keys) {  // before any is set
    if (k.size() > proto::kMaxKeyBytes) {
      GFLOW_THROW(kInvalidArgument, kStoreCtx) << "store multi-set: key longer than 4 KiB";
    }
  }
  size_t i = 0;
  while (i < keys.size()) {
    std::vector<uint8_t> body;
    proto::Writer w(&body);
    w.u32(0);  // count, patched below
    uint32_t count = 0;
    for (; i < keys.size() && count < proto::kMaxKeysPerRequest; ++i, ++count) {
      const size_t item = 4 + keys[i].size() + 4 + values[i].size();
      if (body.size() + item > proto::kMaxOtherBody) break;
      w.key(keys[i]);
      w.u32(static_cast<uint32_t>(values[i].size()));
      body.insert(body.end(), values[i].begin(), values[i].end());
    }
    if (count == 0) {  // too large for a multi-set request
      set(keys[i], values[i]);
      ++i;
      continue;
    }
    for (int b = 0; b < 4; ++b) body[b] = static_cast<uint8_t>(count >> (8 * b));
    impl_->call(Op::kMultiSet, body, nullptr, impl_->requestDeadline());
  }
}

std::vector<uint8_t> TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  if (key.size() > proto::kMaxKeyBytes) {
    GFLOW_THROW(kInvalidArgument, kStoreCtx) << "store get: key longer than 4 KiB";
  }
  std::vector<uint8_t> body;
  proto::Writer w(&body);
  w.u64(proto::toWireMs(timeout));
  w.key(key);
  Impl::Reply reply = impl_->call(Op::kGet, body, nullptr, impl_->blockingDeadline(timeout));
  if (reply.status == Status::kTimeout) {
    GFLOW_THROW(kTimeout, kStoreCtx)
        << proto::describeTimeout("get", timeout, 1, {key}) << " (store at " << impl_->where << ")";
  }
  return std::move(reply.body);
}

namespace {

// A request body for the keys of `keys` from *next on that fit one request
// (a u64 timeout, a u32 count, the keys); *next moves past them.
std::vector<uint8_t> keysBody(const std::vector<std::string>& keys, size_t* next,
                              uint64_t timeoutMs, const char* what) {
  std::vector<uint8_t> body;
  proto::Writer w(&body);
  w.u64(timeoutMs);
  w.u32(0);  // count, patched below
  uint32_t count = 0;
  size_t& i = *next;
  while (i < keys.size() && count < proto::kMaxKeysPerRequest &&
         body.size() + 4 + keys[i].size() <= proto::kMaxOtherBody) {
    if (keys[i].size() > proto::kMaxKeyBytes) {
      GFLOW_THROW(kInvalidArgument, kStoreCtx) << "store " << what << ": key longer than 4 KiB";
    }
    w.key(keys[i++]);
    ++count;
  }
  for (int b = 0; b < 4; ++b) body[8 + b] = static_cast<uint8_t>(count >> (8 * b));
  return body;
}

}  // namespace

// Requests are capped in size, so a very long key list goes in batches of
// `op` that share the one deadline; each answer goes to `onReply` with the
// number of keys its request carried. A timeout names the keys missing.
void TcpStore::Impl::batches(Op op, const char* what, const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout,
                             const std::function<void(Reply&, size_t)>& onReply) {
  const Deadline deadline = proto::deadlineAfterMs(proto::toWireMs(timeout));
  for (size_t i = 0; i < keys.size();) {
    const size_t first = i;
    auto left = std::chrono::milliseconds(deadline.remainingMs());
    const uint64_t ms =
        proto::toWireMs(timeout) >= proto::kNeverMs ? proto::kNeverMs : proto::toWireMs(left);
    std::vector<uint8_t> body = keysBody(keys, &i, ms, what);
    Reply reply = call(op, body, nullptr, blockingDeadline(left));
    if (reply.status == Status::kTimeout) {
      std::vector<std::string> missing = parseMissing(reply.body);
      GFLOW_THROW(kTimeout, kStoreCtx)
          << proto::describeTimeout(what, timeout, keys.size(), missing) << " (store at " << where
          << ")";
    }
    onReply(reply, i - first);
  }
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  impl_->batches(Op::kWait, "wait", keys, timeout, [](Impl::Reply&, size_t) {});
}

std::vector<std::vector<uint8_t>> TcpStore::multiGet(const std::vector<std::string>& keys,
                                                     std::chrono::milliseconds timeout) {
  std::vector<std::vector<uint8_t>> values;
  values.reserve(keys.size());
  impl_->batches(Op::kMultiGet, "multi-get", keys, timeout,
                 [&](Impl::Reply& r, size_t count) { impl_->parseValues(r.body, count, &values); });
  return values;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  if (key.size() > proto::kMaxKeyBytes) {
    GFLOW_THROW(kInvalidArgument, kStoreCtx) << "store add: key longer than 4 KiB";
  }
  std::vector<uint8_t> body;
  proto::Writer w(&body);
  w.u64(static_cast<uint64_t>(delta));
  w.key(key);
  Impl::Reply reply = impl_->call(Op::kAdd, body, nullptr, impl_->requestDeadline());
  proto::Reader r(reply.body.data(), reply.body.size());
  auto result = static_cast<int64_t>(r.u64());
  if (!r.atEnd()) {
    GFLOW_THROW(kInternal, kStoreCtx)
        << "store at " << impl_->where << " sent a malformed answer to add";
  }
  return result;
}

}  // namespace gflow
