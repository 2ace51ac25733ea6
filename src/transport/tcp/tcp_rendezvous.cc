// Rendezvous on the TCP wire (frames in frame.h): a large message waits
// with its sender until the receiver has posted its receive.
//
// Between hosts (GFLOW_RENDEZVOUS): a message of at least that size goes
// as a RENDEZVOUS header; the receiver answers CLEAR once its receive is
// posted and the DATA then lands in place. A receiver that posts a large
// receive first sends CLEAR at once, and a sender that has its CLEAR sends
// DATA without a header of its own, so a receiver that is ready costs no
// round trip. Early data is what this avoids: without it, a sender ahead of
// its receiver (the next op's blocks of an all-to-all) streams megabytes
// that the receiver stages and copies again, which with busy cores decides
// the rate (docs/performance.md). The header still arrives at once, so a
// receive from any source, the envelope and stale-op checks and the
// liveness probe see it, and nothing behind it on the connection waits.
//
// Between two ranks of one host (GFLOW_LOCAL_SINGLE_COPY), single copy:
// the RENDEZVOUS carries the payload's address and the ticket this rank's
// local::Host lent it under, and the receiver reads it through the pair's
// local link (local/link.h) into the posted receive and answers READ. One
// copy instead of two (three when the data arrives before its receive).
//
// Either way the send completes only once the receiver has posted its
// receive (as verbs' large messages, and Gloo's and MPI's large sends, do);
// smaller messages go at once.
//
// Who may use single copy is the link's agreement while connecting
// (local/host.h): a sender announces addresses only to a peer that proved
// it reads it, and a receiver reads only from a process it verified
// itself. Each direction is agreed on its own. Anything else (another
// host, a container or Yama policy that denies the read, GFLOW_SHM=0, a
// buffer the kernel cannot pin) keeps the other paths, so the choice never
// changes what a message delivers. A RENDEZVOUS is checked as a DATA
// header is (envelope, stale op, size against the posted receive).
#include <cstring>

#include "transport/tcp/tcp_context.h"

namespace gflow::transport::tcp {

bool TcpContext::holdSend(int peer, const RequestPtr& req, const FrameHeader& hdr,
                          const char* data) {
  Pair& p = *peers_[peer];
  const Tag tag{hdr.group, hdr.index};
  const bool cleared = takeClear(peer, hdr);
  const uint64_t bytes = hdr.msgLen;
  // Single copy while a ticket is free (4096 sends held at once).
  std::optional<uint16_t> ticket;
  if (p.link && p.link->peerReads() && bytes >= singleCopyMin_)
    ticket = host_->lend(data, bytes, tag);
  const bool single = ticket.has_value();
  if (!single && (cleared || !waitsForReceive(tag, bytes))) return false;
  if (!single) {
    // A receiver that posted just before (both sides of an exchange) has
    // its CLEAR on the way or in the socket already: one look saves the wait
    // (not the single-copy reads irecv left: they wait until the sends are out).
    progress(0, /*reads=*/false);
    if (takeClear(peer, hdr)) return false;
  }
  const Held h{req, hdr, data, single, ticket.value_or(0)};
  if (!p.held.emplace(tag, h).second) {
    fail(Error(ErrorCode::kInternal, "two sends posted for one tag",
               ErrorContext().withSeq(tag.group).withRank(rank()).withPeer(peer)));
  }
  resumePaused(p);  // its CLEAR or READ may be behind a paused frame
  FrameHeader r = hdr;
  r.type = kFrameRendezvous;
  r.reserved = h.ticket;
  r.offset = single ? reinterpret_cast<uintptr_t>(data) : 0;
  r.fragLen = 0;
  Conn* c = peers_[peer]->controlConn();
  if (!c) failLost(peer, "has closed its connections");
  sendFrame(*c, r, nullptr);
  return true;
}

// A RENDEZVOUS header: a single-copy message is read now into the posted
// receive, one over the wire is cleared, or either waits (announced) for its
// receive. False when the unexpected limit pauses the connection (the
// header is handled again once it resumes). What the peer claims here is
// checked before use: an address only from a peer whose process this rank
// verified itself (the read goes to that process and nowhere else), a
// ticket index below kTickets, and the send's liveness by its ticket's
// value in that process, read after the data (readRendezvous).
bool TcpContext::startRendezvous(Conn& c) {
  const FrameHeader& h = c.hdr;
  if (h.offset != 0 && (!readsPeer(c.peer) || singleCopyMin_ == 0)) {
    protocolError(c.peer, "a message by single copy, which this rank never offered");
  }
  if (h.msgLen == 0 || h.msgLen > kMaxMessageBytes || h.reserved >= local::Host::kTickets) {
    protocolError(c.peer, "a rendezvous for a message of " + std::to_string(h.msgLen) +
                              " bytes, ticket " + std::to_string(h.reserved));
  }
  Pair& p = *peers_[c.peer];
  if (p.crossed.erase(Tag{h.group, h.index}) > 0) return true;  // received already
  auto* m = matchHeader(c, 0);
  if (c.paused) return false;
  if (m && m->released && !m->announced) {  // its data is arriving already
    m->announced = true;
    return true;
  }
  if (!m) {
    Envelope env;
    std::memcpy(env.words, h.env, sizeof(env.words));
    m = static_cast<RecvMsg*>(announce(c.peer, Tag{h.group, h.index}, env, h.msgLen));
  } else if (!m->req || m->remote || m->announced || m->claimed.claimed() > 0) {
    protocolError(c.peer, "two messages with one tag");
  }
  m->remote = h.offset;
  m->ticket = h.reserved;
  m->announced = h.offset == 0;
  if (!m->req) return true;
  if (m->remote) {
    readRendezvous(c.peer, m);
  } else if (!m->cleared) {
    sendClear(c.peer, m);
  }
  return true;
}

bool TcpContext::takeClear(int peer, const FrameHeader& hdr) {
  auto& clears = peers_[peer]->clears;
  auto it = clears.find(Tag{hdr.group, hdr.index});
  if (it == clears.end()) return false;
  const uint64_t theirs = it->second;
  clears.erase(it);
  checkCleared(peer, hdr, theirs);
  return true;
}

void TcpContext::checkCleared(int peer, const FrameHeader& hdr, uint64_t cleared) {
  if (cleared == hdr.msgLen) return;
  Envelope env;
  std::memcpy(env.words, hdr.env, sizeof(env.words));
  fail(sizeMismatch(rank(), hdr.group, peer, hdr.msgLen, cleared, describe(env)));
}

// CLEAR for `m`, whose receive is posted: the sender may send its DATA.
void TcpContext::sendClear(int peer, RecvMsg* m) {
  m->cleared = true;
  Conn* c = peers_[peer]->controlConn();
  if (!c) failLost(peer, "closed its connections before its message arrived");
  sendFrame(*c,
            stamped(FrameHeader{
                kFrameMagic, kFrameClear, 0, m->tag.group, m->tag.index, m->len, 0, 0, {}, {}}),
            nullptr);
}

// A receive posted before anything of its message arrived: large ones are
// cleared at once (none from a peer that sends them by single copy), so
// the sender need not wait a round trip.
bool TcpContext::clearsAhead(int peer, const Tag& tag, uint64_t bytes) const {
  if (!waitsForReceive(tag, bytes)) return false;
  return !readsPeer(peer) || singleCopyMin_ == 0 || bytes < singleCopyMin_;
}

// Point-to-point from GFLOW_RENDEZVOUS on, and so the messages of an op
// that posts its receives first (receivesPostedFirst: all-to-all); other
// collectives' messages from kCollectiveFactor times that (measured,
// docs/performance.md: a rooted op's tree gains from its early data up to
// a few MiB, all-to-all and sendrecv lose to it from a few hundred KiB).
bool TcpContext::waitsForReceive(const Tag& tag, uint64_t bytes) const {
  constexpr uint64_t kCollectiveFactor = 16;
  if (rendezvousMin_ == 0) return false;
  if (isPointToPoint(tag.group) || tag.group == receivesFirstGroup_) {
    return bytes >= rendezvousMin_;
  }
  return bytes / kCollectiveFactor >= rendezvousMin_;
}

// Reads the announced message `m` into its posted receive, tells the sender
// (READ) and completes the receive.
void TcpContext::readRendezvous(int peer, RecvMsg* m) {
  Pair& p = *peers_[peer];
  int err = 0;
  switch (p.link->readMessage(m->remote, m->ticket, m->tag, m->user, m->len, &err)) {
    case local::Link::Read::kDone: break;
    case local::Link::Read::kExited:
    case local::Link::Read::kWithdrawn:
      // The sender's process is gone, or its op failed. What it sent before,
      // an error report naming the rank that failed above all, is still in
      // its sockets, and their EOF follows: they decide, as for a peer that
      // dies mid-frame (handleClosed fails the receive, which stays posted,
      // as peer_lost); otherwise the deadline does.
      if (p.closed) failLost(peer, "exited before this rank read its message");
      return;
    case local::Link::Read::kFailed:
      fail(Error(ErrorCode::kInternal,
                 "could not read rank " + std::to_string(peer) + "'s message of " +
                     std::to_string(m->len) + " bytes from its memory (" + std::strerror(err) + ")",
                 ErrorContext().withSeq(m->tag.group).withRank(rank()).withPeer(peer)));
  }
  Conn* c = peers_[peer]->controlConn();
  if (!c) failLost(peer, "closed its connections before its message was read");
  sendFrame(*c,
            stamped(FrameHeader{
                kFrameMagic, kFrameRead, 0, m->tag.group, m->tag.index, m->len, 0, 0, {}, {}}),
            nullptr);
  completeRecv(peer, m);
}

void TcpContext::readDue() {
  while (!readsDue_.empty()) {
    const auto [peer, tag] = readsDue_.front();
    readsDue_.pop_front();
    auto* m = findAs<RecvMsg>(peer, tag);
    if (m && m->req && m->remote) readRendezvous(peer, m);
  }
}

// READ: the peer has read a message this rank sent by single copy.
void TcpContext::handleRead(Conn& c) {
  const FrameHeader& h = c.hdr;
  auto& held = peers_[c.peer]->held;
  auto it = held.find(Tag{h.group, h.index});
  if (it == held.end() || !it->second.single || it->second.hdr.msgLen != h.msgLen) {
    protocolError(c.peer, "a READ of a message this rank did not send by single copy");
  }
  const RequestPtr req = std::move(it->second.req);
  host_->returned(it->second.ticket);
  held.erase(it);
  countSendDone(c.peer, req->bytes());
  countSingleCopy(c.peer, req->bytes());
  req->complete();
}

// CLEAR: the peer posted the receive of a message this rank holds (its
// DATA goes now), or will send (kept, bounded, for that send).
void TcpContext::handleClear(Conn& c) {
  constexpr size_t kMaxClears = 1 << 16;
  const FrameHeader& h = c.hdr;
  Pair& p = *peers_[c.peer];
  const Tag tag{h.group, h.index};
  auto it = p.held.find(tag);
  if (it == p.held.end()) {
    if (p.clears.size() >= kMaxClears) protocolError(c.peer, "clears for too many messages");
    p.clears.emplace(tag, h.msgLen);
    return;
  }
  if (it->second.single) return;  // cleared ahead; the peer reads it
  checkCleared(c.peer, it->second.hdr, h.msgLen);
  Held hd = std::move(it->second);
  p.held.erase(it);
  hd.hdr.reserved = kReleased;
  queueData(p, hd.req, hd.hdr, hd.data);
}

}  // namespace gflow::transport::tcp
