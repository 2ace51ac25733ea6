// Striping on the TCP wire: how a message to a peer with several sockets
// (GFLOW_SOCKETS_PER_PEER > 1) is cut, and which socket sends each piece.
//
// Bytes go to a peer's sockets by measured progress, not in equal shares. A
// message is cut into units (messages below GFLOW_STRIPE_MIN whole; larger
// ones in pieces of GFLOW_STRIPE_CHUNK, 4 KiB multiples, at most an even
// share) kept in the peer's pending list (Pair::pending). A socket with an
// empty send queue takes the next unit while the kernel keeps accepting
// its writes; once refused, it waits for EPOLLOUT. With TCP_NOTSENT_LOWAT
// set, the kernel refuses as soon as a little is unsent, so a socket takes
// more only as fast as it sends: with flows of unequal speed a peer gets
// about the sum of their rates instead of (number of flows) x (slowest).
// The bytes a backlogged socket moves per wait give its rate (an estimate,
// so it counts only at a factor of two): a socket leaves the tail of a
// burst to a busy one twice as fast that would send all of it before the
// slow one sent its single unit, and a socket faster than 256 MB/s keeps a
// larger unsent backlog and takes several units per frame (at most an even
// share of the message, as does a socket the kernel never refused). Equal
// flows take equal shares. GFLOW_STRIPE_CHUNK=0 restores the equal, up-front
// split. One socket per peer (the default) takes none of this: a message is
// one frame queued on the socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/tcp/pair.h"

namespace gflow::transport::tcp {

class Striping {
 public:
  // minBytes: GFLOW_STRIPE_MIN; chunkBytes: GFLOW_STRIPE_CHUNK (0: equal split).
  Striping(uint64_t minBytes, uint64_t chunkBytes) : min_(minBytes), chunk_(chunkBytes) {}

  // Whether `p`'s messages go by progress (several sockets, a chunk set).
  bool byProgress(const Pair& p) const { return p.conns.size() > 1 && chunk_ > 0; }
  // A new socket of a peer with `sockets` sockets: keeps the kernel's
  // unsent backlog short when assignment is by progress.
  void prepare(Conn& c, int sockets) const;

  // The equal split: one fragment per socket (one socket: the whole
  // message, one frame). split() cuts `msg` (its fragment count set) and
  // takes the peer's next first socket; fragment() is the f-th frame, to be
  // queued on p.conns[(first + f) % p.conns.size()].
  struct EvenSplit {
    int frags;
    uint64_t per;  // bytes per fragment (the last one takes the rest)
    size_t first;  // the socket of fragment 0
  };
  EvenSplit split(Pair& p, SendMsg& msg, uint64_t bytes) const;
  static SendItem fragment(const EvenSplit& s, const std::shared_ptr<SendMsg>& msg,
                           const FrameHeader& hdr, const char* base, int f);
  // By progress: the message joins `p`'s pending list in units.
  void queue(Pair& p, const std::shared_ptr<SendMsg>& msg, const FrameHeader& hdr,
             const char* base) const;
  // A socket of `p` that is idle, known writable and worth the next unit,
  // the fastest first; null when none is.
  Conn* idleTaker(Pair& p) const;
  // Whether `c` should take `p`'s next pending unit now.
  bool worthTaking(const Pair& p, const Conn& c) const;
  // Moves `p`'s next unit(s) onto `c`'s send queue, as one frame.
  void refill(Pair& p, Conn& c) const;
  // After a flush of `c` that wrote `burst` bytes and was refused by the
  // kernel (`blocked`) or not; `writable`: it ran for an EPOLLOUT event.
  void noteProgress(Conn& c, bool blocked, size_t burst, bool writable) const;

  // Unsent bytes a socket of a peer with several may hold in the kernel
  // (TCP_NOTSENT_LOWAT; epoll reports it writable below half of this), at
  // first and at most.
  static constexpr int kNotsentLowat = 64 << 10;
  static constexpr int kMaxNotsentLowat = 4 << 20;
  // Units a fast socket may take as one frame.
  static constexpr uint64_t kMaxBatch = 16;

 private:
  static void tuneNotsent(Conn& c);

  uint64_t min_;
  uint64_t chunk_;
};

}  // namespace gflow::transport::tcp
