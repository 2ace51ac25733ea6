// Polled streams on the TCP wire (transport/polled_stream.h): a peer of
// this host whose local link (local/link.h) has a stream talks through it
// instead of its sockets. The frames are the same, so everything above the
// byte stream (matching, rendezvous and single copy, reports, probes) is
// unchanged; what goes is the system calls: a small message costs a copy
// into the stream and one out of it, where it was a sendmsg and an epoll
// wake-up over loopback.
//
// The stream connection is not in epoll: progress() polls every stream,
// and before it sleeps in epoll it arms them (PolledStream::arm), so a
// peer that writes to a sleeper sends one DOORBELL over the pair's socket.
// The sockets stay connected for that, for failure reports (notifyPeers
// writes them there: a socket has room when the stream may not, and is
// read even while the stream is paused) and for their EOF: once the
// peer's sockets have all closed (or reset) and its stream is read to the
// end, the stream connection is closed as a socket at EOF would be (a
// frame cut off there is the peer lost mid-message, and sends still queued
// for it are lost too). Nothing else may come over those sockets.
#include <sys/uio.h>

#include <algorithm>
#include <thread>

#include "common/check.h"
#include "transport/tcp/tcp_context.h"

namespace gflow::transport::tcp {

void TcpContext::installStream(int peer) {
  Pair& p = *peers_[peer];
  std::unique_ptr<PolledStream> stream = p.link ? p.link->takeStream() : nullptr;
  if (!stream) return;
  p.sockets = std::move(p.conns);
  p.conns.clear();
  for (auto& s : p.sockets) s->doorbellOnly = true;
  auto c = std::make_unique<Conn>(peer, 0);
  c->stream = std::move(stream);
  c->watched = false;
  streams_.push_back(c.get());
  p.conns.push_back(std::move(c));
}

void TcpContext::dropSocket(Conn& c) {
  c.sendq.clear();
  c.wantOut = false;
  markGone(c);
}

void TcpContext::pollStreams() {
  for (Conn* c : streams_) {
    if (c->closed) continue;
    if (c->stream->broken()) protocolError(c->peer, "its polled stream is corrupt");
    if (c->wantOut && c->stream->writable()) flush(*c, /*writable=*/true);
    const bool gone = peers_[c->peer]->socketsClosed();
    if (gone && c->wantOut) {
      // Nobody reads them: control frames go (as into a closed socket's
      // buffer); a message still queued is lost with the peer.
      auto& q = c->sendq;
      q.erase(std::remove_if(q.begin(), q.end(), [](const SendItem& it) { return !it.msg; }),
              q.end());
      c->wantOut = !q.empty();
      if (c->wantOut && c->paused) failLost(c->peer, "closed its connections before its data went");
    }
    if (!c->paused && (c->stream->readable() || gone)) handleReadable(*c);
  }
}

bool TcpContext::armStreams() {
  if (++sleepGen_ == 0) ++sleepGen_;
  for (Conn* c : streams_) {
    if (c->closed) continue;
    // A paused stream keeps its data until a receive is posted: nothing to read.
    const bool wantsData = !c->paused;
    // A peer gone: its stream is read to the end, or its queued frames go.
    const bool gone = peers_[c->peer]->socketsClosed() && (wantsData || c->wantOut);
    if (!c->stream->arm(sleepGen_, c->wantOut, wantsData) || gone) {
      disarmStreams();
      return false;
    }
  }
  return true;
}

void TcpContext::disarmStreams() {
  for (Conn* c : streams_) c->stream->disarm();
}

Fill TcpContext::fillStream(Conn& c, char* dst, size_t cap, size_t* got) {
  for (bool closed = false;; closed = true) {
    const size_t n = c.stream->read(dst, cap);
    if (c.stream->broken()) protocolError(c.peer, "its polled stream is corrupt");
    if (n > 0) {
      *got = n;
      if (dst == c.ahead.get()) c.drained = n < cap;
      wakePeer(c, /*forRoom=*/true);
      return Fill::kData;
    }
    c.drained = true;
    if (closed) return Fill::kClosed;
    // Its sockets closed after it wrote its last bytes: one more look.
    if (!peers_[c.peer]->socketsClosed()) return Fill::kWouldBlock;
  }
}

size_t TcpContext::writeStream(Conn& c, const iovec* iov, int count) {
  const size_t n = c.stream->write(iov, count);
  if (c.stream->broken()) protocolError(c.peer, "its polled stream is corrupt");
  if (n > 0) wakePeer(c, /*forRoom=*/false);
  return n;
}

// One DOORBELL per sleep of the peer; none while one is still queued (a
// peer that keeps changing its sleep word cannot grow the queue). Never
// throws: a socket that fails only goes (dropSocket), and the stream's
// bookkeeping around this call stays whole.
void TcpContext::wakePeer(Conn& c, bool forRoom) {
  if (!c.stream->peerNeedsWake(forRoom)) return;
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

void TcpContext::flushStreamsAtExit() {
  constexpr auto kBound = std::chrono::milliseconds(500);
  const Deadline d = Deadline::after(kBound);
  for (;;) {
    bool left = false;
    for (Conn* c : streams_) {
      if (c->closed || c->sendq.empty() || peers_[c->peer]->socketsClosed()) continue;
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
