// LivenessProbe: the one blame policy of the network transports for a wait
// whose deadline has passed.
//
// A rank that times out waiting on a peer must say who is stuck. Once the
// deadline passes the waiter PINGs the peer; a peer whose software is inside
// gflow answers PONG. No answer within `grace` (a quarter of the context
// timeout, clamped to [50 ms, 2 s]): the peer is blamed as not responding.
// An answer: the peer is alive but waits itself, so the waiter keeps waiting
// (in steps of 2 x grace, until 3 x grace past the deadline) to give the rank
// that really waits on the stalled one the time to report it first; then it
// times out saying the peer is alive.
//
// One probe per wait; used by the waiting thread only (not thread-safe). The
// network transports PING by a frame; shared-memory groups by a counter in
// the member's memory (backend/shm/group.h).
#pragma once

#include <chrono>
#include <cstdint>

#include "common/deadline.h"

namespace gflow::transport {

class LivenessProbe {
 public:
  enum class Step {
    kWait,     // keep driving progress
    kPing,     // send a PING to the peer now
    kTimeout,  // fail the wait; peerAlive() says what the probe learnt
  };

  explicit LivenessProbe(std::chrono::milliseconds contextTimeout);

  // Called each time the wait loop wakes. `pongs`: PONGs received from the
  // peer so far (a counter that only grows).
  Step step(const Deadline& deadline, uint64_t pongs);

  // How long the wait loop may block, in ms: until the deadline or the end
  // of the probe's current grace period, at most `capMs` and at most half a
  // grace, so the hook of a companion transport (Context::setWhileWaiting)
  // answers its probes in time.
  int sleepMs(const Deadline& deadline, int capMs) const;

  // Valid after step() returned kTimeout: the peer answered the PING.
  bool peerAlive() const { return alive_; }

 private:
  std::chrono::milliseconds grace_;
  bool probing_ = false;
  bool alive_ = false;
  uint64_t pongsBefore_ = 0;
  Deadline end_ = Deadline::never();
};

}  // namespace gflow::transport
