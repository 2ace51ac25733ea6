// The send side of the TCP wire (tcp_context.h): queueing frames on a
// peer's connections (which socket takes which piece is striping.h's) and
// writing them out several frames per sendmsg.
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

RequestPtr TcpContext::isend(int peer, const void* data, size_t bytes, Tag tag,
                             const Envelope& env) {
  checkFailed();
  GFLOW_ENFORCE(peer >= 0 && peer < size() && peer != rank());
  if (!connected(peer)) connectPeer(peer);
  auto req = std::make_shared<Request>(peer, true, bytes);
  Pair& p = *peers_[peer];
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

// The message's DATA frames, queued (now, or on its CLEAR): by progress
// (several sockets), its idle sockets take a unit each now, the fastest
// first, and the others theirs when epoll reports them writable.
void TcpContext::queueData(Pair& p, const RequestPtr& req, const FrameHeader& hdr,
                           const char* data) {
  auto msg = std::make_shared<SendMsg>();
  msg->req = req;
  if (!striping_.byProgress(p)) {
    const Striping::EvenSplit s = striping_.split(p, *msg, hdr.msgLen);
    for (int f = 0; f < s.frags; ++f) {
      enqueue(*p.conns[(s.first + f) % p.conns.size()], Striping::fragment(s, msg, hdr, data, f));
    }
    return;
  }
  striping_.queue(p, msg, hdr, data);
  for (size_t k = 0; k < p.conns.size(); ++k) {
    Conn* idle = striping_.idleTaker(p);
    if (!idle) break;
    flush(*idle);
  }
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
  Pair& p = *peers_[c.peer];
  if (writable) c.ready = true;
  size_t burst = 0;
  bool blocked = false;
  ArrivalStamp now;  // one stamp per call, made on first use (Engine::restamp)
  for (;;) {
    if (c.sendq.empty() && c.ready && !p.pending.empty() && striping_.worthTaking(p, c)) {
      striping_.refill(p, c);
    }
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
  if (p.conns.size() > 1) striping_.noteProgress(c, blocked, burst, writable);
  bool want = !c.sendq.empty() || !c.ready;
  if (want != c.wantOut) {
    c.wantOut = want;
    updateInterest(c);
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

ConnCounters TcpContext::connCounters(int peer, int index) const {
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

}  // namespace gflow::transport::tcp
