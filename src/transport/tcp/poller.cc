#include "transport/tcp/poller.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/check.h"

namespace gflow::transport::tcp {

Poller::Poller() {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  GFLOW_SYSCHECK(ep, "epoll_create1");
  epoll_ = net::Socket(ep);
  const int ev = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  GFLOW_SYSCHECK(ev, "eventfd");
  wake_ = net::Socket(ev);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.ptr = nullptr;  // the wake-up's tag
  GFLOW_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, wake_.fd(), &e), "epoll_ctl(eventfd)");
}

void Poller::add(int fd, void* tag, uint32_t events) {
  epoll_event e{};
  e.events = events;
  e.data.ptr = tag;
  GFLOW_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, fd, &e), "epoll_ctl(add)");
}

void Poller::modify(int fd, void* tag, uint32_t events) {
  epoll_event e{};
  e.events = events;
  e.data.ptr = tag;
  GFLOW_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, fd, &e), "epoll_ctl(mod)");
}

void Poller::remove(int fd) noexcept {
  epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, fd, nullptr);
}

void Poller::wake() noexcept {
  uint64_t one = 1;
  ssize_t rc = ::write(wake_.fd(), &one, sizeof(one));
  (void)rc;  // the counter cannot overflow in practice
}

size_t Poller::wait(int timeoutMs, Ready* out, bool* woken) {
  epoll_event events[kMaxReady];
  *woken = false;
  const int n = epoll_wait(epoll_.fd(), events, static_cast<int>(kMaxReady), timeoutMs);
  if (n < 0) {
    if (errno == EINTR) return 0;
    GFLOW_SYSCHECK(n, "epoll_wait");
  }
  size_t ready = 0;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.ptr == nullptr) {
      uint64_t v;
      ssize_t rc = ::read(wake_.fd(), &v, sizeof(v));
      (void)rc;
      *woken = true;
      continue;
    }
    out[ready++] = Ready{events[i].data.ptr, events[i].events};
  }
  return ready;
}

}  // namespace gflow::transport::tcp
