#include "transport/tcp/tcp_context.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
#include "transport/liveness.h"

namespace gflow::transport::tcp {
namespace {

// Unsent bytes a socket of a peer with several may hold in the kernel
// (TCP_NOTSENT_LOWAT; epoll reports it writable below half of this), at
// first and at most (tuneNotsent).
constexpr int kNotsentLowat = 64 << 10;
constexpr int kMaxNotsentLowat = 4 << 20;
// Units a fast socket may take as one frame.
constexpr uint64_t kMaxBatch = 16;

}  // namespace

TcpContext::TcpContext(const ContextOptions& options) : Engine(options) {
  stripeMin_ = std::max<uint64_t>(
      (options.tcp.stripeMinBytes ? *options.tcp.stripeMinBytes : params::stripeMin()), 4096);
  stripeChunk_ = params::stripeChunk() ? std::max<uint64_t>(params::stripeChunk(), 4096) : 0;
  spinUs_ = spinMicros(options.size);
  socketsPerPeer_ = options.tcp.socketsPerPeer ? *options.tcp.socketsPerPeer
                                               : static_cast<int>(params::socketsPerPeer());
  if (socketsPerPeer_ < 1 || socketsPerPeer_ > 64) {
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("init").withRank(rank()))
        << "GFLOW_SOCKETS_PER_PEER=" << socketsPerPeer_ << " must be between 1 and 64";
  }

  int ep = epoll_create1(EPOLL_CLOEXEC);
  GFLOW_SYSCHECK(ep, "epoll_create1");
  epoll_ = net::Socket(ep);
  int ev = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  GFLOW_SYSCHECK(ev, "eventfd");
  wakeFd_ = net::Socket(ev);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.ptr = nullptr;
  GFLOW_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, wakeFd_.fd(), &e), "epoll_ctl(eventfd)");

  peers_.resize(size());
  for (auto& p : peers_) p = std::make_unique<PeerState>();
  connectAll(options);
}

TcpContext::~TcpContext() = default;

void TcpContext::addConnection(int peer, int index, net::Socket sock) {
  auto c = std::make_unique<Conn>();
  c->peer = peer;
  c->index = index;
  net::setNonBlocking(sock.fd(), true);
  net::setNoDelay(sock.fd());
  if (socketsPerPeer_ > 1 && stripeChunk_ > 0) {
    // Assignment by progress reads "send queue empty" as "this socket has
    // sent what it took": keep the kernel's unsent backlog short, or a slow
    // socket would swallow a whole send buffer's worth and finish last.
    int lowat = kNotsentLowat;
    if (setsockopt(sock.fd(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat)) == 0) {
      c->notsentLowat = lowat;
    } else {
      GFLOW_LOG(DEBUG) << "TCP_NOTSENT_LOWAT: " << std::strerror(errno);
    }
  }
  c->sock = std::move(sock);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.ptr = c.get();
  GFLOW_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, c->sock.fd(), &e), "epoll_ctl(add)");
  PeerState& p = *peers_[peer];
  if (p.conns.size() <= static_cast<size_t>(index)) p.conns.resize(index + 1);
  p.conns[index] = std::move(c);
}

void TcpContext::wake() {
  uint64_t one = 1;
  ssize_t rc = ::write(wakeFd_.fd(), &one, sizeof(one));
  (void)rc;
}

void TcpContext::failWire(const Error& first) {
  clearMessages();
  for (auto& p : peers_) {
    for (auto& u : p->pending) u.msg->req->fail(first);
    p->pending.clear();
    p->pendingBytes = 0;
    for (auto& c : p->conns) {
      if (!c) continue;
      for (auto& item : c->sendq) {
        if (item.msg) item.msg->req->fail(first);
      }
      // Keep a partially written frame so notifyPeers can finish it.
      while (c->sendq.size() > 1 || (c->sendq.size() == 1 && c->sendq.front().written == 0)) {
        c->sendq.pop_back();
      }
      c->cur = nullptr;
    }
  }
}

void TcpContext::enqueue(Conn& c, SendItem item) {
  bool wasEmpty = c.sendq.empty();
  c.sendq.push_back(std::move(item));
  if (wasEmpty) flush(c);
}

namespace {

// A message's share of `nconn` sockets, rounded up to 4 KiB so that stripe
// boundaries stay page-aligned relative to the message start.
uint64_t evenShare(uint64_t bytes, size_t nconn) {
  return (bytes / nconn + 4095) & ~uint64_t(4095);
}

}  // namespace

RequestPtr TcpContext::isend(int peer, const void* data, size_t bytes, Tag tag,
                             const Envelope& env) {
  checkFailed();
  GFLOW_ENFORCE(peer >= 0 && peer < size() && peer != rank());
  auto req = std::make_shared<Request>(peer, true, bytes);
  PeerState& p = *peers_[peer];
  if (p.closed) failLost(peer, "has closed its connections");
  auto msg = std::make_shared<SendMsg>();
  msg->req = req;
  const FrameHeader hdr{kFrameMagic, kFrameData, 0,
                        tag.group,   tag.index,  bytes,
                        0,           bytes,      {env.words[0], env.words[1], env.words[2]}};
  countSendPosted(peer);
  if (p.conns.size() > 1 && stripeChunk_ > 0) {
    queueByProgress(p, msg, hdr, static_cast<const char*>(data));
  } else {
    splitEvenly(p, msg, hdr, static_cast<const char*>(data));
  }
  return req;
}

// One fragment per socket, queued at once (one socket per peer: the whole
// message on it, one frame).
void TcpContext::splitEvenly(PeerState& p, const std::shared_ptr<SendMsg>& msg,
                             const FrameHeader& hdr, const char* base) {
  const uint64_t bytes = hdr.msgLen;
  const int nconn = static_cast<int>(p.conns.size());
  int frags = (bytes >= stripeMin_ && nconn > 1) ? nconn : 1;
  uint64_t per = evenShare(bytes, frags);
  // Rounding up can leave nothing for the last connections: use fewer.
  if (per > 0) frags = static_cast<int>(std::min<uint64_t>(frags, (bytes + per - 1) / per));
  msg->fragmentsLeft = frags;
  size_t first = p.nextConn;
  p.nextConn = (p.nextConn + 1) % nconn;
  for (int f = 0; f < frags; ++f) {
    uint64_t off = std::min<uint64_t>(bytes, per * f);
    SendItem item;
    item.msg = msg;
    item.hdr = hdr;
    item.hdr.offset = off;
    item.hdr.fragLen = (f == frags - 1) ? bytes - off : std::min<uint64_t>(per, bytes - off);
    item.payload = base + off;
    item.payloadLen = item.hdr.fragLen;
    enqueue(*p.conns[(first + f) % nconn], std::move(item));
  }
}

// Assignment by progress (several sockets): the message joins the peer's
// pending list in units, and a socket takes the next unit while the kernel
// accepts its writes, and once refused, only after EPOLLOUT (flush). Chosen over splitting each
// message by estimated per-socket rates: the pull needs no rate estimate to be right, follows a
// rate that changes at once, and at equal rates gives equal shares; measured in
// docs/performance.md, "TCP: adaptive striping".
void TcpContext::queueByProgress(PeerState& p, const std::shared_ptr<SendMsg>& msg,
                                 const FrameHeader& hdr, const char* base) {
  const uint64_t bytes = hdr.msgLen;
  const size_t nconn = p.conns.size();
  // Below GFLOW_STRIPE_MIN a message is one unit (on whichever socket is
  // free first); from there on, pieces of GFLOW_STRIPE_CHUNK, at most an
  // even share each so a message just above the minimum still spreads.
  uint64_t unit = bytes;
  if (bytes >= stripeMin_) unit = std::min(stripeChunk_, evenShare(bytes, nconn));
  unit = std::max<uint64_t>(unit, 1);
  msg->fragmentsLeft = bytes == 0 ? 1 : (bytes + unit - 1) / unit;
  const uint64_t share = bytes >= stripeMin_ ? evenShare(bytes, nconn) : bytes;
  p.pending.push_back(Pending{msg, hdr, base, 0, bytes, unit, share});
  p.pendingBytes += bytes;
  // Sockets that are idle and known writable take a unit each now, the
  // fastest first; the others take theirs when epoll reports them writable.
  for (size_t k = 0; k < nconn && !p.pending.empty(); ++k) {
    Conn* best = nullptr;
    for (auto& c : p.conns) {
      if (!c || c->closed || !c->sendq.empty() || !c->ready || !worthTaking(*c)) continue;
      if (!best || faster(*c, *best)) best = c.get();
    }
    if (!best) break;
    flush(*best);
  }
}

// Measured faster; a socket not measured yet is not preferred. (An idle
// socket that gets a unit it sends more slowly only delays that unit.)
bool TcpContext::faster(const Conn& a, const Conn& b) {
  return a.rate > b.rate;
}

// Whether c should take the next pending unit: not when a socket of the
// peer at least twice as fast, busy now, would send everything pending, this unit included,
// before c alone could send this unit (the tail of a burst goes to the fast
// socket, which would otherwise wait for the slow one to deliver it). Every
// socket that declines leaves one that will come back: the last busy one
// defers to nobody.
bool TcpContext::worthTaking(const Conn& c) const {
  const PeerState& p = *peers_[c.peer];
  if (c.rate == 0 || p.pending.empty()) return true;
  const Pending& u = p.pending.front();
  const double unit = static_cast<double>(std::min(u.unit, u.end - u.next));
  const double mine = unit / c.rate;
  for (const auto& o : p.conns) {
    // Only a socket waiting for EPOLLOUT is sure to come back for the rest;
    // deferring to an idle one could leave the units with nobody.
    // Rates are estimates: defer only to one at least twice as fast.
    if (!o || o.get() == &c || o->closed || !o->wantOut || o->rate < 2 * c.rate) continue;
    double backlog = 0;  // what o still has to send before it could start
    for (const SendItem& it : o->sendq) backlog += sizeof(FrameHeader) + it.payloadLen - it.written;
    if (!o->ready) backlog += o->notsentLowat;
    if ((backlog + static_cast<double>(p.pendingBytes)) / o->rate < mine) return false;
  }
  return true;
}

// Moves the next unit(s) of c's peer onto c's send queue, as one frame.
void TcpContext::refill(Conn& c) {
  PeerState& p = *peers_[c.peer];
  if (p.pending.empty()) return;
  Pending& u = p.pending.front();
  SendItem item;
  item.msg = u.msg;
  item.hdr = u.hdr;
  item.hdr.offset = u.next;
  // A fast socket takes about what it sends while its waiter wakes up
  // (its TCP_NOTSENT_LOWAT) at once, as one frame: fewer frames and system
  // calls on both sides. A slow one takes a single unit. One the kernel
  // has never refused is not slow: it takes up to an even share, so equal
  // flows cut a message as the equal split did.
  const uint64_t batch =
      c.rate == 0 ? kMaxBatch : std::clamp<uint64_t>(c.notsentLowat / u.unit, 1, kMaxBatch);
  const uint64_t take = std::max(u.unit, std::min(u.unit * batch, u.share / u.unit * u.unit));
  item.hdr.fragLen = std::min(take, u.end - u.next);
  item.payload = u.base + u.next;
  item.payloadLen = item.hdr.fragLen;
  item.units = item.hdr.fragLen == 0 ? 1 : (item.hdr.fragLen + u.unit - 1) / u.unit;
  u.next += item.hdr.fragLen;
  p.pendingBytes -= item.hdr.fragLen;
  if (u.next >= u.end) p.pending.pop_front();
  c.sendq.push_back(std::move(item));
}

RequestPtr TcpContext::irecv(int peer, void* data, size_t bytes, Tag tag, const Envelope& env) {
  checkFailed();
  GFLOW_ENFORCE(peer >= 0 && peer < size() && peer != rank());
  auto req = std::make_shared<Request>(peer, false, bytes);
  PeerState& p = *peers_[peer];
  if (!find(peer, tag) && p.closed) failLost(peer, "has closed its connections");
  auto* m = static_cast<RecvMsg*>(postRecv(peer, tag, env, data, bytes, req));
  if (!m->staging) {  // nothing arrived yet: fragments land in place
    m->buf = static_cast<char*>(data);
    resumePaused(p);  // a paused connection may hold this message's header
    return req;
  }
  if (m->received == m->len && m->claimed == m->len) completeRecv(peer, m);
  return req;
}

void TcpContext::completeRecv(int peer, RecvMsg* m) {
  complete(peer, m);
  resumePaused(*peers_[peer]);
}

void TcpContext::resumePaused(PeerState& p) {
  for (auto& c : p.conns) {
    if (c && c->paused) {
      c->paused = false;
      startFragment(*c);  // may pause again
      if (!c->paused) {
        updateInterest(*c);
        handleReadable(*c);
      }
    }
  }
}

bool TcpContext::hasPendingWith(int peer) const {
  if (hasPostedRecv(peer) || !peers_[peer]->pending.empty()) return true;
  for (const auto& c : peers_[peer]->conns) {
    if (c && !c->sendq.empty()) return true;
  }
  return false;
}

void TcpContext::failLost(int peer, const std::string& what) {
  fail(Error(ErrorCode::kPeerLost,
             "rank " + std::to_string(peer) + " " + what + " (its process exited or was killed?)",
             ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
}

// EOF from a peer is normal when it has finished its last op and shut down;
// it is an error only while this rank still exchanges data with it.
void TcpContext::handleClosed(Conn& c) {
  if (c.inPayload || c.hdrGot > 0) failLost(c.peer, "closed the connection mid-message");
  c.closed = true;
  epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, c.sock.fd(), nullptr);
  c.watched = false;
  // With several connections per peer, the others may still carry data the
  // peer sent before exiting: the peer is gone only once all of them are.
  PeerState& p = *peers_[c.peer];
  for (const auto& other : p.conns) {
    if (other && !other->closed) return;
  }
  p.closed = true;
  if (hasPendingWith(c.peer)) failLost(c.peer, "closed the connection");
}

void TcpContext::updateInterest(Conn& c) {
  epoll_event e{};
  e.events = (c.paused ? 0u : static_cast<uint32_t>(EPOLLIN)) | (c.wantOut ? EPOLLOUT : 0u);
  e.data.ptr = &c;
  if (c.closed) return;
  if (!c.watched) {
    if (c.paused && !c.wantOut) return;  // nothing to wait for yet
    GFLOW_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, c.sock.fd(), &e), "epoll_ctl(add)");
    c.watched = true;
    return;
  }
  GFLOW_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, c.sock.fd(), &e), "epoll_ctl(mod)");
}

// Writes queued frames, several per sendmsg, until the kernel takes no more.
// With several sockets per peer, a socket whose queue is empty takes the
// next unit of its peer's pending list while the kernel keeps accepting
// (`ready`), and once the kernel refuses, waits for EPOLLOUT before it takes
// more: TCP_NOTSENT_LOWAT makes the kernel refuse once a little is unsent,
// so a slow socket never holds units that a faster one could send now.
// While a socket stays backlogged, the bytes it writes after each wait over
// the time since the previous wait are a sample of its rate (EWMA), which
// decides only who takes the tail of a burst (worthTaking) and which idle
// socket goes first. `writable`: called for an EPOLLOUT event.
void TcpContext::flush(Conn& c, bool writable) {
  constexpr size_t kGather = 4;  // frames per sendmsg
  const size_t hdrLen = sizeof(FrameHeader);
  const PeerState& p = *peers_[c.peer];
  if (writable) c.ready = true;
  size_t burst = 0;
  bool blocked = false;
  for (;;) {
    if (c.sendq.empty() && c.ready && !p.pending.empty() && worthTaking(c)) refill(c);
    if (c.sendq.empty()) break;
    iovec iov[2 * kGather];
    int n = 0;
    size_t want = 0;
    for (size_t i = 0; i < c.sendq.size() && i < kGather; ++i) {
      SendItem& it = c.sendq[i];
      if (it.written < hdrLen) {
        iov[n++] = {reinterpret_cast<char*>(&it.hdr) + it.written, hdrLen - it.written};
        if (it.payloadLen > 0) iov[n++] = {const_cast<char*>(it.payload), it.payloadLen};
      } else {
        size_t done = it.written - hdrLen;
        iov[n++] = {const_cast<char*>(it.payload) + done, it.payloadLen - done};
      }
      want += hdrLen + it.payloadLen - it.written;
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = n;
    ssize_t w = ::sendmsg(c.sock.fd(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        blocked = true;
        break;
      }
      int err = errno;
      // A peer that failed usually sent an error report before closing:
      // read it first so the report, not the broken pipe, is what we raise.
      if (!c.closed && !c.paused) handleReadable(c);
      failLost(c.peer, std::string("is unreachable while sending: ") + std::strerror(err));
    }
    advance(c, static_cast<size_t>(w));
    burst += static_cast<size_t>(w);
    if (static_cast<size_t>(w) < want) {
      blocked = true;
      break;
    }
  }
  if (p.conns.size() > 1) noteProgress(c, blocked, burst, writable);
  bool want = !c.sendq.empty() || !c.ready;
  if (want != c.wantOut) {
    c.wantOut = want;
    updateInterest(c);
  }
}

// Several sockets per peer: a socket the kernel refused is not ready until
// EPOLLOUT. When an EPOLLOUT flush is refused and the socket was refused
// before too, it has been backlogged since, and what it wrote now is what
// drained then: one rate sample. (Other flushes, such as the one after
// reading, would time a few freed bytes over microseconds: no sample.)
void TcpContext::noteProgress(Conn& c, bool blocked, size_t burst, bool writable) {
  using Clock = std::chrono::steady_clock;
  if (!blocked) {
    c.blockedAt = Clock::time_point{};
    return;
  }
  c.ready = false;
  const bool backlogged = c.blockedAt != Clock::time_point{};
  if (backlogged && !writable) return;
  const Clock::time_point now = Clock::now();
  if (backlogged && burst > 0) {
    const double dt = std::chrono::duration<double>(now - c.blockedAt).count();
    if (dt > 0) {
      const double sample = static_cast<double>(burst) / dt;
      c.rate = c.rate == 0 ? sample : 0.75 * c.rate + 0.25 * sample;
      tuneNotsent(c);
    }
  }
  c.blockedAt = now;
}

// TCP_NOTSENT_LOWAT of a socket: 64 KiB, or for a socket measured faster
// than kFastRate about 1 ms at its rate (a power of two up to 4 MiB). A slow
// socket keeps little unsent, so it takes units only as fast as it sends
// them; a fast one gets a backlog that lasts while the waiter wakes up, and
// writes megabytes per system call. The threshold keeps a noisy estimate of
// a slow socket from ever raising its backlog.
void TcpContext::tuneNotsent(Conn& c) {
  constexpr double kFastRate = 256e6;  // bytes/s
  int want = kNotsentLowat;
  while (c.rate >= kFastRate && want < kMaxNotsentLowat && want < c.rate * 1e-3) want *= 2;
  if (want == c.notsentLowat) return;
  if (setsockopt(c.sock.fd(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &want, sizeof(want)) == 0) {
    c.notsentLowat = want;
  }
}

// Accounts `written` more bytes of c's queue: finished frames leave it, and
// a message whose last fragment went is complete.
void TcpContext::advance(Conn& c, size_t written) {
  while (!c.sendq.empty()) {
    SendItem& it = c.sendq.front();
    const size_t total = sizeof(FrameHeader) + it.payloadLen;
    const size_t take = std::min(total - it.written, written);
    it.written += take;
    written -= take;
    if (it.written < total) return;
    std::shared_ptr<SendMsg> msg = std::move(it.msg);
    if (it.hdr.type == kFramePong) c.pongQueued = false;
    if (it.hdr.type == kFrameData) {
      c.sent.payloadBytes += it.payloadLen;
      ++c.sent.frames;
    }
    c.sendq.pop_front();
    if (msg && (msg->fragmentsLeft -= it.units) == 0) {
      countSendDone(c.peer, msg->req->bytes());
      msg->req->complete();
    }
  }
}

TcpContext::ConnCounters TcpContext::connCounters(int peer, int index) const {
  return peers_.at(peer)->conns.at(index)->sent;
}

void TcpContext::setSendBufferForTesting(int peer, int index, int bytes) {
  const int fd = peers_.at(peer)->conns.at(index)->sock.fd();
  GFLOW_SYSCHECK(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)), "SO_SNDBUF");
}

bool TcpContext::readHeader(Conn& c) {
  while (c.hdrGot < sizeof(FrameHeader)) {
    ssize_t r = ::recv(c.sock.fd(), reinterpret_cast<char*>(&c.hdr) + c.hdrGot,
                       sizeof(FrameHeader) - c.hdrGot, MSG_DONTWAIT);
    if (r > 0) {
      c.hdrGot += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      handleClosed(c);
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    if (errno == EINTR) continue;
    int err = errno;
    failLost(c.peer, std::string("reset the connection: ") + std::strerror(err));
  }
  return true;
}

// Called with a complete header in c.hdr: validates it and decides where the
// payload goes. May pause the connection (unexpected-data budget exhausted).
void TcpContext::startFragment(Conn& c) {
  const FrameHeader& h = c.hdr;
  const ErrorContext ectx = ErrorContext().withSeq(group()).withRank(rank()).withPeer(c.peer);
  auto protocolError = [&](const std::string& what) {
    GFLOW_LOG(WARN) << "rank " << rank() << ": invalid frame from rank " << c.peer << ": " << what;
    fail(Error(ErrorCode::kInternal,
               "invalid frame from rank " + std::to_string(c.peer) + ": " + what, ectx));
  };
  if (h.magic != kFrameMagic) protocolError("bad magic");
  if (h.type == kFrameError) {
    if (h.fragLen > kMaxErrorPayload) protocolError("oversized error report");
    c.ctrl.assign(h.fragLen, 0);
    c.cur = nullptr;
    c.dst = c.ctrl.data();
    c.left = h.fragLen;
    c.inPayload = true;
    return;
  }
  if (h.type == kFramePing || h.type == kFramePong) {
    if (h.fragLen != 0) protocolError("control frame with a payload");
    c.cur = nullptr;
    c.dst = nullptr;
    c.left = 0;
    c.inPayload = true;
    return;
  }
  if (h.type != kFrameData) protocolError("unknown frame type " + std::to_string(h.type));
  if (h.msgLen > kMaxMessageBytes || h.fragLen > h.msgLen || h.offset > h.msgLen - h.fragLen) {
    protocolError("fragment [" + std::to_string(h.offset) + ", +" + std::to_string(h.fragLen) +
                  ") outside a message of " + std::to_string(h.msgLen) + " bytes");
  }
  Envelope env;
  std::memcpy(env.words, h.env, sizeof(env.words));
  checkEnvelope(c.peer, h.group, env);
  const Tag tag{h.group, h.index};
  auto* m = findAs<RecvMsg>(c.peer, tag);
  if (!m) {
    checkStale(c.peer, h.group, env);
    if (!stagingFits(c.peer, h.msgLen)) {
      // Back-pressure: leave the payload in the socket until a receive is
      // posted (or staged data drains).
      GFLOW_LOG(DEBUG) << "rank " << rank() << ": pausing reads from rank " << c.peer << " ("
                       << stagedBytes(c.peer) << " bytes staged, next message " << h.msgLen
                       << " bytes, GFLOW_UNEXPECTED_LIMIT " << unexpectedLimit() << ")";
      c.paused = true;
      updateInterest(c);
      return;
    }
    m = static_cast<RecvMsg*>(stage(c.peer, tag, env, h.msgLen));
    m->buf = m->staging.get();
  } else {
    checkArrival(c.peer, *m, env, h.msgLen);
  }
  if (h.fragLen > m->len - m->claimed) protocolError("fragments exceed the message length");
  m->claimed += h.fragLen;
  c.cur = m;
  c.dst = m->buf + h.offset;
  c.left = h.fragLen;
  c.inPayload = true;
}

void TcpContext::finishFragment(Conn& c) {
  c.hdrGot = 0;
  c.inPayload = false;
  c.dst = nullptr;
  if (c.hdr.type == kFrameError) {
    handleErrorFrame(c);
    return;
  }
  if (c.hdr.type == kFramePing) {
    // One answer in flight is enough: a peer that floods PINGs without
    // reading cannot grow the send queue.
    if (!c.pongQueued) {
      c.pongQueued = true;
      sendControl(c, kFramePong);
    }
    return;
  }
  if (c.hdr.type == kFramePong) {
    countPong(c.peer);
    return;
  }
  RecvMsg* m = c.cur;
  c.cur = nullptr;
  m->received += c.hdr.fragLen;
  if (m->received == m->len && m->claimed == m->len && m->req) {
    completeRecv(c.peer, m);
  }
}

void TcpContext::handleErrorFrame(Conn& c) {
  // Payload: code (1 byte), then a human-readable description.
  const std::vector<char>& b = c.ctrl;
  peerReported(c.hdr.group, peerReport(rank(), group(), c.peer, b.data(), b.size()));
}

void TcpContext::sendControl(Conn& c, uint16_t type) {
  SendItem item;
  item.msg = nullptr;
  item.hdr = FrameHeader{kFrameMagic, type, 0, group(), 0, 0, 0, 0, {0, 0, 0}};
  enqueue(c, std::move(item));
}

// While a large fragment is arriving, ask the kernel to report the socket
// readable only once a good part of it is there: each wake-up of a sleeping
// waiter costs tens of microseconds, more than copying 64 KiB. Back to 1 byte
// between frames so a small message is never held back.
void TcpContext::tuneLowat(Conn& c) {
  constexpr uint64_t kMinLowat = 64 << 10, kMaxLowat = 512 << 10;
  int want = 1;
  if (c.inPayload && c.left >= kMinLowat) want = static_cast<int>(std::min(c.left, kMaxLowat));
  if (want == c.lowat) return;
  if (setsockopt(c.sock.fd(), SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) c.lowat = want;
}

void TcpContext::handleReadable(Conn& c) {
  // Bounded so one busy socket cannot starve the others.
  for (int rounds = 0; rounds < 64 && !c.paused && !c.closed; ++rounds) {
    if (!c.inPayload) {
      if (!readHeader(c)) {
        tuneLowat(c);
        return;
      }
      startFragment(c);
      if (c.paused) return;
    }
    while (c.left > 0) {
      ssize_t r = ::recv(c.sock.fd(), c.dst, c.left, MSG_DONTWAIT);
      if (r > 0) {
        c.dst += r;
        c.left -= static_cast<uint64_t>(r);
        continue;
      }
      if (r == 0) failLost(c.peer, "closed the connection mid-message");
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        tuneLowat(c);
        return;
      }
      if (errno == EINTR) continue;
      int err = errno;
      failLost(c.peer, std::string("reset the connection: ") + std::strerror(err));
    }
    finishFragment(c);
  }
  if (!c.closed) tuneLowat(c);
}

void TcpContext::progress(int timeoutMs) {
  epoll_event events[64];
  int n = epoll_wait(epoll_.fd(), events, 64, timeoutMs);
  if (n < 0) {
    if (errno == EINTR) return;
    GFLOW_SYSCHECK(n, "epoll_wait");
  }
  for (int i = 0; i < n; ++i) {
    if (events[i].data.ptr == nullptr) {
      uint64_t v;
      ssize_t rc = ::read(wakeFd_.fd(), &v, sizeof(v));
      (void)rc;
      checkFailed();
      continue;
    }
    Conn& c = *static_cast<Conn*>(events[i].data.ptr);
    uint32_t ev = events[i].events;
    if (ev & EPOLLOUT) flush(c, /*writable=*/true);
    if (c.closed) continue;
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      if (!c.paused) handleReadable(c);
      if ((ev & EPOLLERR) && !c.closed) failLost(c.peer, "reset the connection");
      if ((ev & EPOLLHUP) && !c.closed && c.paused && c.watched) {
        // The peer hung up but its data is still queued here, behind a
        // paused message: stop watching (a hung-up socket would wake epoll
        // forever) until a receive resumes it.
        epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, c.sock.fd(), nullptr);
        c.watched = false;
      }
    }
    if ((ev & EPOLLOUT) && !c.closed) flush(c);
  }
}

void TcpContext::waitUntilDone(const RequestPtr& req, Deadline deadline) {
  auto spinUntil = Deadline::Clock::now() + std::chrono::microseconds(spinUs_);
  LivenessProbe probe(timeout());
  while (!req->done()) {
    progress(Deadline::Clock::now() < spinUntil ? 0 : probe.sleepMs(deadline, 1000));
    checkFailed();
    if (req->done()) break;
    switch (probe.step(deadline, pongs(req->peer()))) {
      case LivenessProbe::Step::kPing:
        for (auto& c : peers_[req->peer()]->conns) {
          if (c && !c->closed) {
            sendControl(*c, kFramePing);
            break;
          }
        }
        break;
      case LivenessProbe::Step::kTimeout: failTimeout(req, probe.peerAlive(), "");
      case LivenessProbe::Step::kWait: break;
    }
  }
}

void TcpContext::notifyPeers(const Error& error) {
  std::string text = error.what();
  if (text.size() > kMaxErrorPayload - 1) text.resize(kMaxErrorPayload - 1);
  std::vector<char> payload(1 + text.size());
  payload[0] = static_cast<char>(error.code());
  std::memcpy(payload.data() + 1, text.data(), text.size());
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    peers_[peer]->pending.clear();  // units no socket took are never sent
    peers_[peer]->pendingBytes = 0;
    for (auto& cp : peers_[peer]->conns) {
      if (!cp) continue;
      Conn& c = *cp;
      try {
        Deadline d = Deadline::after(std::chrono::milliseconds(300));
        // Finish a partially written frame so the stream stays parseable.
        if (!c.sendq.empty()) {
          SendItem& it = c.sendq.front();
          size_t total = sizeof(FrameHeader) + it.payloadLen;
          if (it.written < sizeof(FrameHeader)) {
            net::sendAll(c.sock.fd(), reinterpret_cast<char*>(&it.hdr) + it.written,
                         sizeof(FrameHeader) - it.written, d);
            it.written = sizeof(FrameHeader);
          }
          if (it.written < total) {
            size_t done = it.written - sizeof(FrameHeader);
            net::sendAll(c.sock.fd(), it.payload + done, it.payloadLen - done, d);
          }
          c.sendq.clear();
        }
        FrameHeader h{kFrameMagic, kFrameError,    0,        group(), 0, payload.size(),
                      0,           payload.size(), {0, 0, 0}};
        net::sendAll(c.sock.fd(), &h, sizeof(h), d);
        net::sendAll(c.sock.fd(), payload.data(), payload.size(), d);
        break;  // one connection per peer is enough
      } catch (const Error&) {
        // Peer gone or not reading: try its next connection, else give up.
      }
    }
  }
}

}  // namespace gflow::transport::tcp
