// One long-lived thread that runs one phase at a time for its owner: the
// hierarchical allreduce hands it the cross-host phase of each segment
// while its own thread runs the local phases of the neighbouring segments.
// The thread starts with the first phase, on the owner's thread, so it
// inherits that thread's cpus and nice level (the progress thread's, as
// the per-segment threads it replaces did), and ends with the object.
//
// Thread safety: start(), wait() and pending() come from the owner's one
// thread; start() needs the previous phase waited for.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace gflow::backend {

class PhaseWorker {
 public:
  PhaseWorker() = default;
  ~PhaseWorker();
  PhaseWorker(const PhaseWorker&) = delete;
  PhaseWorker& operator=(const PhaseWorker&) = delete;

  // Runs `phase` on the worker thread.
  void start(std::function<void()> phase);
  // Until the phase started last has run; rethrows what it threw. Returns at
  // once when none is pending.
  void wait();
  // A phase was started and not yet waited for.
  bool pending() const { return pending_; }

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> phase_;  // guarded by mutex_; set: to run
  bool done_ = false;            // guarded by mutex_: phase_ has run
  bool stop_ = false;            // guarded by mutex_
  std::exception_ptr error_;     // guarded by mutex_: what the phase threw
  bool pending_ = false;         // the owner's: started, not waited for
  std::thread thread_;
};

}  // namespace gflow::backend
