// The TCP wire's state for one peer (as Gloo's tcp/pair): its connections,
// each with its socket (or the polled stream of a local link, local/link.h)
// and its frame state machine, the sends queued or held for the peer, and
// what the pair agreed while connecting.
//
// A connection reads frames in two states: the 96-byte header (frame.h),
// then the fragment's payload. Headers and small payloads come out of the
// socket through a 16 KiB read-ahead, so a small message costs one recv;
// large payloads are read straight into their destination. On the send
// side each connection keeps a queue of frames, written several per
// sendmsg; with several sockets per peer, striping.h decides which socket
// sends which piece of a message.
//
// Owned and used by the context's owning thread only (TcpContext).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/socket.h"
#include "transport/byte_ranges.h"
#include "transport/engine.h"
#include "transport/local/link.h"
#include "transport/polled_stream.h"
#include "transport/tcp/frame.h"

namespace gflow::transport::tcp {

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

// One frame on a connection's send queue.
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
// units of `unit` bytes, each taken by a socket that has drained
// (striping.h).
struct Pending {
  std::shared_ptr<SendMsg> msg;
  FrameHeader hdr;  // template: offset and fragLen set per unit
  const char* base = nullptr;
  uint64_t next = 0;
  uint64_t end = 0;
  uint64_t unit = 0;
  uint64_t share = 0;  // an even share of the peer's sockets: the most one takes
};

struct Conn;

// What a read of a connection's socket or stream gave.
enum class Fill { kData, kWouldBlock, kClosed };

// Where a connection's bytes come from: the wire's read of its socket or
// stream (TcpContext::fill), which raises a reset itself.
class ByteSource {
 public:
  virtual Fill fill(Conn& c, char* dst, size_t cap, size_t* got) = 0;

 protected:
  ~ByteSource() = default;
};

// Payload bytes and DATA frames written to one connection so far (tests).
struct ConnCounters {
  uint64_t payloadBytes = 0;
  uint64_t frames = 0;
};

struct Conn {
  // A connection's read-ahead buffer (socket and stream connections alike).
  static constexpr size_t kReadAhead = 16 << 10;

  net::Socket sock;
  // A peer whose link carries its frames: they go through the link's
  // polled stream instead (tcp_polled.cc), not in epoll, polled by
  // progress(); its sockets (Pair::sockets) carry only DOORBELL frames,
  // failure reports and the EOF.
  std::unique_ptr<PolledStream> stream;
  bool doorbellOnly = false;  // a socket of a pair with a stream (Pair::sockets)
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
  bool aheadQueued = false;  // in the context's list of connections with read-ahead left
  ConnCounters sent;
  // Several sockets per peer (striping.h):
  bool ready = true;  // not refused by the kernel since the last EPOLLOUT
  double rate = 0;    // bytes/s while backlogged (EWMA); 0: not measured
  std::chrono::steady_clock::time_point blockedAt;  // last refused; {}: idle since
  int notsentLowat = 0;                             // TCP_NOTSENT_LOWAT in force; 0: none

  Conn(int peer, int index) : peer(peer), index(index), ahead(new char[kReadAhead]) {}
  bool hasAhead() const { return aheadPos < aheadLen; }
  // Copies at most `n` read-ahead bytes to `dst`; returns how many.
  size_t takeAhead(char* dst, size_t n);

  // The frame state machine's two reads. kDone: the header is whole, or
  // the payload is in place (dropped when `discard`, into `scratch`);
  // kClosed: the source reached EOF (the caller decides what that means).
  enum class Read { kDone, kWouldBlock, kClosed };
  Read readHeader(ByteSource& source);
  Read readPayload(ByteSource& source, std::vector<char>& scratch);
  // SO_RCVLOWAT for what is being read (sockets only).
  void tuneLowat();
  // Bytes of queued frames not written yet.
  uint64_t backlog() const;
};

// A send held by rendezvous: its DATA header and payload, which go out on
// CLEAR, or wait for READ (single copy).
struct Held {
  RequestPtr req;
  FrameHeader hdr;
  const char* data = nullptr;
  bool single = false;
  uint16_t ticket = 0;  // single: its ticket (local::Host::lend)
};

struct Pair {
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

  bool readsPeer() const { return link && link->readsPeer(); }
  // A connection still open, for control frames; null when none is.
  Conn* controlConn();
  // Whether every socket of a stream pair has closed.
  bool socketsClosed() const;
  // Whether any sends are queued, pending or held for the peer.
  bool sending() const;
  // The peer is closed once all its connections are (with several, the
  // others may still carry data it sent before exiting).
  void updateClosed();
};

}  // namespace gflow::transport::tcp
