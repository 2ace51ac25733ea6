// Local rings on the TCP wire (local_ring.h): between two ranks of one
// host that read each other's memory (the single-copy agreement,
// tcp_rendezvous.cc), every frame goes through a pair of shared-memory
// rings instead of the socket. The frames are the same, so everything
// above the byte stream (matching, rendezvous and single copy, reports,
// probes) is unchanged; what goes is the system calls: a small message
// costs a copy into the ring and one out of it, and a large one a header
// through the ring, the single-copy read and a READ back, where each of
// these was a sendmsg and an epoll wake-up over loopback.
//
// The ring connection is not in epoll: progress() polls every ring, and
// before it sleeps in epoll it arms them (LocalRing::arm), so a peer that
// writes to a sleeper sends one DOORBELL over the pair's socket. The
// sockets stay connected for that, for failure reports (notifyPeers writes
// them there: a socket has room when the ring may not, and is read even
// while the ring is paused) and for their EOF: once the peer's sockets
// have all closed (or reset) and its ring is read to the end, the ring
// connection is closed as a socket at EOF would be (a frame cut off there
// is the peer lost mid-message, and sends still queued for it are lost
// too). Nothing else may come over those sockets.
#include <sys/uio.h>

#include <algorithm>
#include <thread>

#include "common/check.h"
#include "common/logging.h"
#include "transport/tcp/tcp_context.h"

namespace gflow::transport::tcp {

namespace {

constexpr size_t kMaxRing = size_t{1} << 30;

bool validCapacity(uint64_t c) {
  return c >= 4096 && c <= kMaxRing && (c & (c - 1)) == 0;
}

template <typename T>
void exchange(int fd, const T& mine, T* theirs, bool dialer, const Deadline& d) {
  if (dialer) net::sendAll(fd, &mine, sizeof(mine), d);
  net::recvAll(fd, theirs, sizeof(*theirs), d);
  if (!dialer) net::sendAll(fd, &mine, sizeof(mine), d);
}

}  // namespace

// Called only for a pair whose ranks proved to each other that they read
// each other (tcp_connect.cc). The peer's offer is then proven as far as it
// can hurt: its fd opens only through /proc/<the verified pid>/fd, as a
// sealed memfd of at least the offered size (Mapping::open), the capacity
// must be a power of two in [4 KiB, 1 GiB], the mapping is read-only, and
// the ring's words are checked on every use (LocalRing::broken). A peer
// that says it mapped this rank's ring and never reads it stalls only this
// pair, until the deadline names it.
std::shared_ptr<LocalRing> agreeLocalRing(int fd, pid_t pid, size_t capacity, bool dialer,
                                          const Deadline& deadline) {
  Mapping mine;
  RingOffer offer{0, 0};
  if (capacity > 0) {
    try {
      mine = LocalRing::create(capacity);
      offer = RingOffer{static_cast<uint32_t>(mine.fd()), static_cast<uint32_t>(capacity)};
    } catch (const Error& e) {
      GFLOW_LOG(DEBUG) << "no local ring: " << e.what();
    }
  }
  RingOffer theirs{};
  exchange(fd, offer, &theirs, dialer, deadline);
  Mapping peer;
  if (offer.capacity != 0 && validCapacity(theirs.capacity)) {
    std::string why;
    peer = Mapping::open(pid, static_cast<int>(theirs.fd), LocalRing::segmentBytes(theirs.capacity),
                         &why, /*readOnly=*/true);
    if (!peer.data()) {
      GFLOW_LOG(DEBUG) << "no local ring: " << why;
    }
  }
  const uint8_t mapped = peer.data() ? 1 : 0;
  uint8_t theyMapped = 0;
  exchange(fd, mapped, &theyMapped, dialer, deadline);
  mine.closeFd();  // the peer has opened it, or never will
  if (!mapped || theyMapped != 1) return nullptr;
  return std::make_shared<LocalRing>(std::move(mine), offer.capacity, std::move(peer),
                                     theirs.capacity);
}

void TcpContext::installRings() {
  for (int peer = 0; peer < size(); ++peer) {
    PeerState& p = *peers_[peer];
    if (!p.ring) continue;
    p.sockets = std::move(p.conns);
    p.conns.clear();
    for (auto& s : p.sockets) s->doorbellOnly = true;
    auto c = std::make_unique<Conn>();
    c->peer = peer;
    c->ahead.reset(new char[kReadAhead]);
    c->ring = std::move(p.ring);
    c->watched = false;
    rings_.push_back(c.get());
    p.conns.push_back(std::move(c));
  }
}

bool TcpContext::socketsClosed(const PeerState& p) const {
  for (const auto& s : p.sockets) {
    if (s && !s->closed) return false;
  }
  return true;
}

void TcpContext::dropSocket(Conn& c) {
  c.sendq.clear();
  c.wantOut = false;
  markGone(c);
}

void TcpContext::pollRings() {
  for (Conn* c : rings_) {
    if (c->closed) continue;
    if (c->ring->broken()) protocolError(c->peer, "the words of its local ring are corrupt");
    if (c->wantOut && c->ring->writable()) flush(*c, /*writable=*/true);
    const bool gone = socketsClosed(*peers_[c->peer]);
    if (gone && c->wantOut) {
      // Nobody reads them: control frames go (as into a closed socket's
      // buffer); a message still queued is lost with the peer.
      auto& q = c->sendq;
      q.erase(std::remove_if(q.begin(), q.end(), [](const SendItem& it) { return !it.msg; }),
              q.end());
      c->wantOut = !q.empty();
      if (c->wantOut && c->paused) failLost(c->peer, "closed its connections before its data went");
    }
    if (!c->paused && (c->ring->readable() || gone)) handleReadable(*c);
  }
}

bool TcpContext::armRings() {
  if (++sleepGen_ == 0) ++sleepGen_;
  for (Conn* c : rings_) {
    if (c->closed) continue;
    // A paused ring keeps its data until a receive is posted: nothing to read.
    const bool wantsData = !c->paused;
    // A peer gone: its ring is read to the end, or its queued frames go.
    const bool gone = socketsClosed(*peers_[c->peer]) && (wantsData || c->wantOut);
    if (!c->ring->arm(sleepGen_, c->wantOut, wantsData) || gone) {
      disarmRings();
      return false;
    }
  }
  return true;
}

void TcpContext::disarmRings() {
  for (Conn* c : rings_) c->ring->disarm();
}

TcpContext::Fill TcpContext::fillRing(Conn& c, char* dst, size_t cap, size_t* got) {
  for (bool closed = false;; closed = true) {
    const size_t n = c.ring->read(dst, cap);
    if (c.ring->broken()) protocolError(c.peer, "the words of its local ring are corrupt");
    if (n > 0) {
      *got = n;
      if (dst == c.ahead.get()) c.drained = n < cap;
      wakePeer(c, /*forRoom=*/true);
      return Fill::kData;
    }
    c.drained = true;
    if (closed) return Fill::kClosed;
    // Its sockets closed after it wrote its last bytes: one more look.
    if (!socketsClosed(*peers_[c.peer])) return Fill::kWouldBlock;
  }
}

size_t TcpContext::writeRing(Conn& c, const iovec* iov, int count) {
  const size_t n = c.ring->write(iov, count);
  if (c.ring->broken()) protocolError(c.peer, "the words of its local ring are corrupt");
  if (n > 0) wakePeer(c, /*forRoom=*/false);
  return n;
}

// One DOORBELL per sleep of the peer; none while one is still queued (a
// peer that keeps changing its sleep word cannot grow the queue). Never
// throws: a socket that fails only goes (dropSocket), and the ring's
// bookkeeping around this call stays whole.
void TcpContext::wakePeer(Conn& c, bool forRoom) {
  if (!c.ring->peerNeedsWake(forRoom)) return;
  for (auto& s : peers_[c.peer]->sockets) {
    if (!s || s->closed) continue;
    if (!s->sendq.empty()) return;
    try {
      sendControl(*s, kFrameDoorbell);
    } catch (const Error&) {
      dropSocket(*s);
    }
    return;
  }
}

void TcpContext::flushRingsAtExit() {
  constexpr auto kBound = std::chrono::milliseconds(500);
  const Deadline d = Deadline::after(kBound);
  for (;;) {
    bool left = false;
    for (Conn* c : rings_) {
      if (c->closed || c->sendq.empty() || socketsClosed(*peers_[c->peer])) continue;
      try {
        flush(*c);
      } catch (const Error&) {
        continue;
      }
      left = left || !c->sendq.empty();
    }
    if (!left || d.expired()) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace gflow::transport::tcp
