// A byte stream between two ranks of one host in shared memory, the
// polled stream of a local link (link.h): a wire carries its frames to a
// local peer through a pair of these instead of its socket, so a frame
// costs a copy in and a copy out and no system call while the receiver
// polls.
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
#include "transport/polled_stream.h"

namespace gflow::transport::local {

class Ring final : public PolledStream {
 public:
  // The segment of one side with a ring of `capacity` bytes (a power of
  // two of at least 4 KiB), zero-filled. Throws Error(kInternal).
  static Mapping create(size_t capacity);
  static size_t segmentBytes(size_t capacity);

  // mine: this side's segment (create(myCapacity)); theirs: the peer's,
  // mapped read-only, of theirCapacity (checked by the caller to be a
  // power of two of at least 4 KiB and the mapping's size).
  Ring(Mapping mine, size_t myCapacity, Mapping theirs, size_t theirCapacity);

  // PolledStream: writes go into this side's ring, reads come out of the
  // peer's; room is woken for once half the peer's ring is free.
  size_t write(const iovec* iov, int count) override;
  size_t read(char* dst, size_t cap) override;
  bool readable() const override;
  bool writable() const override;
  // The peer's words made no sense (set by write, read, readable, writable).
  bool broken() const override { return broken_; }
  bool arm(uint64_t gen, bool wantsRoom, bool wantsData) override;
  void disarm() override;
  bool peerNeedsWake(bool forRoom) override;

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

}  // namespace gflow::transport::local
