#include "transport/tcp/tcp_context.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/params.h"
#include "transport/connect_mode.h"
#include "transport/liveness.h"

namespace gflow::transport::tcp {
namespace {

// The unit a striped message is cut into (Options::tcp.stripeChunkBytes,
// else GFLOW_STRIPE_CHUNK); 0 keeps the equal split assigned up front.
uint64_t stripeMinBytes(const ContextOptions& o) {
  return std::max<uint64_t>(o.tcp.stripeMinBytes ? *o.tcp.stripeMinBytes : params::stripeMin(),
                            4096);
}

uint64_t stripeChunkBytes(const ContextOptions& o) {
  const uint64_t c = o.tcp.stripeChunkBytes ? *o.tcp.stripeChunkBytes : params::stripeChunk();
  return c ? std::max<uint64_t>(c, 4096) : 0;
}

// What this rank offers peers of its host (local/host.h): single copy and
// a ring of GFLOW_LOCAL_RING bytes (a power of two, rounded down), where
// the communicator allows them (ContextOptions::localSingleCopy).
local::Host::Options localOptions(const ContextOptions& o, uint64_t commId) {
  local::Host::Options h;
  h.hostHash = o.hostHash;
  h.rank = o.rank;
  h.size = o.size;
  h.commId = commId;
  h.singleCopy = o.localSingleCopy && params::localSingleCopy() > 0;
  if (o.localSingleCopy && params::localRing() > 0) {
    h.ringBytes = size_t{1} << (63 - __builtin_clzll(params::localRing()));
  }
  return h;
}

}  // namespace

TcpContext::TcpContext(const ContextOptions& options)
    : Engine(options), striping_(stripeMinBytes(options), stripeChunkBytes(options)) {
  waitPolicy_ = WaitPolicy::choose(options);
  singleCopyMin_ = options.localSingleCopy ? params::localSingleCopy() : 0;
  rendezvousMin_ =
      options.tcp.rendezvousBytes ? *options.tcp.rendezvousBytes : params::rendezvous();
  if (rendezvousMin_ > 0) rendezvousMin_ = std::max<uint64_t>(rendezvousMin_, 4096);
  socketsPerPeer_ = options.tcp.socketsPerPeer ? *options.tcp.socketsPerPeer
                                               : static_cast<int>(params::socketsPerPeer());
  if (socketsPerPeer_ < 1 || socketsPerPeer_ > 64) {
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("init").withRank(rank()))
        << "GFLOW_SOCKETS_PER_PEER=" << socketsPerPeer_ << " must be between 1 and 64";
  }

  commId_ = hash::sha256Id(options.prefix);
  host_ = std::make_unique<local::Host>(localOptions(options, commId_));
  peers_.resize(size());
  for (auto& p : peers_) p = std::make_unique<Pair>();
  lazy_ = transport::connectsOnDemand(options);
  connectAll(options);
}

TcpContext::~TcpContext() {
  if (acceptor_) acceptor_->stop();  // no more connections (it wakes poller_)
  try {
    adoptInbound();  // closed gracefully like the rest
  } catch (const Error&) {
    // They close as they are.
  }
  if (!failed()) flushStreamsAtExit();
  host_->withdrawAll();
  closeGracefully();
}

// A socket closed with bytes it has not read makes the kernel send a reset,
// and a peer that gets one fails its context at once ("reset the
// connection"), even when everything it needed from this rank had arrived:
// a peer still finishing its last op fails instead of completing. So at
// teardown every socket sends its FIN after all its data (shutdown), and
// what has arrived unread is read and dropped; while reading finds more,
// once a millisecond, at most kBound in all. A quiet socket costs nothing:
// teardown does not wait for peers that send nothing.
void TcpContext::closeGracefully() {
  constexpr auto kBound = std::chrono::milliseconds(250);
  std::vector<int> open;
  for (auto& p : peers_) {
    for (auto* conns : {&p->conns, &p->sockets}) {
      for (auto& c : *conns) {
        if (!c || c->stream || c->closed || !c->sock.valid()) continue;
        ::shutdown(c->sock.fd(), SHUT_WR);
        open.push_back(c->sock.fd());
      }
    }
  }
  const Deadline d = Deadline::after(kBound);
  char scratch[4096];
  for (bool readSome = true; readSome && !open.empty() && !d.expired();) {
    readSome = false;
    for (size_t i = 0; i < open.size();) {
      ssize_t r = 0;
      // Bounded here too: a peer that keeps writing cannot hold teardown.
      while ((r = ::recv(open[i], scratch, sizeof(scratch), MSG_DONTWAIT)) > 0 && !d.expired()) {
        readSome = true;
      }
      if (r > 0) break;  // the bound passed mid-socket
      const bool again = r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
      if (again) {
        ++i;
      } else {  // EOF or an error: nothing more will come
        open[i] = open.back();
        open.pop_back();
      }
    }
    if (readSome) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void TcpContext::addConnection(int peer, int index, net::Socket sock) {
  auto c = std::make_unique<Conn>(peer, index);
  net::setNonBlocking(sock.fd(), true);
  net::setNoDelay(sock.fd());
  c->sock = std::move(sock);
  countConnection(peer, +1);
  striping_.prepare(*c, socketsPerPeer_);
  poller_.add(c->sock.fd(), c.get(), EPOLLIN);
  Pair& p = *peers_[peer];
  if (p.conns.size() <= static_cast<size_t>(index)) p.conns.resize(index + 1);
  p.conns[index] = std::move(c);
}

void TcpContext::wake() {
  poller_.wake();
}

void TcpContext::failWire(const Error& first) {
  clearMessages();
  readsDue_.clear();
  host_->withdrawAll();  // before the callers get their buffers back
  for (auto& p : peers_) {
    for (auto& u : p->pending) u.msg->req->fail(first);
    p->pending.clear();
    for (auto& kv : p->held) kv.second.req->fail(first);
    p->held.clear();
    p->clears.clear();
    p->crossed.clear();
    p->pendingBytes = 0;
    for (auto& c : p->conns) {
      if (!c) continue;
      for (auto& item : c->sendq) {
        if (item.msg) item.msg->req->fail(first);
      }
      // The rest of a data fragment being read has nowhere to go now.
      if (c->inPayload && c->hdr.type == kFrameData) c->discard = true;
      // Keep a partially written frame so notifyPeers can finish it.
      while (c->sendq.size() > 1 || (c->sendq.size() == 1 && c->sendq.front().written == 0)) {
        c->sendq.pop_back();
      }
      c->cur = nullptr;
    }
  }
}

RequestPtr TcpContext::irecv(int peer, void* data, size_t bytes, Tag tag, const Envelope& env) {
  checkFailed();
  GFLOW_ENFORCE(peer >= 0 && peer < size() && peer != rank());
  if (!connected(peer)) connectPeer(peer);
  auto req = std::make_shared<Request>(peer, false, bytes);
  Pair& p = *peers_[peer];
  if (!find(peer, tag) && p.closed) failLost(peer, "has closed its connections");
  auto* m = static_cast<RecvMsg*>(postRecv(peer, tag, env, data, bytes, req));
  if (m->remote) {  // announced by single copy: read by the next progress,
    // after the caller's sends of the same op are out (a read of megabytes
    // here would hold them back, and the peer's read of them behind it).
    readsDue_.emplace_back(peer, tag);
    return req;
  }
  if (!m->staging) {  // nothing arrived yet, or a RENDEZVOUS: fragments land in place
    m->buf = static_cast<char*>(data);
    if (m->announced || clearsAhead(peer, tag, bytes)) sendClear(peer, m);
    resumePaused(p);  // a paused connection may hold this message's header
    return req;
  }
  if (m->received == m->len && m->claimed.claimed() == m->len) completeRecv(peer, m);
  return req;
}

void TcpContext::completeRecv(int peer, RecvMsg* m) {
  complete(peer, m);
  resumePaused(*peers_[peer]);
}

void TcpContext::resumePaused(Pair& p) {
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
  return hasPostedRecv(peer) || peers_[peer]->sending();
}

void TcpContext::failLost(int peer, const std::string& what) {
  fail(Error(ErrorCode::kPeerLost,
             "rank " + std::to_string(peer) + " " + what + " (its process exited or was killed?)",
             ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
}

// EOF from a peer is normal when it has finished its last op and shut down;
// it is an error only while this rank still exchanges data with it.
void TcpContext::handleClosed(Conn& c) {
  if (c.doorbellOnly) return dropSocket(c);  // its stream decides
  if (c.inPayload || c.hdrGot > 0) failLost(c.peer, "closed the connection mid-message");
  markGone(c);
  if (peers_[c.peer]->closed && hasPendingWith(c.peer)) failLost(c.peer, "closed the connection");
}

// A reset is what an EOF is when this rank expects nothing more from the
// peer: a peer that finished its last op and exited may reset a socket (the
// kernel does, for one closed with bytes unread, or written to after it
// closed), and that fails this rank only while it still exchanges data with
// the peer or a frame was cut off; otherwise the peer is gone, which its
// next op with this rank says.
// Unlike an EOF, a reset may have discarded what the peer sent on this
// connection, so pending exchange fails whether or not the peer's other
// connections are open.
void TcpContext::handleReset(Conn& c, const std::string& why) {
  if (!c.doorbellOnly && hasPendingWith(c.peer)) failLost(c.peer, why);
  handleClosed(c);
}

// Stops watching a connection that has nothing more to read.
void TcpContext::markGone(Conn& c) {
  if (!c.closed && !c.stream) {
    poller_.remove(c.sock.fd());
    countConnection(c.peer, -1);
  }
  c.closed = true;
  c.watched = false;
  peers_[c.peer]->updateClosed();
}

void TcpContext::updateInterest(Conn& c) {
  if (c.stream) return;  // polled (pollStreams)
  const uint32_t events =
      (c.paused ? 0u : static_cast<uint32_t>(EPOLLIN)) | (c.wantOut ? EPOLLOUT : 0u);
  if (c.closed) return;
  if (!c.watched) {
    if (c.paused && !c.wantOut) return;  // nothing to wait for yet
    poller_.add(c.sock.fd(), &c, events);
    c.watched = true;
    return;
  }
  poller_.modify(c.sock.fd(), &c, events);
}

// One recv of at most `cap` bytes into `dst`. A short read into the
// read-ahead marks the socket drained for this wake-up; a large read straight
// into a payload keeps reading until the socket would block, as the sender
// is usually still writing.
Fill TcpContext::fill(Conn& c, char* dst, size_t cap, size_t* got) {
  if (c.stream) {
    const Fill f = fillStream(c, dst, cap, got);
    if (f == Fill::kData) readBytes_ += *got;
    return f;
  }
  for (;;) {
    const ssize_t r = ::recv(c.sock.fd(), dst, cap, MSG_DONTWAIT);
    if (r > 0) {
      *got = static_cast<size_t>(r);
      readBytes_ += *got;
      if (dst == c.ahead.get()) c.drained = *got < cap;
      return Fill::kData;
    }
    if (r == 0) return Fill::kClosed;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      c.drained = true;
      return Fill::kWouldBlock;
    }
    if (errno == EINTR) continue;
    const int err = errno;
    handleReset(c, std::string("reset the connection: ") + std::strerror(err));
    return Fill::kClosed;
  }
}

void TcpContext::protocolError(int peer, const std::string& what) {
  GFLOW_LOG(WARN) << "rank " << rank() << ": invalid frame from rank " << peer << ": " << what;
  fail(Error(ErrorCode::kInternal, "invalid frame from rank " + std::to_string(peer) + ": " + what,
             ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
}

void TcpContext::startFragment(Conn& c) {
  const FrameHeader& h = c.hdr;
  auto protocolError = [&](const std::string& what) { this->protocolError(c.peer, what); };
  if (h.magic != kFrameMagic) protocolError("bad magic");
  if (c.doorbellOnly && h.type != kFrameDoorbell && h.type != kFrameError) {
    protocolError("frame type " + std::to_string(h.type) +
                  " on a socket of a pair that talks through a polled stream");
  }
  if (h.type == kFrameError || h.type == kFrameReject) {
    if (h.fragLen > kMaxErrorPayload) protocolError("oversized error report");
    if (h.type == kFrameReject && isPointToPoint(h.group)) {
      protocolError("rejection of a point-to-point op");
    }
    c.ctrl.assign(h.fragLen, 0);
    c.cur = nullptr;
    c.dst = c.ctrl.data();
    c.left = h.fragLen;
    c.inPayload = true;
    return;
  }
  if (h.type == kFramePing || h.type == kFramePong || h.type == kFrameRead ||
      h.type == kFrameClear || h.type == kFrameRendezvous || h.type == kFrameDoorbell) {
    if (h.fragLen != 0) protocolError("control frame with a payload");
    // A RENDEZVOUS is matched now (nothing follows its header);
    // after failing, only reports matter.
    if (h.type == kFrameRendezvous && !failed() && !startRendezvous(c)) return;
    c.cur = nullptr;
    c.dst = nullptr;
    c.left = 0;
    c.inPayload = true;
    return;
  }
  if (h.type != kFrameData) protocolError("unknown frame type " + std::to_string(h.type));
  if (failed()) {  // awaitReports reads on for the reports: data is dropped
    if (h.msgLen > kMaxMessageBytes || h.fragLen > h.msgLen) protocolError("oversized fragment");
    c.cur = nullptr;
    c.discard = true;
    c.left = h.fragLen;
    c.inPayload = true;
    return;
  }
  if (h.msgLen > kMaxMessageBytes || h.fragLen > h.msgLen || h.offset > h.msgLen - h.fragLen) {
    protocolError("fragment [" + std::to_string(h.offset) + ", +" + std::to_string(h.fragLen) +
                  ") outside a message of " + std::to_string(h.msgLen) + " bytes");
  }
  RecvMsg* m = matchHeader(c, h.msgLen);
  if (c.paused) return;
  if (!m) {
    Envelope env;
    std::memcpy(env.words, h.env, sizeof(env.words));
    m = static_cast<RecvMsg*>(stage(c.peer, Tag{h.group, h.index}, env, h.msgLen));
    m->buf = m->staging.get();
  } else if (m->remote || (m->announced && !m->cleared) || (!m->buf && m->len > 0)) {
    protocolError("data for a message it holds until this rank clears or reads it");
  }
  if (h.reserved == kReleased) {  // sent on our CLEAR, after its RENDEZVOUS
    if (!m->cleared) protocolError("data released by a CLEAR this rank never sent");
    m->released = true;
  }
  const std::string bad = m->claimed.claim(h.offset, h.fragLen, m->len);
  if (!bad.empty()) protocolError(bad);
  c.cur = m;
  c.dst = m->buf + h.offset;
  c.left = h.fragLen;
  c.inPayload = true;
}

RecvMsg* TcpContext::matchHeader(Conn& c, uint64_t charge) {
  const FrameHeader& h = c.hdr;
  Envelope env;
  std::memcpy(env.words, h.env, sizeof(env.words));
  checkEnvelope(c.peer, h.group, env);
  arrival(c.peer, h.group, h.stamp);
  auto* m = findAs<RecvMsg>(c.peer, Tag{h.group, h.index});
  if (m) {
    checkArrival(c.peer, *m, env, h.msgLen);
    return m;
  }
  checkStale(c.peer, h.group, env);
  // While this rank holds sends to the peer, its CLEAR or READ may be
  // behind this frame: staged up to twice the limit rather than paused, so
  // the answer is read.
  const bool holding = !peers_[c.peer]->held.empty();
  if (!stagingFits(c.peer, charge) &&
      !(holding && stagedBytes(c.peer) + charge + kStagedOverhead <= 2 * unexpectedLimit())) {
    // Back-pressure: leave the payload in the socket until a receive is
    // posted (or staged data drains).
    GFLOW_LOG(DEBUG) << "rank " << rank() << ": pausing reads from rank " << c.peer << " ("
                     << stagedBytes(c.peer) << " bytes staged, next message " << h.msgLen
                     << " bytes, GFLOW_UNEXPECTED_LIMIT " << unexpectedLimit() << ")";
    c.paused = true;
    updateInterest(c);
  }
  return nullptr;
}

void TcpContext::finishFragment(Conn& c) {
  c.hdrGot = 0;
  c.inPayload = false;
  c.dst = nullptr;
  if (c.discard) {
    c.discard = false;
    c.cur = nullptr;
    return;
  }
  if (failed() && c.hdr.type != kFrameError) return;  // awaitReports wants reports only
  if (c.hdr.type == kFrameError) {
    handleErrorFrame(c);
    return;
  }
  if (c.hdr.type == kFrameReject) {
    peerRejected(c.hdr.group,
                 rejectionReport(rank(), c.hdr.group, c.peer, c.ctrl.data(), c.ctrl.size()));
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
  if (c.hdr.type == kFrameRead || c.hdr.type == kFrameClear) {
    arrival(c.peer, c.hdr.group, c.hdr.stamp);
    return c.hdr.type == kFrameRead ? handleRead(c) : handleClear(c);
  }
  if (c.hdr.type == kFrameRendezvous) return;  // handled by startFragment
  if (c.hdr.type == kFrameDoorbell) {          // the wake-up was the point
    ++doorbells_;
    return;
  }
  RecvMsg* m = c.cur;
  c.cur = nullptr;
  m->received += c.hdr.fragLen;
  if (m->received == m->len && m->claimed.claimed() == m->len && m->req) {
    // Its RENDEZVOUS, sent before on another connection, is still to come.
    if (m->released && !m->announced) peers_[c.peer]->crossed.insert(m->tag);
    completeRecv(c.peer, m);
  }
}

void TcpContext::handleErrorFrame(Conn& c) {
  // Payload: code (1 byte), then a human-readable description.
  const std::vector<char>& b = c.ctrl;
  peerReported(c.hdr.group, peerReport(rank(), group(), c.peer, b.data(), b.size()));
}

void TcpContext::handleReadable(Conn& c) {
  c.drained = false;  // epoll (or a caller that knows better) says there may be data
  // Bounded so one busy socket cannot starve the others.
  for (int rounds = 0; rounds < 64 && !c.paused && !c.closed; ++rounds) {
    if (!c.inPayload) {
      const Conn::Read r = c.readHeader(*this);
      if (r == Conn::Read::kClosed) handleClosed(c);
      if (r != Conn::Read::kDone) return c.tuneLowat();
      startFragment(c);
      if (c.paused) return;
    }
    const Conn::Read r = c.readPayload(*this, discarded_);
    if (r == Conn::Read::kClosed) failLost(c.peer, "closed the connection mid-message");
    if (r != Conn::Read::kDone) return c.tuneLowat();
    finishFragment(c);
  }
  if (c.closed) return;
  c.tuneLowat();
  if (!c.paused && c.hasAhead() && !c.aheadQueued) {
    c.aheadQueued = true;
    aheadPending_.push_back(&c);
  }
}

void TcpContext::progress(int timeoutMs, bool reads) {
  adoptInbound();
  pass(readBytes_ == readBytesAtPass_);
  readBytesAtPass_ = readBytes_;
  // A read completes a receive: no sleeping after it.
  const bool read = reads && !readsDue_.empty();
  if (read) readDue();
  Poller::Ready events[Poller::kMaxReady];
  int timeout = aheadPending_.empty() && !read ? timeoutMs : 0;
  const bool armed = timeout != 0 && !streams_.empty() && armStreams();
  if (!armed && !streams_.empty()) timeout = 0;
  // Every peer on a stream: the sockets carry only doorbells (not needed by
  // a poller), reports and EOFs, so a poll looks at them one time in 16.
  const bool onlyStreams = streams_.size() + 1 == static_cast<size_t>(size());
  if (timeout == 0 && onlyStreams && aheadPending_.empty() && (++quietPolls_ & 15) != 0) {
    pollStreams();
    return;
  }
  bool woken = false;
  const size_t n = poller_.wait(timeout, events, &woken);
  if (armed) disarmStreams();
  if (woken) checkFailed();
  for (size_t i = 0; i < n; ++i) {
    Conn& c = *static_cast<Conn*>(events[i].tag);
    uint32_t ev = events[i].events;
    if (ev & EPOLLOUT) flush(c, /*writable=*/true);
    if (c.closed) continue;
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      if (!c.paused) handleReadable(c);
      if ((ev & EPOLLERR) && !c.closed) handleReset(c, "reset the connection");
      if ((ev & EPOLLHUP) && !c.closed && c.paused && c.watched) {
        // The peer hung up but its data is still queued here, behind a
        // paused message: stop watching (a hung-up socket would wake epoll
        // forever) until a receive resumes it.
        poller_.remove(c.sock.fd());
        c.watched = false;
      }
    }
    if ((ev & EPOLLOUT) && !c.closed) flush(c);
  }
  pollStreams();
  if (aheadPending_.empty()) return;
  aheadWork_.swap(aheadPending_);  // handleReadable may queue again
  for (Conn* c : aheadWork_) {
    c->aheadQueued = false;
    if (!c->paused && !c->closed) handleReadable(*c);
  }
  aheadWork_.clear();  // both keep their capacity: no allocation per round
}

void TcpContext::waitUntilDone(const RequestPtr& req, Deadline deadline) {
  const SpinPhase spin(waitPolicy_);
  LivenessProbe probe(timeout());
  while (!req->done()) {
    const bool polling = spin.polling();
    if (!polling) whileWaiting();
    progress(polling ? 0 : probe.sleepMs(deadline, 1000));
    checkFailed();
    if (req->done()) break;
    if (polling) SpinPhase::relax();
    switch (probe.step(deadline, pongs(req->peer()))) {
      case LivenessProbe::Step::kPing:
        if (Conn* c = peers_[req->peer()]->controlConn()) sendControl(*c, kFramePing);
        break;
      case LivenessProbe::Step::kTimeout: failTimeout(req, probe.peerAlive(), "");
      case LivenessProbe::Step::kWait: break;
    }
  }
}

void TcpContext::reject(uint64_t group, const std::string& why) {
  selfRejected(group);
  try {
    adoptInbound();  // a peer that has connected already hears it
  } catch (const Error&) {
    // Failed: the next op says so.
  }
  auto payload = std::make_shared<const std::vector<char>>(
      why.begin(),
      why.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(why.size(), kMaxErrorPayload)));
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank() || peers_[peer]->closed) continue;
    Conn* c = peers_[peer]->controlConn();
    if (!c) continue;
    try {
      sendFrame(*c,
                FrameHeader{kFrameMagic,
                            kFrameReject,
                            0,
                            group,
                            0,
                            payload->size(),
                            0,
                            payload->size(),
                            {0, 0, 0},
                            {}},
                payload);
    } catch (const Error&) {
      // The peer is gone: its next op with this rank says so.
    }
  }
}

std::vector<Error> TcpContext::awaitReports(Deadline until, int exclude) {
  try {
    checkFailed();  // an abort() from another thread: fail the wire here first
  } catch (const Error&) {
  }
  if (!failed()) return Engine::awaitReports(until, exclude);
  // Read only from now on (nothing more is sent but the report, already
  // out), from every connection, starting with what its read-ahead holds.
  aheadPending_.clear();
  for (auto& p : peers_) {
    for (auto* conns : {&p->conns, &p->sockets}) {
      for (auto& c : *conns) {
        if (!c || c->closed) continue;
        c->paused = false;  // staging limits no longer matter: data is dropped
        c->wantOut = false;
        c->aheadQueued = true;
        aheadPending_.push_back(c.get());
        try {
          updateInterest(*c);
        } catch (const Error&) {
          markGone(*c);
        }
      }
    }
  }
  auto complete = [&] {
    for (int peer = 0; peer < size(); ++peer) {
      // A peer never connected cannot report here: it hears of the
      // failure from the peers it is connected to (docs/errors.md).
      if (peer != rank() && peer != exclude && !reported(peer) && !peers_[peer]->closed &&
          connected(peer)) {
        return false;
      }
    }
    return true;
  };
  while (!complete() && !until.expired())
    drainOnce(static_cast<int>(std::min<int64_t>(until.remainingMs(), 10)));
  return Engine::awaitReports(until, exclude);
}

void TcpContext::drainOnce(int timeoutMs) {
  adoptInbound();
  Poller::Ready events[Poller::kMaxReady];
  std::vector<Conn*> ready;
  for (Conn* c : streams_) {  // read to the end, closed once the peer's sockets are
    if (!c->closed && (c->stream->readable() || peers_[c->peer]->socketsClosed())) {
      ready.push_back(c);
      timeoutMs = 0;
    }
  }
  bool woken = false;
  const size_t n = poller_.wait(aheadPending_.empty() ? timeoutMs : 0, events, &woken);
  for (size_t i = 0; i < n; ++i) ready.push_back(static_cast<Conn*>(events[i].tag));
  ready.insert(ready.end(), aheadPending_.begin(), aheadPending_.end());
  aheadPending_.clear();
  for (Conn* c : ready) {
    c->aheadQueued = false;
    if (c->closed) continue;
    try {
      handleReadable(*c);
    } catch (const Error&) {
      markGone(*c);  // reset, closed mid-frame or garbage: nothing more to read
    }
  }
}

void TcpContext::notifyPeers(const Error& error) {
  std::vector<char> payload = errorReportPayload(error, kMaxErrorPayload - 64);
  // Connections still to come hear it from the accepting thread, those that
  // came in meanwhile below with the rest.
  if (inbound_ && acceptor_) inbound_->refuseWith(reportHeader(payload.size()), payload);
  try {
    adoptInbound();
  } catch (const Error&) {
    // The connections that could not be adopted close.
  }
  report_ = std::move(payload);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    peers_[peer]->pending.clear();  // units no socket took are never sent
    peers_[peer]->pendingBytes = 0;
    sendReport(*peers_[peer], report_);
  }
}

FrameHeader TcpContext::reportHeader(size_t bytes) const {
  return FrameHeader{kFrameMagic, kFrameError, 0, group(), 0, bytes, 0, bytes, {0, 0, 0}, {}};
}

void TcpContext::sendReport(Pair& p, const std::vector<char>& payload) {
  // A stream pair's report goes over its socket (tcp_polled.cc).
  for (auto& cp : p.sockets.empty() ? p.conns : p.sockets) {
    if (!cp || cp->closed) continue;
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
      const FrameHeader h = reportHeader(payload.size());
      net::sendAll(c.sock.fd(), &h, sizeof(h), d);
      net::sendAll(c.sock.fd(), payload.data(), payload.size(), d);
      return;  // one connection per peer is enough
    } catch (const Error&) {
      // Peer gone or not reading: try its next connection, else give up.
    }
  }
}

}  // namespace gflow::transport::tcp
