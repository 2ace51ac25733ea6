// How a rank waiting for its data spends the time until it arrives: polling
// (the lowest latency: a sleep and wake-up costs tens of microseconds on a
// VM, more than a small message takes) or sleeping in the kernel (epoll, the
// completion channel), which leaves the core to others.
//
// A waiting rank polls for a budget, then sleeps. Between two polls it calls
// sched_yield(), which hands the core to any thread that is ready to run (a
// peer rank on an oversubscribed host, a data loader, a compiler) and costs
// no more than a system call when none is: pure busy polling measured up to
// 100x slower per op as soon as one other process wanted the core
// (docs/performance.md), while polling with yields beat sleeping even on an
// oversubscribed host. The budget is long while the ranks of this host fit
// the cpus this process may run on, and short when they do not, where a
// rank that waits long is better asleep; GFLOW_SPIN_US (or
// Options::progress.spinUs) fixes it.
#pragma once

#include <chrono>

#include "transport/transport.h"

namespace gflow::transport {

struct WaitPolicy {
  static constexpr std::chrono::microseconds kFitSpin{1000};
  static constexpr std::chrono::microseconds kOversubscribedSpin{100};

  std::chrono::microseconds spin{0};  // poll this long before sleeping

  // For a context with these options: Options::progress.spinUs, else
  // GFLOW_SPIN_US, else kFitSpin when the host's ranks
  // (ContextOptions::ranksOnHost, else `size`) fit the cpus of the calling
  // thread's affinity mask, else kOversubscribedSpin.
  static WaitPolicy choose(const ContextOptions& options);
};

// One wait's polling phase: polling() until the budget is used up; relax()
// between two polls.
class SpinPhase {
 public:
  explicit SpinPhase(const WaitPolicy& p) : end_(std::chrono::steady_clock::now() + p.spin) {}
  bool polling() const { return std::chrono::steady_clock::now() < end_; }
  static void relax();

 private:
  std::chrono::steady_clock::time_point end_;
};

}  // namespace gflow::transport
