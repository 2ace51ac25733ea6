#include "testing/wake_latency.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace gflow::testing {

int64_t wakeLatencyNs() {
  using Clock = std::chrono::steady_clock;
  constexpr int kSamples = 150;
  const int efd = ::eventfd(0, EFD_NONBLOCK);
  const int ep = ::epoll_create1(0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev);
  std::atomic<int64_t> sentAt{0};
  std::atomic<int> woken{0};
  std::vector<int64_t> lat;
  std::thread sleeper([&] {
    while (woken.load() < kSamples) {
      epoll_event e{};
      if (::epoll_wait(ep, &e, 1, 1000) != 1) continue;
      const int64_t now = Clock::now().time_since_epoch().count();
      uint64_t v = 0;
      if (::read(efd, &v, sizeof(v)) == sizeof(v)) lat.push_back(now - sentAt.load());
      woken.fetch_add(1);
    }
  });
  for (int i = 0; i < kSamples; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    sentAt = Clock::now().time_since_epoch().count();
    const uint64_t one = 1;
    if (::write(efd, &one, sizeof(one)) != sizeof(one)) woken.fetch_add(1);
    while (woken.load() <= i) std::this_thread::yield();
  }
  sleeper.join();
  ::close(ep);
  ::close(efd);
  std::sort(lat.begin(), lat.end());
  return lat.empty() ? 0 : lat[lat.size() * 95 / 100];
}

}  // namespace gflow::testing
