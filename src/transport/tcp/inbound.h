// The accepting side of the TCP wire's connections (tcp_connect.cc dials):
// each authenticated connection's Hello is checked here, on the acceptor's
// handshake threads, and the good ones wait until the owning thread adopts
// them.
//
// Two ways to connect (TcpContext, GFLOW_CONNECT):
//   - all: at init every rank dials each lower rank and waits until every
//     higher rank has dialled it (wait());
//   - lazy: a pair connects when one of its ranks first needs the other.
//     Either rank may dial. When both dial at once, the higher rank's dial
//     wins: a rank that is dialling a lower peer answers that peer's Hello
//     "crossed" (HelloReply::ok == kCrossed), and the lower rank then waits
//     for the higher one's connection. A rank never dials a peer whose
//     connection it has accepted, so a pair ends up with one set of
//     sockets, whoever started.
//
// What proves each claim of a Hello: the token only (see tcp_connect.cc);
// it must fit this rank's view, and each (rank, socket) slot is taken once.
//
// Thread safety: handshake() on the acceptor's threads; the rest on the
// context's owning thread; hasReady() anywhere.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/handshake_acceptor.h"
#include "common/socket.h"
#include "gflow/error.h"
#include "transport/local/host.h"
#include "transport/tcp/frame.h"

namespace gflow::transport::tcp {

// What a Hello must match: this rank's view of the communicator, and its
// side of the local links.
struct Identity {
  int rank;
  int size;
  int socketsPerPeer;
  uint64_t commId;
  bool lazy;  // connections on demand (GFLOW_CONNECT)
  local::Host& host;
};

// HelloReply::ok: the connection is accepted, refused (the Hello does not
// fit), or crossed (lazy: this higher rank is dialling the lower one).
constexpr uint8_t kRefused = 0;
constexpr uint8_t kAccepted = 1;
constexpr uint8_t kCrossed = 2;

// A connection from a peer: its Hello and its local link (null: none).
struct Accepted {
  Hello hello;
  net::Socket sock;
  std::unique_ptr<local::Link> link;
};

class Inbound {
 public:
  // `onReady`: a peer's connections have all arrived (lazy; any thread).
  Inbound(const Identity& me, std::function<void()> onReady);

  // The acceptor's callback. Throws Error (the acceptor logs it) when the
  // Hello does not fit; the peer is told so first.
  void handshake(net::HandshakeAcceptor::Handshake& h);

  // All: blocks until every higher rank has connected; kTimeout naming the
  // ranks still missing at `deadline`. Every poll (100 ms, doubling to
  // 2 s), `check` may raise the setup failure of a missing rank.
  std::vector<Accepted> wait(const Deadline& deadline, const ErrorContext& ectx,
                             const std::function<void(const std::vector<int>&)>& check);

  // Lazy. startDial: whether this rank dials `peer` now (false: the peer's
  // connection has come or is coming in). endDial: the dial connected, or
  // was crossed (the peer's own dial follows).
  bool startDial(int peer);
  void endDial(int peer, bool connected);
  // The connections of the peers whose sockets have all arrived (each
  // peer's in socket order), taken once.
  std::vector<Accepted> takeReady();
  bool hasReady() const { return ready_.load(std::memory_order_acquire); }
  // Blocks until a peer's connections are ready or `until`.
  void waitReady(const Deadline& until);
  // This rank failed: a peer that connects from now on gets `report` (an
  // ERROR frame, written on the handshake's thread) and the connection
  // closes, so it fails with this rank's report and not at its deadline.
  void refuseWith(const FrameHeader& header, std::vector<char> report);

 private:
  enum class State { kNone, kDialing, kClaimed, kConnected };
  // kAccepted (and the slot taken), kCrossed, or kRefused with *why.
  uint8_t claim(const Hello& h, std::string* why);
  std::string misfit(const Hello& h) const;  // "" when the Hello fits this rank
  // After refuseWith: writes the report on h's socket; true when it did.
  bool tellFailure(net::HandshakeAcceptor::Handshake& h, const Deadline& hd);
  void release(const Hello& h);
  std::vector<int> missingRanks() const;  // mutex_ held

  const Identity me_;
  const std::function<void()> onReady_;
  const size_t expected_;  // all: connections from the higher ranks
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::vector<bool>> seen_;  // [rank][socket]: claimed by a Hello
  std::vector<State> state_;             // [rank]: lazy
  std::vector<int> arrived_;             // [rank]: sockets taken
  std::vector<Accepted> accepted_;       // all: every connection; lazy: until taken
  std::atomic<bool> ready_{false};       // lazy: a peer's sockets are all in accepted_
  FrameHeader reportHeader_{};           // refuseWith
  std::vector<char> report_;
};

}  // namespace gflow::transport::tcp
