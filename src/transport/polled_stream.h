// A byte stream to one peer that a wire polls instead of waiting on a file
// descriptor: the wire reads and writes it from its progress loop, and
// before it sleeps (in epoll, say) it arms the stream, so that a peer that
// writes to a sleeper, or frees room it waits for, knows to wake it by
// other means (TCP sends a DOORBELL frame over the pair's socket).
//
// The wire chooses it per peer while connecting; local/link.h offers the
// one between two ranks of one host (shared-memory rings). Its bytes are
// the wire's own frames: nothing above the byte stream changes with it.
//
// Nothing here throws; broken() says that the peer's side of the stream
// made no sense (the wire then fails the pair naming the peer).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace gflow::transport {

class PolledStream {
 public:
  virtual ~PolledStream() = default;

  // Copies as much of `iov` as fits; returns the bytes taken (0: no room,
  // or broken()).
  virtual size_t write(const iovec* iov, int count) = 0;
  // Copies at most `cap` bytes into `dst`; returns the bytes read (0:
  // nothing there, or broken()).
  virtual size_t read(char* dst, size_t cap) = 0;
  virtual bool readable() const = 0;
  virtual bool writable() const = 0;
  virtual bool broken() const = 0;

  // Sleeping. arm: this side sleeps from now under generation `gen`
  // (nonzero), waiting for data (`wantsData`) and, with `wantsRoom`, for
  // room; false when there is something to do already (then disarm and do
  // not sleep).
  virtual bool arm(uint64_t gen, bool wantsRoom, bool wantsData) = 0;
  virtual void disarm() = 0;
  // After this side wrote (`forRoom` false) or read (true): whether the
  // peer sleeps waiting for it and has not been woken in this sleep yet.
  virtual bool peerNeedsWake(bool forRoom) = 0;
};

}  // namespace gflow::transport
