// TCP transport: one or more non-blocking sockets per peer, an epoll set
// driven by the waiting thread, eager sends and tag-matched receives.
//
// Matching, staging accounting and failure live in the Engine
// (transport/engine.h); this class is the wire, in pieces:
//   - pair.h: one peer's connections, each with its frame state machine
//     and send queue, and what the pair agreed;
//   - tcp_connect.cc: connecting (listen, publish; dial lower ranks and
//     accept higher ones at init, or a peer when an op first needs it; the
//     hello; a peer of this host may get a local link, local/host.h);
//     inbound.h: the accepting side;
//   - tcp_send.cc: queueing and writing frames, several per sendmsg;
//     striping.h: with several sockets per peer, which socket sends which
//     piece of a message;
//   - tcp_context.cc: receiving and progress; poller.h: the epoll set and
//     its wake-up;
//   - tcp_rendezvous.cc: large messages that wait for their receive, and
//     single copy through a local link;
//   - tcp_polled.cc: a peer whose link has a polled stream talks through it.
// Receives posted before their data arrives are filled in place (zero
// copy). Data that arrives first is staged (bounded by
// GFLOW_UNEXPECTED_LIMIT per peer; past that the socket is not read until a
// receive is posted, which gives back-pressure instead of unbounded memory).
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/handshake_acceptor.h"
#include "transport/engine.h"
#include "transport/local/host.h"
#include "transport/tcp/congestion.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/inbound.h"
#include "transport/tcp/pair.h"
#include "transport/tcp/poller.h"
#include "transport/tcp/striping.h"
#include "transport/wait_policy.h"

namespace gflow::transport::tcp {

class TcpContext final : public Engine, private ByteSource {
 public:
  explicit TcpContext(const ContextOptions& options);
  ~TcpContext() override;

  RequestPtr isend(int peer, const void* data, size_t bytes, Tag tag, const Envelope& env) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, Tag tag, const Envelope& env) override;
  void notifyPeers(const Error& error) override;
  // Reads on after the failure, discarding data, until every peer but
  // `exclude` has sent its report or closed (docs/errors.md, "One verdict").
  std::vector<Error> awaitReports(Deadline until, int exclude) override;
  void reject(uint64_t group, const std::string& why) override;
  void receivesPostedFirst() override { receivesFirstGroup_ = group(); }

  // Tests: payload bytes and DATA frames written to connection `index` of
  // `peer` so far, a send buffer size for one connection (to make it
  // slow), and its socket. Owning thread only.
  using ConnCounters = tcp::ConnCounters;
  ConnCounters connCounters(int peer, int index) const;
  void setSendBufferForTesting(int peer, int index, int bytes);
  int socketForTesting(int peer, int index) const;  // the connection's fd
  // Tests: whether frames to `peer` go through a polled stream (its local
  // link's rings), and the DOORBELL frames this rank has received.
  bool talksThroughStream(int peer) const { return !peers_.at(peer)->sockets.empty(); }
  uint64_t doorbellsReceived() const { return doorbells_; }

 private:
  // Connection setup (tcp_connect.cc). A failure is reported in the store
  // first, so the ranks waiting for this one fail at once with its reason.
  // Connections on demand (transport/connect_mode.h) leave every pair to
  // connectPeer.
  void connectAll(const ContextOptions& options);
  void connectAllOrThrow(const ContextOptions& options);
  Identity identity() const;
  // Dials every connection of `peer`; false: crossed (the peer dials).
  bool dialPeer(int peer, const Deadline& deadline, const ErrorContext& ectx);
  void adopt(Accepted& a);
  void addConnection(int peer, int index, net::Socket sock);
  // On demand: connects `peer` (dials, or waits for its dial) under the
  // op timeout, or fails the context naming it; adoptInbound takes the
  // connections peers have made to this rank (owning thread).
  bool connected(int peer) const { return !peers_[peer]->conns.empty(); }
  void connectPeer(int peer);
  void adoptInbound();

  // Rendezvous (tcp_rendezvous.cc).
  bool readsPeer(int peer) const { return peers_[peer]->readsPeer(); }
  // isend's choice: true when the message is held (RENDEZVOUS sent).
  bool holdSend(int peer, const RequestPtr& req, const FrameHeader& hdr, const char* data);
  bool startRendezvous(Conn& c);  // false: paused (the unexpected limit)
  void readRendezvous(int peer, RecvMsg* m);
  void readDue();  // the single-copy reads irecv left to progress
  void sendClear(int peer, RecvMsg* m);
  bool clearsAhead(int peer, const Tag& tag, uint64_t bytes) const;  // irecv, before a RENDEZVOUS
  bool waitsForReceive(const Tag& tag, uint64_t bytes) const;        // by GFLOW_RENDEZVOUS
  // Whether the peer's CLEAR for `hdr`'s message came (taken); one of
  // another size is a mismatch.
  bool takeClear(int peer, const FrameHeader& hdr);
  void checkCleared(int peer, const FrameHeader& hdr, uint64_t cleared);  // sizes agree
  void handleRead(Conn& c);
  void handleClear(Conn& c);
  // The entry of a DATA or RENDEZVOUS header (c.hdr) after the envelope
  // checks: the matching one (checked against the header), or null for an
  // unexpected one, which may take `charge` more staged bytes; null with
  // c.paused when it may not.
  RecvMsg* matchHeader(Conn& c, uint64_t charge);
  void queueData(Pair& p, const RequestPtr& req, const FrameHeader& hdr, const char* data);

  // Polled streams (tcp_polled.cc). installStream: once its sockets are
  // connected, a peer whose link has a stream talks through it.
  // pollStreams: reads the streams with data and writes to those with room
  // again. armStreams: about to sleep in epoll (false: something to do, do
  // not sleep). A stream connection's reads and writes (fill and flush go
  // there).
  void installStream(int peer);
  void pollStreams();
  bool armStreams();
  void disarmStreams();
  Fill fillStream(Conn& c, char* dst, size_t cap, size_t* got);
  size_t writeStream(Conn& c, const iovec* iov, int count);
  void wakePeer(Conn& c, bool forRoom);
  // A socket of a stream pair failed or closed: it only goes (its EOF or
  // its reset is the stream's EOF, read to the end first).
  void dropSocket(Conn& c);
  // At teardown: frames still queued for a stream (a READ a peer waits
  // for) get a bounded time to go.
  void flushStreamsAtExit();
  // At teardown: each socket shut down for writing and read to its peer's
  // FIN (bounded), so that closing it sends no reset.
  void closeGracefully();

  // Progress.
  // `reads`: also the single-copy reads irecv left (not from inside isend).
  void progress(int timeoutMs, bool reads = true);
  void handleReadable(Conn& c);
  // ByteSource: one read of c's socket or stream (a reset fails the peer).
  Fill fill(Conn& c, char* dst, size_t cap, size_t* got) override;
  // `h` with this rank's arrival stamp for its op (Engine::stampOf).
  FrameHeader stamped(FrameHeader h) const {
    std::memcpy(h.stamp, stampOf(Tag{h.group, h.index}).words, sizeof(h.stamp));
    return h;
  }
  void startFragment(Conn& c);
  void finishFragment(Conn& c);
  void handleErrorFrame(Conn& c);
  // Writes the failure report `payload` on one open connection of `p`.
  void sendReport(Pair& p, const std::vector<char>& payload);
  FrameHeader reportHeader(size_t bytes) const;  // an ERROR frame's, this op's
  // awaitReports' round of reads.
  void drainOnce(int timeoutMs);
  // A connection closed (or, after failing, broken): unwatched; its peer is
  // closed once all its connections are.
  void markGone(Conn& c);
  void handleClosed(Conn& c);
  void handleReset(Conn& c, const std::string& why);  // ECONNRESET, EPOLLERR
  void sendControl(Conn& c, uint16_t type);
  void sendFrame(Conn& c, const FrameHeader& h, std::shared_ptr<const std::vector<char>> payload);
  [[noreturn]] void protocolError(int peer, const std::string& what);
  bool hasPendingWith(int peer) const;
  [[noreturn]] void failLost(int peer, const std::string& what);
  void flush(Conn& c, bool writable = false);
  void updateInterest(Conn& c);
  void completeRecv(int peer, RecvMsg* m);
  void resumePaused(Pair& p);
  void enqueue(Conn& c, SendItem item);
  void advance(Conn& c, size_t written);

  // Engine hooks.
  std::unique_ptr<Message> newMessage() override { return std::make_unique<RecvMsg>(); }
  void failWire(const Error& first) override;
  void wake() override;
  void pollOnce() override { progress(0); }
  void waitUntilDone(const RequestPtr& req, Deadline deadline) override;

  static constexpr size_t kReadAhead = Conn::kReadAhead;

  // Connecting (tcp_connect.cc): on demand for the context's life.
  bool lazy_ = false;
  std::string token_;
  int bufBytes_ = 0;
  std::unique_ptr<CongestionChoice> congestion_;
  std::vector<std::string> addrs_;  // "host:port" of each rank that may be dialled
  std::unique_ptr<Inbound> inbound_;
  std::unique_ptr<net::HandshakeAcceptor> acceptor_;  // stopped first at teardown
  std::vector<char> report_;  // the failure report sent (notifyPeers), for late connections

  Striping striping_;
  WaitPolicy waitPolicy_;
  int socketsPerPeer_ = 1;
  uint64_t commId_ = 0;
  // Single copy: messages of at least this size to a peer that reads this
  // rank's memory (0: never).
  uint64_t singleCopyMin_ = 0;
  uint64_t rendezvousMin_ = 0;  // GFLOW_RENDEZVOUS: larger messages wait for CLEAR (0: never)
  uint64_t receivesFirstGroup_ = ~uint64_t{0};  // receivesPostedFirst: that op's group
  std::unique_ptr<local::Host> host_;           // this rank's side of its local links
  std::vector<Conn*> streams_;                  // the stream connections, for pollStreams
  uint64_t sleepGen_ = 0;                       // armStreams' generation
  uint64_t readBytes_ = 0;                      // read from sockets and streams (fill)
  uint64_t readBytesAtPass_ = 0;                // readBytes_ when progress() last began
  uint32_t quietPolls_ = 0;                     // progress(0) calls that skipped epoll
  uint64_t doorbells_ = 0;                      // DOORBELL frames received
  std::deque<std::pair<int, Tag>> readsDue_;    // irecv's single-copy reads, for progress
  Poller poller_;  // the sockets' epoll set; abort() wakes the waiter through it
  std::vector<std::unique_ptr<Pair>> peers_;
  // Connections left with frames in their read-ahead (handleReadable's
  // bound on rounds): epoll would not report them again, progress() does.
  std::vector<Conn*> aheadPending_;
  std::vector<Conn*> aheadWork_;  // progress()'s copy while it serves them
  std::vector<char> discarded_;   // where dropped payloads are read to
};

}  // namespace gflow::transport::tcp
