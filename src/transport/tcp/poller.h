// Poller: the epoll set a TCP context's waiting thread sleeps in, and the
// eventfd that wakes it from another thread (abort()). Connections register
// with a tag (the context's Conn); wait() hands back the ready ones and
// says whether a wake-up came, having consumed it. Owning thread, except
// wake().
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/socket.h"

namespace gflow::transport::tcp {

class Poller {
 public:
  // Throws gflow::Error when the kernel refuses the epoll set or the eventfd.
  Poller();

  // Watches `fd` for `events` (EPOLLIN, EPOLLOUT), reported with `tag`
  // (not null). Throw on failure.
  void add(int fd, void* tag, uint32_t events);
  void modify(int fd, void* tag, uint32_t events);
  // Stops watching `fd` (a closed or hung-up socket); nothing to report.
  void remove(int fd) noexcept;
  // Any thread: the waiter returns from wait() now or at its next call.
  void wake() noexcept;

  struct Ready {
    void* tag;
    uint32_t events;
  };
  static constexpr size_t kMaxReady = 64;
  // Waits up to `timeoutMs` (0: a look) for ready connections: writes at
  // most kMaxReady to `out` and returns how many; `woken`: a wake() came.
  // An interrupted wait (EINTR) returns none.
  size_t wait(int timeoutMs, Ready* out, bool* woken);

 private:
  net::Socket epoll_;
  net::Socket wake_;
};

}  // namespace gflow::transport::tcp
