// The host lane: a communicator's second thread, for the host-side steps
// of its compressed allreduces (narrowing the float32 data into the wire
// type before the collective, scanning and widening it after), so that
// they run while the executor's thread has another op's bytes on the wire.
// Without it each bucket's narrowing and widening ran in series with the
// collectives, on the executor's thread, and the link idled meanwhile
// (docs/performance.md, "The host lane: the hooks' codec beside the wire").
//
// Memory order between ops stays the order they were issued in: each job
// names the user memory it reads or writes (its Footprint), and the
// executor runs an op only after every lane job that overlaps the op's
// memory has ended (an op that names none waits for all of them); see
// Executor. Jobs run one at a time in the order posted.
//
// Thread safety: every method may be called from any thread. Lock order:
// the executor's mutex before the lane's, never the reverse; jobs run
// without the lane's lock.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gflow {

// The user memory an op's host steps and collective read or write.
struct MemoryRange {
  const void* at = nullptr;
  size_t bytes = 0;
};
using Footprint = std::vector<MemoryRange>;
bool overlaps(const Footprint& a, const Footprint& b);

// A step that runs once, on whichever thread asks first: run() runs it, or
// waits for the run another thread started, and rethrows its exception.
class OnceStep {
 public:
  explicit OnceStep(std::function<void()> fn) : fn_(std::move(fn)) {}
  void run();
  // The lane's entry: runs it unless it started already; never throws (the
  // exception waits for run()).
  void runQuietly() noexcept;
  // After the op: a step never started never will; a started one is waited
  // for. Never throws.
  void settle() noexcept;

 private:
  enum class State { kIdle, kRunning, kDone };
  bool claim();  // idle -> running, under the lock; false if not idle
  void execute() noexcept;
  std::function<void()> fn_;
  std::mutex mutex_;
  std::condition_variable cv_;
  State state_ = State::kIdle;
  std::exception_ptr error_;
};

class HostLane {
 public:
  HostLane() = default;
  // Runs what is queued, then stops the thread.
  ~HostLane();
  HostLane(const HostLane&) = delete;
  HostLane& operator=(const HostLane&) = delete;

  // Queues `job` (which must not throw) after those posted before it; the
  // thread starts on first need. Where no thread can be started, runs `job`
  // on the caller before returning (the lane is then empty: earlier jobs
  // had a thread).
  void post(Footprint touches, std::function<void()> job);
  // Runs on the lane's thread before its first job (the executor's pinning
  // and priority); set before the first post to take effect.
  void setThreadSetup(std::function<void()> setup);
  // Returns once no queued or running job overlaps `f`.
  void waitFor(const Footprint& f);
  // Returns once every job posted so far has ended.
  void drain();

 private:
  struct Job {
    uint64_t seq;
    Footprint touches;
    std::function<void()> fn;
  };
  void loop();
  void waitUntil(std::unique_lock<std::mutex>& lock, uint64_t seq);

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;  // the running job stays at the front
  uint64_t posted_ = 0;    // the last job's seq
  uint64_t ended_ = 0;     // every job up to this seq has ended
  bool stop_ = false;
  std::function<void()> setup_;
  std::thread thread_;
};

}  // namespace gflow
