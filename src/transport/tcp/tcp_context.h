// TCP transport: one or more non-blocking sockets per peer, an epoll set
// driven by the waiting thread, eager sends and tag-matched receives.
//
// Reads go through a small per-connection read-ahead buffer, so a small
// message costs one recv, and a recv that comes back short is not followed
// by one that would block: level-triggered epoll reports the socket again.
//
// Matching, staging accounting and failure live in the Engine
// (transport/engine.h); this class is the wire: setup in tcp_connect.cc,
// the send side (queueing, striping, sendmsg) in tcp_send.cc, receiving and
// progress in tcp_context.cc, the epoll set and its wake-up in poller.h. Receives posted before
// their data arrives are filled in place (zero copy). Data that arrives first is staged (bounded by
// GFLOW_UNEXPECTED_LIMIT per peer; past that the socket is not read until a receive is posted,
// which gives back-pressure instead of unbounded memory).
//
// Several sockets per peer (GFLOW_SOCKETS_PER_PEER > 1): bytes go to a
// peer's sockets by measured progress, not in equal shares. A message is
// cut into units (messages below GFLOW_STRIPE_MIN whole; larger ones in
// pieces of GFLOW_STRIPE_CHUNK, 4 KiB multiples, at most an even share)
// kept in the peer's pending list. A socket with an empty send queue takes
// the next unit while the kernel keeps accepting its writes; once refused,
// it waits for EPOLLOUT. With TCP_NOTSENT_LOWAT set, the kernel refuses as
// soon as a little is unsent, so a socket takes more only as fast as it
// sends: with flows of unequal speed a peer gets about the sum of their
// rates instead of (number of flows) x (slowest). The bytes a backlogged
// socket moves per wait give its rate (an estimate, so it counts only at
// a factor of two): a socket leaves the tail of a burst to a busy one twice
// as fast that would send all of it before the slow one sent its single
// unit, and a socket faster than 256 MB/s keeps a larger unsent backlog and
// takes several units per frame (at most an even share of the message, as
// does a socket the kernel never refused). Equal flows take equal shares.
// GFLOW_STRIPE_CHUNK=0 restores the equal, up-front split. One socket per
// peer (the default) takes none of this path: a message is one frame
// queued on the socket, as before.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/socket.h"
#include "transport/byte_ranges.h"
#include "transport/engine.h"
#include "transport/local/host.h"
#include "transport/polled_stream.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/poller.h"
#include "transport/wait_policy.h"

namespace gflow::transport::tcp {

class TcpContext final : public Engine {
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
  struct ConnCounters {
    uint64_t payloadBytes = 0;
    uint64_t frames = 0;
  };
  ConnCounters connCounters(int peer, int index) const;
  void setSendBufferForTesting(int peer, int index, int bytes);
  int socketForTesting(int peer, int index) const;  // the connection's fd
  // Tests: whether frames to `peer` go through a polled stream (its local
  // link's rings), and the DOORBELL frames this rank has received.
  bool talksThroughStream(int peer) const { return !peers_.at(peer)->sockets.empty(); }
  uint64_t doorbellsReceived() const { return doorbells_; }

 private:
  // One message being received: posted by irecv, or announced by the first
  // fragment header to arrive, or both.
  struct RecvMsg : Message {
    ByteRanges claimed;      // payload ranges announced by fragment headers
    uint64_t received = 0;   // payload bytes read
    char* buf = nullptr;     // where fragments land (user buffer or staging)
    uint64_t remote = 0;     // RENDEZVOUS: the payload's address in the sender
    uint16_t ticket = 0;     // ... and its ticket there
    bool announced = false;  // RENDEZVOUS over the wire: DATA follows our CLEAR
    bool cleared = false;    // CLEAR sent
    bool released = false;   // its DATA came on our CLEAR (kReleased)
  };

  struct SendMsg {
    RequestPtr req;
    uint64_t fragmentsLeft = 0;  // units (by progress) or fragments (equal split) not written
  };

  struct SendItem {
    std::shared_ptr<SendMsg> msg;
    FrameHeader hdr;
    const char* payload = nullptr;
    size_t payloadLen = 0;
    std::shared_ptr<const std::vector<char>> owned;  // a control frame's payload
    size_t written = 0;                              // bytes of header + payload written so far
    uint64_t units = 1;                              // fragments of msg this frame accounts for
  };

  // The not yet assigned rest [next, end) of a message sent by progress, in
  // units of `unit` bytes, each taken by a socket that has drained.
  struct Pending {
    std::shared_ptr<SendMsg> msg;
    FrameHeader hdr;  // template: offset and fragLen set per unit
    const char* base = nullptr;
    uint64_t next = 0;
    uint64_t end = 0;
    uint64_t unit = 0;
    uint64_t share = 0;  // an even share of the peer's sockets: the most one takes
  };

  enum class Fill { kData, kWouldBlock, kClosed };

  struct Conn {
    net::Socket sock;
    // A peer whose link carries its frames: they go through the link's
    // polled stream instead (tcp_polled.cc), not in epoll, polled by
    // progress(); its sockets (PeerState::sockets) carry only DOORBELL
    // frames, failure reports and the EOF.
    std::unique_ptr<PolledStream> stream;
    bool doorbellOnly = false;  // a socket of a pair with a stream (PeerState::sockets)
    int peer = -1;
    int index = 0;
    std::deque<SendItem> sendq;
    bool wantOut = false;
    bool paused = false;
    bool closed = false;  // the peer closed this connection (EOF)
    int lowat = 1;        // current SO_RCVLOWAT
    bool pongQueued = false;
    bool watched = true;  // registered with epoll (a paused, hung-up socket is not)
    // Receive state machine: header bytes, then the fragment payload.
    bool inPayload = false;
    FrameHeader hdr{};
    size_t hdrGot = 0;
    RecvMsg* cur = nullptr;
    char* dst = nullptr;
    uint64_t left = 0;
    std::vector<char> ctrl;  // ERROR frame payload
    bool discard = false;    // the payload is read and dropped (after failing)
    // Read-ahead: headers and small payloads come out of the socket with
    // one recv; large payloads are read straight into their destination.
    std::unique_ptr<char[]> ahead;
    size_t aheadPos = 0, aheadLen = 0;
    bool drained = false;      // the last recv came back short: wait for epoll
    bool aheadQueued = false;  // in aheadPending_
    ConnCounters sent;
    // Several sockets per peer (assignment by progress, see flush):
    bool ready = true;  // not refused by the kernel since the last EPOLLOUT
    double rate = 0;    // bytes/s while backlogged (EWMA); 0: not measured
    std::chrono::steady_clock::time_point blockedAt;  // last refused; {}: idle since
    int notsentLowat = 0;  // TCP_NOTSENT_LOWAT in force (tuneNotsent); 0: none
  };

  // A send held by rendezvous: its DATA header and payload, which go out
  // on CLEAR, or wait for READ (single copy).
  struct Held {
    RequestPtr req;
    FrameHeader hdr;
    const char* data = nullptr;
    bool single = false;
    uint16_t ticket = 0;  // single: its ticket (local::Host::lend)
  };

  struct PeerState {
    std::vector<std::unique_ptr<Conn>> conns;
    size_t nextConn = 0;
    bool closed = false;          // every connection of this peer saw EOF
    std::deque<Pending> pending;  // FIFO; empty with one socket or equal split
    uint64_t pendingBytes = 0;    // payload bytes in `pending` not yet taken
    // What a peer of this host agreed while connecting (local/link.h):
    // single copy either way, and a polled stream; null for any other.
    std::unique_ptr<local::Link> link;
    // Rendezvous (tcp_rendezvous.cc): the sends held until the peer clears
    // or reads them, and the CLEARs that came before their send.
    std::unordered_map<Tag, Held, TagHash> held;
    std::unordered_map<Tag, uint64_t, TagHash> clears;  // the size each names
    // Messages received on a CLEAR before their RENDEZVOUS came (another
    // connection): the RENDEZVOUS, when it comes, is dropped.
    std::unordered_set<Tag, TagHash> crossed;
    // A link's polled stream (tcp_polled.cc) is the one connection in
    // `conns`; the TCP connections move to `sockets`.
    std::vector<std::unique_ptr<Conn>> sockets;
  };

  // Connection setup (tcp_connect.cc). A failure is reported in the store
  // first, so the ranks waiting for this one fail at once with its reason.
  void connectAll(const ContextOptions& options);
  void connectAllOrThrow(const ContextOptions& options);
  void addConnection(int peer, int index, net::Socket sock);

  // Rendezvous (tcp_rendezvous.cc).
  bool readsPeer(int peer) const { return peers_[peer]->link && peers_[peer]->link->readsPeer(); }
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
  void queueData(PeerState& p, const RequestPtr& req, const FrameHeader& hdr, const char* data);

  // Polled streams (tcp_polled.cc). installStreams: once every socket is
  // connected, a peer whose link has a stream talks through it.
  // pollStreams: reads the streams with data and writes to those with room
  // again. armStreams: about to sleep in epoll (false: something to do, do
  // not sleep). A stream connection's reads and writes (fill and flush go
  // there).
  void installStreams();
  void pollStreams();
  bool armStreams();
  void disarmStreams();
  Fill fillStream(Conn& c, char* dst, size_t cap, size_t* got);
  size_t writeStream(Conn& c, const iovec* iov, int count);
  void wakePeer(Conn& c, bool forRoom);
  bool socketsClosed(const PeerState& p) const;
  // A socket of a stream pair failed or closed: it only goes (its EOF or
  // its reset is the stream's EOF, read to the end first).
  void dropSocket(Conn& c);
  // At teardown: frames still queued for a stream (a READ a peer waits
  // for) get a bounded time to go.
  void flushStreamsAtExit();

  // Progress.
  // `reads`: also the single-copy reads irecv left (not from inside isend).
  void progress(int timeoutMs, bool reads = true);
  void handleReadable(Conn& c);
  bool readHeader(Conn& c);   // false: would block
  bool readPayload(Conn& c);  // false: would block
  Fill fill(Conn& c, char* dst, size_t cap, size_t* got);
  // `h` with this rank's arrival stamp for its op (Engine::stampOf).
  FrameHeader stamped(FrameHeader h) const {
    std::memcpy(h.stamp, stampOf(Tag{h.group, h.index}).words, sizeof(h.stamp));
    return h;
  }
  size_t takeAhead(Conn& c, char* dst, size_t n);
  void startFragment(Conn& c);
  void finishFragment(Conn& c);
  void handleErrorFrame(Conn& c);
  // awaitReports' round of reads.
  void drainOnce(int timeoutMs);
  // A connection closed (or, after failing, broken): unwatched; its peer is
  // closed once all its connections are.
  void markGone(Conn& c);
  void handleClosed(Conn& c);
  void tuneLowat(Conn& c);
  void sendControl(Conn& c, uint16_t type);
  void sendFrame(Conn& c, const FrameHeader& h, std::shared_ptr<const std::vector<char>> payload);
  Conn* controlConn(int peer);  // a connection to `peer` still open, or null
  [[noreturn]] void protocolError(int peer, const std::string& what);
  bool hasPendingWith(int peer) const;
  [[noreturn]] void failLost(int peer, const std::string& what);
  void flush(Conn& c, bool writable = false);
  void updateInterest(Conn& c);
  void completeRecv(int peer, RecvMsg* m);
  void resumePaused(PeerState& p);
  void enqueue(Conn& c, SendItem item);
  void splitEvenly(PeerState& p, const std::shared_ptr<SendMsg>& msg, const FrameHeader& hdr,
                   const char* base);
  void queueByProgress(PeerState& p, const std::shared_ptr<SendMsg>& msg, const FrameHeader& hdr,
                       const char* base);
  void refill(Conn& c);
  void advance(Conn& c, size_t written);
  bool worthTaking(const Conn& c) const;
  void noteProgress(Conn& c, bool blocked, size_t burst, bool writable);
  void tuneNotsent(Conn& c);
  static bool faster(const Conn& a, const Conn& b);

  // Engine hooks.
  std::unique_ptr<Message> newMessage() override { return std::make_unique<RecvMsg>(); }
  void failWire(const Error& first) override;
  void wake() override;
  void pollOnce() override { progress(0); }
  void waitUntilDone(const RequestPtr& req, Deadline deadline) override;

  // A connection's read-ahead buffer (socket and stream connections alike).
  static constexpr size_t kReadAhead = 16 << 10;

  uint64_t stripeMin_;
  // Unsent bytes a socket of a peer with several may hold in the kernel
  // (TCP_NOTSENT_LOWAT; epoll reports it writable below half of this), at
  // first and at most (tuneNotsent).
  static constexpr int kNotsentLowat = 64 << 10;
  static constexpr int kMaxNotsentLowat = 4 << 20;
  // Units a fast socket may take as one frame.
  static constexpr uint64_t kMaxBatch = 16;

  WaitPolicy waitPolicy_;
  uint64_t stripeChunk_;  // 0: equal split assigned up front
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
  std::vector<std::unique_ptr<PeerState>> peers_;
  // Connections left with frames in their read-ahead (handleReadable's
  // bound on rounds): epoll would not report them again, progress() does.
  std::vector<Conn*> aheadPending_;
  std::vector<Conn*> aheadWork_;  // progress()'s copy while it serves them
  std::vector<char> discarded_;   // where dropped payloads are read to
};

}  // namespace gflow::transport::tcp
