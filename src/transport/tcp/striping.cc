#include "transport/tcp/striping.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace gflow::transport::tcp {

namespace {

// A message's share of `nconn` sockets, rounded up to 4 KiB so that stripe
// boundaries stay page-aligned relative to the message start.
uint64_t evenShare(uint64_t bytes, size_t nconn) {
  return (bytes / nconn + 4095) & ~uint64_t(4095);
}

// Measured faster; a socket not measured yet is not preferred. (An idle
// socket that gets a unit it sends more slowly only delays that unit.)
bool faster(const Conn& a, const Conn& b) {
  return a.rate > b.rate;
}

}  // namespace

// Assignment by progress reads "send queue empty" as "this socket has sent
// what it took": keep the kernel's unsent backlog short, or a slow socket
// would swallow a whole send buffer's worth and finish last.
void Striping::prepare(Conn& c, int sockets) const {
  if (sockets <= 1 || chunk_ == 0) return;
  int lowat = kNotsentLowat;
  if (setsockopt(c.sock.fd(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat)) == 0) {
    c.notsentLowat = lowat;
  } else {
    GFLOW_LOG(DEBUG) << "TCP_NOTSENT_LOWAT: " << std::strerror(errno);
  }
}

Striping::EvenSplit Striping::split(Pair& p, SendMsg& msg, uint64_t bytes) const {
  const int nconn = static_cast<int>(p.conns.size());
  int frags = (bytes >= min_ && nconn > 1) ? nconn : 1;
  const uint64_t per = evenShare(bytes, frags);
  // Rounding up can leave nothing for the last connections: use fewer.
  if (per > 0) frags = static_cast<int>(std::min<uint64_t>(frags, (bytes + per - 1) / per));
  msg.fragmentsLeft = frags;
  const size_t first = p.nextConn;
  p.nextConn = (p.nextConn + 1) % nconn;
  return EvenSplit{frags, per, first};
}

SendItem Striping::fragment(const EvenSplit& s, const std::shared_ptr<SendMsg>& msg,
                            const FrameHeader& hdr, const char* base, int f) {
  const uint64_t bytes = hdr.msgLen;
  const uint64_t off = std::min<uint64_t>(bytes, s.per * f);
  SendItem item;
  item.msg = msg;
  item.hdr = hdr;
  item.hdr.offset = off;
  item.hdr.fragLen = (f == s.frags - 1) ? bytes - off : std::min<uint64_t>(s.per, bytes - off);
  item.payload = base + off;
  item.payloadLen = item.hdr.fragLen;
  return item;
}

// Chosen over splitting each message by estimated per-socket rates: the
// pull needs no rate estimate to be right, follows a rate that changes at
// once, and at equal rates gives equal shares; measured in
// docs/performance.md, "TCP: adaptive striping".
void Striping::queue(Pair& p, const std::shared_ptr<SendMsg>& msg, const FrameHeader& hdr,
                     const char* base) const {
  const uint64_t bytes = hdr.msgLen;
  const size_t nconn = p.conns.size();
  // Below GFLOW_STRIPE_MIN a message is one unit (on whichever socket is
  // free first); from there on, pieces of GFLOW_STRIPE_CHUNK, at most an
  // even share each so a message just above the minimum still spreads.
  uint64_t unit = bytes;
  if (bytes >= min_) unit = std::min(chunk_, evenShare(bytes, nconn));
  unit = std::max<uint64_t>(unit, 1);
  msg->fragmentsLeft = bytes == 0 ? 1 : (bytes + unit - 1) / unit;
  const uint64_t share = bytes >= min_ ? evenShare(bytes, nconn) : bytes;
  p.pending.push_back(Pending{msg, hdr, base, 0, bytes, unit, share});
  p.pendingBytes += bytes;
}

Conn* Striping::idleTaker(Pair& p) const {
  if (p.pending.empty()) return nullptr;
  Conn* best = nullptr;
  for (auto& c : p.conns) {
    if (!c || c->closed || !c->sendq.empty() || !c->ready || !worthTaking(p, *c)) continue;
    if (!best || faster(*c, *best)) best = c.get();
  }
  return best;
}

// Not when a socket of the peer at least twice as fast, busy now, would
// send everything pending, this unit included, before c alone could send
// this unit (the tail of a burst goes to the fast socket, which would
// otherwise wait for the slow one to deliver it). Every socket that
// declines leaves one that will come back: the last busy one defers to
// nobody.
bool Striping::worthTaking(const Pair& p, const Conn& c) const {
  if (c.rate == 0 || p.pending.empty()) return true;
  const Pending& u = p.pending.front();
  const double unit = static_cast<double>(std::min(u.unit, u.end - u.next));
  const double mine = unit / c.rate;
  for (const auto& o : p.conns) {
    // Only a socket waiting for EPOLLOUT is sure to come back for the rest;
    // deferring to an idle one could leave the units with nobody.
    // Rates are estimates: defer only to one at least twice as fast.
    if (!o || o.get() == &c || o->closed || !o->wantOut || o->rate < 2 * c.rate) continue;
    // What o still has to send before it could start.
    double backlog = static_cast<double>(o->backlog());
    if (!o->ready) backlog += o->notsentLowat;
    if ((backlog + static_cast<double>(p.pendingBytes)) / o->rate < mine) return false;
  }
  return true;
}

// A fast socket takes about what it sends while its waiter wakes up (its
// TCP_NOTSENT_LOWAT) at once, as one frame: fewer frames and system calls
// on both sides. A slow one takes a single unit. One the kernel has never
// refused is not slow: it takes up to an even share, so equal flows cut a
// message as the equal split did.
void Striping::refill(Pair& p, Conn& c) const {
  if (p.pending.empty()) return;
  Pending& u = p.pending.front();
  SendItem item;
  item.msg = u.msg;
  item.hdr = u.hdr;
  item.hdr.offset = u.next;
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

// A socket the kernel refused is not ready until EPOLLOUT. When an EPOLLOUT
// flush is refused and the socket was refused before too, it has been
// backlogged since, and what it wrote now is what drained then: one rate
// sample. (Other flushes, such as the one after reading, would time a few
// freed bytes over microseconds: no sample.)
void Striping::noteProgress(Conn& c, bool blocked, size_t burst, bool writable) const {
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
void Striping::tuneNotsent(Conn& c) {
  constexpr double kFastRate = 256e6;  // bytes/s
  int want = kNotsentLowat;
  while (c.rate >= kFastRate && want < kMaxNotsentLowat && want < c.rate * 1e-3) want *= 2;
  if (want == c.notsentLowat) return;
  if (setsockopt(c.sock.fd(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &want, sizeof(want)) == 0) {
    c.notsentLowat = want;
  }
}

}  // namespace gflow::transport::tcp
