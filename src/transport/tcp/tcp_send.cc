// The send side of the TCP wire (tcp_context.h): queueing frames, the
// assignment of a peer's bytes to its sockets by progress (several sockets
// per peer), and writing them out several frames per sendmsg.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "transport/tcp/tcp_context.h"

namespace gflow::transport::tcp {

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
  const FrameHeader hdr = stamped(FrameHeader{kFrameMagic,
                                              kFrameData,
                                              0,
                                              tag.group,
                                              tag.index,
                                              bytes,
                                              0,
                                              bytes,
                                              {env.words[0], env.words[1], env.words[2]},
                                              {}});
  countSendPosted(peer);
  if (!holdSend(peer, req, hdr, static_cast<const char*>(data))) {
    queueData(p, req, hdr, static_cast<const char*>(data));
  }
  return req;
}

// The message's DATA frames, queued (now, or on its CLEAR).
void TcpContext::queueData(PeerState& p, const RequestPtr& req, const FrameHeader& hdr,
                           const char* data) {
  auto msg = std::make_shared<SendMsg>();
  msg->req = req;
  if (p.conns.size() > 1 && stripeChunk_ > 0) {
    queueByProgress(p, msg, hdr, data);
  } else {
    splitEvenly(p, msg, hdr, data);
  }
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
  ArrivalStamp now;  // one stamp per call, made on first use (Engine::restamp)
  for (;;) {
    if (c.sendq.empty() && c.ready && !p.pending.empty() && worthTaking(c)) refill(c);
    if (c.sendq.empty()) break;
    iovec iov[2 * kGather];
    int n = 0;
    size_t want = 0;
    for (size_t i = 0; i < c.sendq.size() && i < kGather; ++i) {
      SendItem& it = c.sendq[i];
      // Stamped as it leaves (a held message may have waited since its post).
      if (it.written == 0 && it.hdr.stamp[0] != 0) restamp(it.hdr.group, it.hdr.stamp, now);
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
    const ssize_t w = c.stream ? static_cast<ssize_t>(writeStream(c, iov, n))
                               : ::sendmsg(c.sock.fd(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w == 0 && c.stream) {  // full: pollStreams flushes again once there is room
      blocked = true;
      break;
    }
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        blocked = true;
        break;
      }
      if (c.doorbellOnly) return dropSocket(c);  // its stream decides
      int err = errno;
      // A peer that failed usually sent an error report before closing:
      // read it first so the report, not the broken pipe, is what we raise
      // (not while this connection's own header is being handled: a send
      // from inside startFragment would handle it twice).
      const bool midHeader = c.hdrGot == sizeof(FrameHeader) && !c.inPayload;
      if (!c.closed && !c.paused && !midHeader) handleReadable(c);
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
    const uint64_t units = it.units;  // `it` goes with pop_front
    if (it.hdr.type == kFramePong) c.pongQueued = false;
    if (it.hdr.type == kFrameData) {
      c.sent.payloadBytes += it.payloadLen;
      ++c.sent.frames;
    }
    c.sendq.pop_front();
    if (msg && (msg->fragmentsLeft -= units) == 0) {
      countSendDone(c.peer, msg->req->bytes());
      msg->req->complete();
    }
  }
}

TcpContext::ConnCounters TcpContext::connCounters(int peer, int index) const {
  return peers_.at(peer)->conns.at(index)->sent;
}

int TcpContext::socketForTesting(int peer, int index) const {
  return peers_.at(peer)->conns.at(index)->sock.fd();
}

void TcpContext::setSendBufferForTesting(int peer, int index, int bytes) {
  const int fd = socketForTesting(peer, index);
  GFLOW_SYSCHECK(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)), "SO_SNDBUF");
}

void TcpContext::sendControl(Conn& c, uint16_t type) {
  sendFrame(c, FrameHeader{kFrameMagic, type, 0, group(), 0, 0, 0, 0, {0, 0, 0}, {}}, nullptr);
}

void TcpContext::sendFrame(Conn& c, const FrameHeader& h,
                           std::shared_ptr<const std::vector<char>> payload) {
  SendItem item;
  item.hdr = h;
  if (payload) {
    item.payload = payload->data();
    item.payloadLen = payload->size();
    item.owned = std::move(payload);
  }
  enqueue(c, std::move(item));
}

TcpContext::Conn* TcpContext::controlConn(int peer) {
  for (auto& c : peers_[peer]->conns) {
    if (c && !c->closed) return c.get();
  }
  return nullptr;
}

}  // namespace gflow::transport::tcp
