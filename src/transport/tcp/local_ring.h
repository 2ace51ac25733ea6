// A byte stream between two ranks of one host in shared memory: the TCP
// wire carries its frames to a local peer through a pair of these instead
// of the socket (tcp_local.cc), so a frame costs a copy in and a copy out
// and no system call while the receiver polls.
//
// Each side owns one segment (memfd, common/shared_segment.h) holding its
// ring toward the peer and its words below; the peer maps it read-only. A
// side writes only its own words: its ring's tail, how far it has read the
// peer's ring (head), and whether it sleeps; it never reads back what it
// wrote there, so whatever is found in the peer's segment is the peer's
// word only. (A peer with the rights this needs could also write into this
// side's memory by other means; what the ring guards against is a peer
// that breaks its own stream.) Words read from the peer are checked (a tail
// that runs ahead of the ring, a head that passes the tail): the ring is
// then broken, which the wire reports as a protocol error naming the peer.
//
// Sleeping: a side that is about to sleep in epoll publishes a generation
// number and then looks at both rings once more; a side that writes data
// (or frees room the sleeper waits for) looks at that number after its own
// store, and when it is set sends one DOORBELL frame over the socket. With
// sequentially consistent stores and loads on both sides, either the
// sleeper sees the new bytes or the writer sees the sleeper.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/shared_segment.h"

namespace gflow::transport::tcp {

class LocalRing {
 public:
  // The segment of one side with a ring of `capacity` bytes (a power of
  // two of at least 4 KiB), zero-filled. Throws Error(kInternal).
  static Mapping create(size_t capacity);
  static size_t segmentBytes(size_t capacity);

  // mine: this side's segment (create(myCapacity)); theirs: the peer's,
  // mapped read-only, of theirCapacity (checked by the caller to be a
  // power of two of at least 4 KiB and the mapping's size).
  LocalRing(Mapping mine, size_t myCapacity, Mapping theirs, size_t theirCapacity);

  // Copies as much of `iov` as fits into this side's ring; returns the
  // bytes taken (0: full, or broken()).
  size_t write(const iovec* iov, int count);
  // Copies at most `cap` bytes of the peer's ring into `dst`; returns the
  // bytes read (0: empty, or broken()).
  size_t read(char* dst, size_t cap);
  bool readable() const;
  bool writable() const;
  // The peer's words made no sense (set by write, read, readable, writable).
  bool broken() const { return broken_; }

  // Sleeping. arm: this side sleeps from now under generation `gen`
  // (nonzero), waiting for data (`wantsData`) and, with `wantsRoom`, for
  // room in its ring; returns false when there is already something to do
  // (then disarm and do not sleep).
  bool arm(uint64_t gen, bool wantsRoom, bool wantsData);
  void disarm();
  // After this side wrote (`forRoom` false) or read (true): whether the
  // peer sleeps waiting for it (for room: once half its ring is free) and
  // has not been woken in this sleep yet.
  bool peerNeedsWake(bool forRoom);

 private:
  struct Words;
  Words* mine() const;
  const Words* theirs() const;

  Mapping mine_, theirs_;
  size_t myCap_, theirCap_;
  char* myData_;
  const char* theirData_;
  uint64_t tail_ = 0;   // bytes written into this side's ring
  uint64_t head_ = 0;   // bytes read from the peer's ring
  uint64_t woken_ = 0;  // the peer's sleep generation this side last woke
  mutable bool broken_ = false;
};

}  // namespace gflow::transport::tcp
