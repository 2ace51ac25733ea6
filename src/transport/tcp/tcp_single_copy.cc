// Single copy between the ranks of one host over the TCP wire
// (GFLOW_LOCAL_SINGLE_COPY; frames in frame.h).
//
// A message between two processes of one host otherwise crosses the kernel
// twice (sendmsg into the socket, recv out of it), and once more through
// staging when it arrives before its receive. Here only its header travels:
// the receiver reads the payload straight from the sender's buffer with
// process_vm_readv (common/peer_memory.h) once a receive is posted, into
// that receive, and answers READ, which completes the send. Like a
// rendezvous, the send completes only once the receiver has posted its
// receive (as verbs' large messages, and Gloo's and MPI's large sends, do).
//
// Who may: while connecting (tcp_connect.cc), each side of a pair sends its
// LocalIdentity and says whether it can read the other's: a peer with the
// same host identity that reads the nonce at the given address of the given
// process (so the pid is this rank's, not a reused or invented one). Each
// direction is agreed on its own; messages of at least
// GFLOW_LOCAL_SINGLE_COPY bytes to a peer that reads this rank go this way. Anything else (another
// host, a container or Yama policy that denies the read, GFLOW_SHM=0, a
// buffer the kernel cannot pin) keeps the copying path, so the choice never
// changes what a message delivers. Both frames of a message are checked as
// DATA's headers are (envelope, stale op, size against the posted receive).
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <random>

#include "common/logging.h"
#include "common/peer_memory.h"
#include "transport/tcp/tcp_context.h"

namespace gflow::transport::tcp {

LocalIdentity TcpContext::offerLocal() {
  if (singleCopyMin_ == 0 || hostHash_ == 0) return LocalIdentity{};
  std::random_device rd;
  nonce_ = (uint64_t(rd()) << 32 | rd()) | 1;  // nonzero: never an unset word
  return LocalIdentity{hostHash_, static_cast<uint64_t>(::getpid()),
                       reinterpret_cast<uintptr_t>(&nonce_), nonce_};
}

pid_t readableLocalPeer(const LocalIdentity& mine, const LocalIdentity& theirs, int rank,
                        int peer) {
  if (mine.pid == 0 || theirs.pid == 0 || theirs.hostHash != mine.hostHash) return 0;
  if (theirs.pid > static_cast<uint64_t>(INT_MAX)) return 0;
  std::string why;
  if (!probePeerMemory(static_cast<pid_t>(theirs.pid), theirs.nonceAddr, theirs.nonce, &why)) {
    GFLOW_LOG(DEBUG) << "rank " << rank << ": no single copy from local rank " << peer << " ("
                     << why << ")";
    return 0;
  }
  return static_cast<pid_t>(theirs.pid);
}

void TcpContext::agreeLocal(int peer, pid_t pid, bool readsUs) {
  PeerState& p = *peers_[peer];
  p.pid = pid;
  p.readsUs = readsUs && singleCopyMin_ > 0;
}

bool TcpContext::sendsByRendezvous(const PeerState& p, const void* data, size_t bytes) const {
  return p.readsUs && singleCopyMin_ > 0 && bytes >= singleCopyMin_ &&
         ownBuffersReadable(data, bytes, data, bytes);
}

void TcpContext::sendRendezvous(int peer, const RequestPtr& req, FrameHeader hdr,
                                const void* data) {
  const Tag tag{hdr.group, hdr.index};
  if (!peers_[peer]->unread.emplace(tag, req).second) {
    fail(Error(ErrorCode::kInternal, "two sends posted for one tag",
               ErrorContext().withSeq(tag.group).withRank(rank()).withPeer(peer)));
  }
  hdr.type = kFrameRendezvous;
  hdr.offset = reinterpret_cast<uintptr_t>(data);
  hdr.fragLen = 0;
  Conn* c = controlConn(peer);
  if (!c) failLost(peer, "has closed its connections");
  sendFrame(*c, hdr, nullptr);
}

// A RENDEZVOUS header: read now into the posted receive, or kept (announced)
// until one is posted. False when the unexpected limit pauses the
// connection (the header is handled again once it resumes).
bool TcpContext::startRendezvous(Conn& c) {
  const FrameHeader& h = c.hdr;
  if (peers_[c.peer]->pid == 0) {
    protocolError(c.peer, "a message by single copy, which this rank never offered");
  }
  if (h.msgLen == 0 || h.msgLen > kMaxMessageBytes || h.offset == 0) {
    protocolError(c.peer, "a message by single copy of " + std::to_string(h.msgLen) +
                              " bytes at address " + std::to_string(h.offset));
  }
  Envelope env;
  std::memcpy(env.words, h.env, sizeof(env.words));
  checkEnvelope(c.peer, h.group, env);
  const Tag tag{h.group, h.index};
  auto* m = findAs<RecvMsg>(c.peer, tag);
  if (!m) {
    checkStale(c.peer, h.group, env);
    if (!stagingFits(c.peer, 0)) {
      c.paused = true;
      updateInterest(c);
      return false;
    }
    m = static_cast<RecvMsg*>(announce(c.peer, tag, env, h.msgLen));
    m->remote = h.offset;
    return true;
  }
  checkArrival(c.peer, *m, env, h.msgLen);
  if (!m->req || m->remote || m->claimed.claimed() > 0) {
    protocolError(c.peer, "two messages with one tag");
  }
  m->remote = h.offset;
  readRendezvous(c.peer, m);
  return true;
}

// Reads the announced message `m` into its posted receive, tells the sender
// (READ) and completes the receive.
void TcpContext::readRendezvous(int peer, RecvMsg* m) {
  PeerState& p = *peers_[peer];
  if (p.exited) return;
  const int err = readPeerMemory(p.pid, m->remote, m->user, m->len);
  if (err == ESRCH) {
    // The sender's process is gone. What it sent before, an error report
    // naming another rank above all, is still in its sockets, and their
    // EOF follows: they decide, as for a peer that dies mid-frame
    // (handleClosed fails the receive, which stays posted, as peer_lost).
    p.exited = true;
    return;
  }
  if (err != 0) {
    fail(Error(ErrorCode::kInternal,
               "could not read rank " + std::to_string(peer) + "'s message of " +
                   std::to_string(m->len) +
                   " bytes from its memory (process_vm_readv: " + std::strerror(err) + ")",
               ErrorContext().withSeq(m->tag.group).withRank(rank()).withPeer(peer)));
  }
  Conn* c = controlConn(peer);
  if (!c) failLost(peer, "closed its connections before its message was read");
  sendFrame(*c,
            FrameHeader{kFrameMagic, kFrameRead, 0, m->tag.group, m->tag.index, m->len, 0, 0, {}},
            nullptr);
  completeRecv(peer, m);
}

// READ: the peer has read a message this rank sent by single copy.
void TcpContext::handleRead(Conn& c) {
  const FrameHeader& h = c.hdr;
  auto& unread = peers_[c.peer]->unread;
  auto it = unread.find(Tag{h.group, h.index});
  if (it == unread.end() || it->second->bytes() != h.msgLen) {
    protocolError(c.peer, "a read of a message this rank did not send it by single copy");
  }
  const RequestPtr req = std::move(it->second);
  unread.erase(it);
  countSendDone(c.peer, req->bytes());
  countSingleCopy(c.peer, req->bytes());
  req->complete();
}

}  // namespace gflow::transport::tcp
